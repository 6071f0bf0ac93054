//! Model weights: one [`Linear`] that is dense or quantized, the weight set the recipes read
//! ([`Weights`], generic over how a device holds its parts), and the loaders an architecture
//! reads GGUF tensors with, erring with the name of any missing or misshapen tensor.

use std::borrow::Cow;

use tpslab_kernels::{Layout, QMatrix, ThreadPool, WType, packed};

pub use super::weight_bytes::WeightBytes;
use crate::formats::gguf::{GgufError, GgufFile, TensorInfo};

#[derive(Debug, thiserror::Error)]
pub enum WeightError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("tensor '{name}' has shape {found:?}, expected {expected:?}")]
    Shape {
        name: String,
        found: Vec<u64>,
        expected: Vec<u64>,
    },
    #[error("the tensors of {0} cannot be stacked into one matrix (their widths differ)")]
    Stack(String),
}

/// What a recorder shows of a weight: a matrix's type and shape, or a vector's length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamShape {
    Matrix {
        ty: tpslab_kernels::WType,
        n: usize,
        k: usize,
        bias: bool,
    },
    Vector(usize),
}

/// A weight as a device holds it, described for the recorder.
pub trait Param {
    fn shape(&self) -> ParamShape;
}

impl Param for ParamShape {
    fn shape(&self) -> ParamShape {
        *self
    }
}

impl Param for Vec<f32> {
    fn shape(&self) -> ParamShape {
        ParamShape::Vector(self.len())
    }
}

/// `y = x W^T (+ b)`: a weight matrix of `n` output rows by `k` inputs, kept in its file format.
#[derive(Debug, Clone)]
pub struct Linear {
    /// The type of `data` (of the first part when `parts` is not empty).
    pub ty: WType,
    pub n: usize,
    pub k: usize,
    /// Blocks of `ty` as `layout` lays them out; empty when the matrix is held as `parts`.
    pub data: WeightBytes,
    /// Rows of ggml blocks as the file holds them, or packed for this CPU's kernels
    /// ([`tpslab_kernels::packed`]): a model's arena packs the matrices the kernels run faster
    /// packed ([`Weights::into_arena`]); every other reader takes [`Linear::ggml_bytes`].
    pub layout: Layout,
    pub bias: Option<Vec<f32>>,
    /// Matrices of different types stacked by [`Linear::concat`] (a Q4_K_M file's Q4_K attn_q
    /// over its Q6_K attn_v): each keeps its type and is multiplied on its own, as llama.cpp
    /// multiplies them. Empty for a matrix of one type.
    pub parts: Vec<Linear>,
}

impl Linear {
    /// A matrix of one type.
    pub fn new(ty: WType, n: usize, k: usize, data: Vec<u8>) -> Self {
        Self {
            ty,
            n,
            k,
            data: data.into(),
            layout: Layout::Ggml,
            bias: None,
            parts: Vec::new(),
        }
    }

    /// The matrix as the kernels take it. Only for a matrix of one type (`parts` empty).
    pub fn view(&self) -> QMatrix<'_> {
        QMatrix {
            ty: self.ty,
            n: self.n,
            k: self.k,
            data: &self.data,
            layout: self.layout,
        }
    }

    /// The bytes as ggml rows (a GPU's upload, a conversion to another type): `data` itself,
    /// or unpacked from the packed layout.
    pub fn ggml_bytes(&self) -> Cow<'_, [u8]> {
        match self.layout {
            Layout::Ggml => Cow::Borrowed(&self.data),
            Layout::Rows8 => Cow::Owned(packed::unpack(self.ty, self.n, self.k, &self.data)),
        }
    }

    /// `y[m][n] = x[m][k] . W[n][k] + b[n]`.
    pub fn forward(&self, pool: &ThreadPool, x: &[f32], m: usize, y: &mut [f32]) {
        if self.parts.is_empty() {
            tpslab_kernels::matmul(pool, &self.view(), x, m, y);
        } else {
            // Each part into its own rows, then into its columns of y.
            let mut at = 0;
            let mut part_y = Vec::new();
            for p in &self.parts {
                part_y.resize(m * p.n, 0.0);
                tpslab_kernels::matmul(pool, &p.view(), x, m, &mut part_y);
                for (row, src) in y.chunks_mut(self.n).zip(part_y.chunks(p.n)) {
                    row[at..at + p.n].copy_from_slice(src);
                }
                at += p.n;
            }
        }
        if let Some(b) = &self.bias {
            for row in y.chunks_mut(self.n) {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
    }

    /// Row `i` of the matrix as floats (embedding lookup).
    pub fn row(&self, i: usize, out: &mut [f32]) {
        let rb = self.ty.row_bytes(self.k);
        match self.layout {
            Layout::Ggml => {
                tpslab_kernels::dequantize_row(self.ty, &self.data[i * rb..(i + 1) * rb], out);
            }
            Layout::Rows8 => {
                // Every token of a step looks its row up: one buffer a thread, reused.
                thread_local!(static ROW: std::cell::RefCell<Vec<u8>> = const {
                    std::cell::RefCell::new(Vec::new())
                });
                ROW.with_borrow_mut(|row| {
                    row.resize(rb, 0);
                    packed::row_bytes_into(self.ty, self.layout, self.k, &self.data, i, row);
                    tpslab_kernels::dequantize_row(self.ty, row, out);
                });
            }
        }
    }

    /// The types of its parts (one for a matrix of one type).
    pub fn types(&self) -> Vec<WType> {
        if self.parts.is_empty() {
            vec![self.ty]
        } else {
            self.parts.iter().map(|p| p.ty).collect()
        }
    }

    /// Stacks matrices that share `k` into one (rows of all, in order), so a single matmul
    /// computes them together: Q, K and V, or gate and up. Matrices of one type become one
    /// block of rows; of different types, [`Linear::parts`]. `None` if `k` differs or a part
    /// is itself stacked from several types.
    pub fn concat(parts: &[&Linear]) -> Option<Linear> {
        let first = parts.first()?;
        if parts
            .iter()
            .any(|p| p.k != first.k || !p.parts.is_empty() || p.layout != Layout::Ggml)
        {
            return None;
        }
        let has_bias = parts.iter().any(|p| p.bias.is_some());
        if parts.iter().any(|p| p.ty != first.ty) {
            let mut bias = Vec::new();
            for p in parts.iter().filter(|_| has_bias) {
                match &p.bias {
                    Some(b) => bias.extend_from_slice(b),
                    None => bias.extend(std::iter::repeat_n(0.0, p.n)),
                }
            }
            let own = |p: &Linear| Linear {
                bias: None,
                ..p.clone()
            };
            return Some(Linear {
                ty: first.ty,
                n: parts.iter().map(|p| p.n).sum(),
                k: first.k,
                data: WeightBytes::default(),
                layout: Layout::Ggml,
                bias: has_bias.then_some(bias),
                parts: parts.iter().map(|p| own(p)).collect(),
            });
        }
        let mut data = vec![0; parts.iter().map(|p| p.data.len()).sum()];
        let mut bias = Vec::new();
        let mut at = 0;
        for p in parts {
            data[at..at + p.data.len()].copy_from_slice(&p.data);
            at += p.data.len();
            if has_bias {
                match &p.bias {
                    Some(b) => bias.extend_from_slice(b),
                    None => bias.extend(std::iter::repeat_n(0.0, p.n)),
                }
            }
        }
        Some(Linear {
            ty: first.ty,
            n: parts.iter().map(|p| p.n).sum(),
            k: first.k,
            data: data.into(),
            layout: Layout::Ggml,
            bias: has_bias.then_some(bias),
            parts: Vec::new(),
        })
    }

    pub fn bytes(&self) -> usize {
        let parts: usize = self.parts.iter().map(|p| p.data.len()).sum();
        self.data.len() + parts + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }
}

/// Weights of one transformer block. Q, K, V are stacked into `wqkv`; gate and up into
/// `w_gate_up` (gate rows first), so each becomes one matmul. Generic over how a device holds a
/// matrix (`L`) and a vector (`V`): the host copy is `LayerWeights<Linear, Vec<f32>>`, a GPU's
/// is the same structure of device buffers ([`Weights::try_map`]).
#[derive(Debug, Clone)]
pub struct LayerWeights<L = Linear, V = Vec<f32>> {
    pub attn_norm: V,
    pub wqkv: L,
    /// Per-head norms of Q and K (Qwen3, Gemma 3).
    pub q_norm: Option<V>,
    pub k_norm: Option<V>,
    /// One learned logit per query head that joins each softmax's denominator (gpt-oss's
    /// `attn_sinks`).
    pub attn_sinks: Option<V>,
    pub wo: L,
    /// The norm of the attention block's output before the residual add (Gemma).
    pub post_attn_norm: Option<V>,
    pub ffn_norm: V,
    pub ffn: Ffn<L>,
    /// The norm of the FFN's output before the residual add (Gemma).
    pub post_ffn_norm: Option<V>,
}

/// A block's feed-forward part: one gated FFN, or a mixture of experts.
#[derive(Debug, Clone)]
pub enum Ffn<L = Linear> {
    /// Gate and up stacked (gate rows first), then down.
    Dense {
        gate_up: L,
        down: L,
    },
    Moe(MoeWeights<L>),
}

/// One expert: its gate and up stacked (gate rows first), and its down projection.
#[derive(Debug, Clone)]
pub struct Expert<L = Linear> {
    pub gate_up: L,
    pub down: L,
}

/// A mixture of experts: the router (`ffn_gate_inp`, one row per expert) and the experts,
/// each cut out of the file's 3-D `ffn_*_exps` tensors.
#[derive(Debug, Clone)]
pub struct MoeWeights<L = Linear> {
    pub router: L,
    pub experts: Vec<Expert<L>>,
    /// How the router's logits choose and weigh experts (the family's, from the configuration).
    pub rule: tpslab_kernels::moe::Router,
}

impl<L> Ffn<L> {
    /// Every matrix of the block.
    pub fn matrices(&self) -> Vec<&L> {
        match self {
            Ffn::Dense { gate_up, down } => vec![gate_up, down],
            Ffn::Moe(m) => std::iter::once(&m.router)
                .chain(m.experts.iter().flat_map(|e| [&e.gate_up, &e.down]))
                .collect(),
        }
    }

    /// Every matrix of the block, to change.
    pub fn matrices_mut(&mut self) -> Vec<&mut L> {
        match self {
            Ffn::Dense { gate_up, down } => vec![gate_up, down],
            Ffn::Moe(m) => std::iter::once(&mut m.router)
                .chain(
                    m.experts
                        .iter_mut()
                        .flat_map(|e| [&mut e.gate_up, &mut e.down]),
                )
                .collect(),
        }
    }

    /// The same block held another way (see [`Weights::try_map`]).
    pub fn try_map<L2, E>(&self, fm: &mut impl FnMut(&L) -> Result<L2, E>) -> Result<Ffn<L2>, E> {
        Ok(match self {
            Ffn::Dense { gate_up, down } => Ffn::Dense {
                gate_up: fm(gate_up)?,
                down: fm(down)?,
            },
            Ffn::Moe(m) => {
                let mut experts = Vec::with_capacity(m.experts.len());
                for e in &m.experts {
                    experts.push(Expert {
                        gate_up: fm(&e.gate_up)?,
                        down: fm(&e.down)?,
                    });
                }
                Ffn::Moe(MoeWeights {
                    router: fm(&m.router)?,
                    experts,
                    rule: m.rule,
                })
            }
        })
    }
}

/// A model's weights, as the recipes of [`crate::model::arch`] read them.
#[derive(Debug, Clone)]
pub struct Weights<L = Linear, V = Vec<f32>> {
    pub embed: L,
    pub layers: Vec<LayerWeights<L, V>>,
    pub out_norm: V,
    /// `None` when the output projection is tied to the embedding.
    pub lm_head: Option<L>,
    /// RoPE frequency factors, one per rotated pair (Llama 3's `rope_freqs`, Phi-3's LongRoPE
    /// factors for the context in use).
    pub rope_factors: Option<V>,
}

impl<L, V> Weights<L, V> {
    pub fn lm_head(&self) -> &L {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Every matrix, each once (a tied output projection is the embedding).
    pub fn matrices(&self) -> impl Iterator<Item = &L> {
        let layers = self
            .layers
            .iter()
            .flat_map(|l| [&l.wqkv, &l.wo].into_iter().chain(l.ffn.matrices()));
        std::iter::once(&self.embed)
            .chain(layers)
            .chain(&self.lm_head)
    }

    /// The expert matrices of the first `layers` blocks: what a GPU keeps in host memory for
    /// the CPU to run under `--n-cpu-moe` (llama.cpp's option of that name).
    pub fn leading_experts(&self, layers: usize) -> impl Iterator<Item = &L> {
        self.layers.iter().take(layers).flat_map(|l| {
            let experts: &[Expert<L>] = match &l.ffn {
                Ffn::Moe(m) => &m.experts,
                Ffn::Dense { .. } => &[],
            };
            experts.iter().flat_map(|e| [&e.gate_up, &e.down])
        })
    }

    /// Every matrix, each once, to change.
    pub fn matrices_mut(&mut self) -> impl Iterator<Item = &mut L> {
        let layers = self.layers.iter_mut().flat_map(|l| {
            [&mut l.wqkv, &mut l.wo]
                .into_iter()
                .chain(l.ffn.matrices_mut())
        });
        std::iter::once(&mut self.embed)
            .chain(layers)
            .chain(&mut self.lm_head)
    }

    /// The same weights held another way (uploaded to a device, or described by shape), each
    /// matrix through `fm` and each vector through `fv`; the first error stops it.
    pub fn try_map<L2, V2, E>(
        &self,
        mut fm: impl FnMut(&L) -> Result<L2, E>,
        mut fv: impl FnMut(&V) -> Result<V2, E>,
    ) -> Result<Weights<L2, V2>, E> {
        let mut layers = Vec::with_capacity(self.layers.len());
        for l in &self.layers {
            layers.push(LayerWeights {
                attn_norm: fv(&l.attn_norm)?,
                wqkv: fm(&l.wqkv)?,
                q_norm: l.q_norm.as_ref().map(&mut fv).transpose()?,
                k_norm: l.k_norm.as_ref().map(&mut fv).transpose()?,
                attn_sinks: l.attn_sinks.as_ref().map(&mut fv).transpose()?,
                wo: fm(&l.wo)?,
                post_attn_norm: l.post_attn_norm.as_ref().map(&mut fv).transpose()?,
                ffn_norm: fv(&l.ffn_norm)?,
                ffn: l.ffn.try_map(&mut fm)?,
                post_ffn_norm: l.post_ffn_norm.as_ref().map(&mut fv).transpose()?,
            });
        }
        Ok(Weights {
            embed: fm(&self.embed)?,
            layers,
            out_norm: fv(&self.out_norm)?,
            lm_head: self.lm_head.as_ref().map(&mut fm).transpose()?,
            rope_factors: self.rope_factors.as_ref().map(&mut fv).transpose()?,
        })
    }

    /// The weights as shapes only (what the recording device runs on).
    pub fn shapes(&self) -> Weights<ParamShape, ParamShape>
    where
        L: Param,
        V: Param,
    {
        let shape = |p: &dyn Param| Ok::<_, std::convert::Infallible>(p.shape());
        match self.try_map(|m| shape(m), |v| shape(v)) {
            Ok(w) => w,
            Err(never) => match never {},
        }
    }
}

impl Weights {
    pub fn bytes(&self) -> usize {
        self.matrices().map(Linear::bytes).sum::<usize>()
            + self.vectors().map(Vec::len).sum::<usize>() * 4
    }

    /// Every vector (norm weights, RoPE factors).
    pub fn vectors(&self) -> impl Iterator<Item = &Vec<f32>> {
        let layers = self.layers.iter().flat_map(|l| {
            [
                Some(&l.attn_norm),
                l.q_norm.as_ref(),
                l.k_norm.as_ref(),
                l.attn_sinks.as_ref(),
                l.post_attn_norm.as_ref(),
                Some(&l.ffn_norm),
                l.post_ffn_norm.as_ref(),
            ]
            .into_iter()
            .flatten()
        });
        std::iter::once(&self.out_norm)
            .chain(layers)
            .chain(&self.rope_factors)
    }
}

impl Param for Linear {
    fn shape(&self) -> ParamShape {
        ParamShape::Matrix {
            ty: self.ty,
            n: self.n,
            k: self.k,
            bias: self.bias.is_some(),
        }
    }
}

std::thread_local! {
    /// Set while a [`Probing`] lives on this thread.
    static PROBING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn probing() -> bool {
    PROBING.with(std::cell::Cell::get)
}

/// While alive, the loaders on this thread check every name, shape and type but read no tensor
/// data (matrices come out empty, vectors zero): [`crate::model::arch::probe`].
pub(crate) struct Probing;

impl Probing {
    pub(crate) fn start() -> Self {
        PROBING.with(|p| p.set(true));
        Self
    }
}

impl Drop for Probing {
    fn drop(&mut self) {
        PROBING.with(|p| p.set(false));
    }
}

pub(crate) fn info<'a>(
    f: &'a GgufFile,
    name: &str,
    dims: &[u64],
) -> Result<&'a TensorInfo, WeightError> {
    let t = f
        .tensor(name)
        .ok_or_else(|| GgufError::MissingTensor(name.into()))?;
    // A trailing dimension of 1 is the same shape.
    let found: Vec<u64> = t
        .dims
        .iter()
        .copied()
        .rev()
        .skip_while(|&d| d == 1)
        .collect();
    let want: Vec<u64> = dims.iter().copied().rev().skip_while(|&d| d == 1).collect();
    if found != want {
        return Err(WeightError::Shape {
            name: name.into(),
            found: t.dims.clone(),
            expected: dims.to_vec(),
        });
    }
    Ok(t)
}

/// A matrix with `k` inputs (ggml dim 0) and `n` outputs (ggml dim 1).
pub(crate) fn linear(f: &GgufFile, name: &str, k: u64, n: u64) -> Result<Linear, WeightError> {
    let t = info(f, name, &[k, n])?;
    let ty = t.ty;
    let data = if probing() {
        Vec::new()
    } else {
        f.read_tensor(t)?
    };
    Ok(Linear::new(ty, n as usize, k as usize, data))
}

/// The experts of a 3-D `{name}.weight` tensor (`name` is `blk.{i}.ffn_*_exps`) of `n_expert`
/// matrices of `k` inputs and `n` outputs (ggml dims `[k, n, n_expert]`), each cut out as its
/// own matrix, with its row of `{name}.bias` (ggml dims `[n, n_expert]`) where the file has one
/// (gpt-oss).
pub(crate) fn experts(
    f: &GgufFile,
    name: &str,
    k: u64,
    n: u64,
    n_expert: u64,
) -> Result<Vec<Linear>, WeightError> {
    let wname = format!("{name}.weight");
    let t = info(f, &wname, &[k, n, n_expert])?;
    let ty = t.ty;
    let each = n as usize * ty.row_bytes(k as usize);
    let bname = format!("{name}.bias");
    if probing() {
        if f.tensor(&bname).is_some() {
            info(f, &bname, &[n, n_expert])?;
        }
        let empty = || Linear::new(ty, n as usize, k as usize, Vec::new());
        return Ok((0..n_expert).map(|_| empty()).collect());
    }
    let data = f.read_tensor(t)?;
    if data.len() != each * n_expert as usize {
        return Err(WeightError::Shape {
            name: wname,
            found: t.dims.clone(),
            expected: vec![k, n, n_expert],
        });
    }
    let biases = match f.tensor(&bname) {
        Some(_) => Some(floats(f, &bname, &[n, n_expert])?),
        None => None,
    };
    Ok(data
        .chunks_exact(each)
        .enumerate()
        .map(|(e, c)| {
            let mut l = Linear::new(ty, n as usize, k as usize, c.to_vec());
            l.bias = biases
                .as_ref()
                .map(|b| b[e * n as usize..(e + 1) * n as usize].to_vec());
            l
        })
        .collect())
}

/// A tensor of shape `dims` as floats (norm weights, biases).
fn floats(f: &GgufFile, name: &str, dims: &[u64]) -> Result<Vec<f32>, WeightError> {
    let t = info(f, name, dims)?;
    let ty = t.ty;
    let len: u64 = dims.iter().product();
    if probing() {
        return Ok(vec![0f32; len as usize]);
    }
    let data = f.read_tensor(t)?;
    let mut out = vec![0f32; len as usize];
    if data.len() != ty.row_bytes(out.len()) || !out.len().is_multiple_of(ty.block_size()) {
        return Err(WeightError::Shape {
            name: name.into(),
            found: t.dims.clone(),
            expected: dims.to_vec(),
        });
    }
    tpslab_kernels::dequantize_row(ty, &data, &mut out);
    Ok(out)
}

pub(crate) fn vector(f: &GgufFile, name: &str, n: u64) -> Result<Vec<f32>, WeightError> {
    floats(f, name, &[n])
}

pub(crate) fn optional_vector(
    f: &GgufFile,
    name: &str,
    n: u64,
) -> Result<Option<Vec<f32>>, WeightError> {
    match f.tensor(name) {
        Some(_) => vector(f, name, n).map(Some),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matrix(ty: WType, n: usize, k: usize, seed: u32) -> Linear {
        let x: Vec<f32> = (0..n * k)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed) as f32 / u32::MAX as f32 - 0.5)
            .collect();
        Linear::new(ty, n, k, tpslab_kernels::quantize::quantize(ty, &x))
    }

    /// Q (Q5_0), K (Q5_0) and V (Q8_0) stacked as a Q4_K_M file has them: each part keeps its
    /// type, and the stacked product is, column for column and bit for bit, the parts' own
    /// products with the bias added.
    #[test]
    fn parts_of_different_types_stack_and_multiply_as_apart() {
        let (k, m) = (256, 3);
        let (q, kk, mut v) = (
            matrix(WType::Q5_0, 8, k, 1),
            matrix(WType::Q5_0, 4, k, 2),
            matrix(WType::Q8_0, 4, k, 3),
        );
        v.bias = Some(vec![0.5; 4]);
        let s = Linear::concat(&[&q, &kk, &v]).expect("same k");
        assert_eq!((s.n, s.parts.len()), (16, 3));
        assert_eq!(s.types(), [WType::Q5_0, WType::Q5_0, WType::Q8_0]);
        assert_eq!(s.bytes(), q.bytes() + kk.bytes() + v.data.len() + 16 * 4);
        let pool = ThreadPool::new(2);
        let x: Vec<f32> = (0..m * k).map(|i| (i % 17) as f32 * 0.1 - 0.8).collect();
        let mut y = vec![0f32; m * 16];
        s.forward(&pool, &x, m, &mut y);
        let mut at = 0;
        for p in [&q, &kk, &v] {
            let mut own = vec![0f32; m * p.n];
            p.forward(&pool, &x, m, &mut own);
            for i in 0..m {
                for j in 0..p.n {
                    let got = y[i * 16 + at + j];
                    assert_eq!(
                        got.to_bits(),
                        own[i * p.n + j].to_bits(),
                        "({i}, {})",
                        at + j
                    );
                }
            }
            at += p.n;
        }
        // One type: one block of rows, as before; a different k: refused.
        let one = Linear::concat(&[&q, &kk]).expect("same type");
        assert!(one.parts.is_empty() && one.data.len() == q.data.len() + kk.data.len());
        assert!(Linear::concat(&[&q, &matrix(WType::Q5_0, 2, 512, 4)]).is_none());
    }
}

//! Model weights: one [`Linear`] that is dense or quantized, and the Llama-family weight set
//! looked up by GGUF tensor name, with an error naming any missing or misshapen tensor.

use tpslab_kernels::{QMatrix, ThreadPool, WType};

use crate::config::ModelConfig;
use crate::gguf::{GgmlType, GgufError, GgufFile, TensorInfo};

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
    #[error("tensor '{name}' has type {ty}, which this engine cannot compute with yet")]
    Type { name: String, ty: GgmlType },
}

/// Maps a file's tensor type to a kernel weight type, if the kernels support it.
pub fn kernel_type(ty: GgmlType) -> Option<WType> {
    Some(match ty {
        GgmlType::F32 => WType::F32,
        GgmlType::F16 => WType::F16,
        GgmlType::BF16 => WType::BF16,
        GgmlType::Q4_0 => WType::Q4_0,
        GgmlType::Q4_1 => WType::Q4_1,
        GgmlType::Q8_0 => WType::Q8_0,
        GgmlType::Q4K => WType::Q4K,
        GgmlType::Q5K => WType::Q5K,
        GgmlType::Q6K => WType::Q6K,
        _ => return None,
    })
}

/// `y = x W^T (+ b)`: a weight matrix of `n` output rows by `k` inputs, kept in its file format.
#[derive(Debug, Clone)]
pub struct Linear {
    pub ty: WType,
    pub n: usize,
    pub k: usize,
    pub data: Vec<u8>,
    pub bias: Option<Vec<f32>>,
}

impl Linear {
    pub fn view(&self) -> QMatrix<'_> {
        QMatrix {
            ty: self.ty,
            n: self.n,
            k: self.k,
            data: &self.data,
        }
    }

    /// `y[m][n] = x[m][k] . W[n][k] + b[n]`.
    pub fn forward(&self, pool: &ThreadPool, x: &[f32], m: usize, y: &mut [f32]) {
        tpslab_kernels::matmul(pool, &self.view(), x, m, y);
        if let Some(b) = &self.bias {
            for row in y.chunks_mut(self.n) {
                row.iter_mut().zip(b).for_each(|(y, b)| *y += b);
            }
        }
    }

    /// Row `i` of the matrix as floats (embedding lookup).
    pub fn row(&self, i: usize, out: &mut [f32]) {
        let rb = self.ty.row_bytes(self.k);
        tpslab_kernels::dequantize_row(self.ty, &self.data[i * rb..(i + 1) * rb], out);
    }

    /// Stacks matrices that share `k` and type into one (rows of all, in order), so a single
    /// matmul computes them together: Q, K and V, or gate and up. `None` if they don't match.
    pub fn concat(parts: &[&Linear]) -> Option<Linear> {
        let first = parts.first()?;
        if parts.iter().any(|p| p.ty != first.ty || p.k != first.k) {
            return None;
        }
        let has_bias = parts.iter().any(|p| p.bias.is_some());
        let mut data = Vec::with_capacity(parts.iter().map(|p| p.data.len()).sum());
        let mut bias = Vec::new();
        for p in parts {
            data.extend_from_slice(&p.data);
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
            data,
            bias: has_bias.then_some(bias),
        })
    }

    pub fn bytes(&self) -> usize {
        self.data.len() + self.bias.as_ref().map_or(0, |b| b.len() * 4)
    }
}

/// Weights of one transformer block. Q, K, V are stacked into `wqkv`; gate and up into
/// `w_gate_up` (gate rows first), so each becomes one matmul.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub attn_norm: Vec<f32>,
    pub wqkv: Linear,
    pub wo: Linear,
    pub ffn_norm: Vec<f32>,
    pub w_gate_up: Linear,
    pub w_down: Linear,
}

#[derive(Debug, Clone)]
pub struct Weights {
    pub embed: Linear,
    pub layers: Vec<LayerWeights>,
    pub out_norm: Vec<f32>,
    /// `None` when the output projection is tied to the embedding.
    pub lm_head: Option<Linear>,
}

impl Weights {
    pub fn lm_head(&self) -> &Linear {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    pub fn bytes(&self) -> usize {
        let layer = |l: &LayerWeights| {
            (l.attn_norm.len() + l.ffn_norm.len()) * 4
                + l.wqkv.bytes()
                + l.wo.bytes()
                + l.w_gate_up.bytes()
                + l.w_down.bytes()
        };
        self.embed.bytes()
            + self.layers.iter().map(layer).sum::<usize>()
            + self.out_norm.len() * 4
            + self.lm_head.as_ref().map_or(0, Linear::bytes)
    }

    pub fn load(f: &GgufFile, cfg: &ModelConfig) -> Result<Self, WeightError> {
        let (h, kv, ffn) = (cfg.hidden as u64, cfg.kv_dim() as u64, cfg.ffn as u64);
        let embed = linear(f, "token_embd.weight", h, cfg.vocab as u64)?;
        let lm_head = match f.tensor("output.weight") {
            Some(_) => Some(linear(f, "output.weight", h, cfg.vocab as u64)?),
            None => None,
        };
        let out_norm = vector(f, "output_norm.weight", h)?;
        let mut layers = Vec::with_capacity(cfg.n_layers);
        for i in 0..cfg.n_layers {
            let p = |s: &str| format!("blk.{i}.{s}");
            let mut q = linear(f, &p("attn_q.weight"), h, h)?;
            let mut k = linear(f, &p("attn_k.weight"), h, kv)?;
            let mut v = linear(f, &p("attn_v.weight"), h, kv)?;
            // Qwen2 has biases on Q, K and V.
            q.bias = optional_vector(f, &p("attn_q.bias"), h)?;
            k.bias = optional_vector(f, &p("attn_k.bias"), kv)?;
            v.bias = optional_vector(f, &p("attn_v.bias"), kv)?;
            let gate = linear(f, &p("ffn_gate.weight"), h, ffn)?;
            let up = linear(f, &p("ffn_up.weight"), h, ffn)?;
            let stack = |parts: &[&Linear], what: &str| {
                Linear::concat(parts).ok_or_else(|| WeightError::Type {
                    name: format!("blk.{i}.{what} (parts differ in type)"),
                    ty: GgmlType::F32,
                })
            };
            layers.push(LayerWeights {
                attn_norm: vector(f, &p("attn_norm.weight"), h)?,
                wqkv: stack(&[&q, &k, &v], "attn_qkv")?,
                wo: linear(f, &p("attn_output.weight"), h, h)?,
                ffn_norm: vector(f, &p("ffn_norm.weight"), h)?,
                w_gate_up: stack(&[&gate, &up], "ffn_gate_up")?,
                w_down: linear(f, &p("ffn_down.weight"), ffn, h)?,
            });
        }
        Ok(Self {
            embed,
            layers,
            out_norm,
            lm_head,
        })
    }
}

fn info<'a>(f: &'a GgufFile, name: &str, dims: &[u64]) -> Result<&'a TensorInfo, WeightError> {
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
fn linear(f: &GgufFile, name: &str, k: u64, n: u64) -> Result<Linear, WeightError> {
    let t = info(f, name, &[k, n])?;
    let ty = kernel_type(t.ty).ok_or_else(|| WeightError::Type {
        name: name.into(),
        ty: t.ty,
    })?;
    let data = f.read_tensor(t)?;
    Ok(Linear {
        ty,
        n: n as usize,
        k: k as usize,
        data,
        bias: None,
    })
}

fn vector(f: &GgufFile, name: &str, n: u64) -> Result<Vec<f32>, WeightError> {
    let t = info(f, name, &[n])?;
    let ty = kernel_type(t.ty).ok_or_else(|| WeightError::Type {
        name: name.into(),
        ty: t.ty,
    })?;
    let data = f.read_tensor(t)?;
    let mut out = vec![0f32; n as usize];
    tpslab_kernels::dequantize_row(ty, &data, &mut out);
    Ok(out)
}

fn optional_vector(f: &GgufFile, name: &str, n: u64) -> Result<Option<Vec<f32>>, WeightError> {
    match f.tensor(name) {
        Some(_) => vector(f, name, n).map(Some),
        None => Ok(None),
    }
}

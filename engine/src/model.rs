//! The Llama-family forward pass: one implementation for every supported architecture, taking a
//! whole mixed batch (prefill chunks and decodes together) and the paged KV cache.

use std::path::Path;

use tpslab_kernels::ThreadPool;

use crate::attention::{AttnShape, paged_attention};
use crate::config::{ConfigError, ModelConfig};
use crate::gguf::{GgufError, GgufFile};
use crate::kv::{Batch, KvCache};
use crate::ops;
use crate::weights::{WeightError, Weights};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightError),
    #[error("bad batch: {0}")]
    Batch(String),
}

pub struct Model {
    pub cfg: ModelConfig,
    pub weights: Weights,
}

/// Reusable activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub struct Workspace {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    tmp: Vec<f32>,
    gu: Vec<f32>,
    act: Vec<f32>,
    cos: Vec<f32>,
    sin: Vec<f32>,
    last: Vec<f32>,
    last_norm: Vec<f32>,
    pub logits: Vec<f32>,
}

impl Workspace {
    /// Bytes held by the activation buffers.
    pub fn bytes(&self) -> usize {
        [
            &self.x,
            &self.h,
            &self.qkv,
            &self.attn,
            &self.tmp,
            &self.gu,
            &self.act,
            &self.cos,
            &self.sin,
            &self.last,
            &self.last_norm,
            &self.logits,
        ]
        .iter()
        .map(|v| v.capacity() * 4)
        .sum()
    }
}

/// Most tokens whose FFN intermediates are held at once (see [`Model::forward`]).
const FFN_ROWS: usize = 128;

fn sized(v: &mut Vec<f32>, n: usize) -> &mut [f32] {
    if v.len() < n {
        v.resize(n, 0.0);
    }
    &mut v[..n]
}

impl Model {
    pub fn load(path: &Path) -> Result<(Self, GgufFile), ModelError> {
        let file = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&file)?;
        let weights = Weights::load(&file, &cfg)?;
        Ok((Self { cfg, weights }, file))
    }

    /// The model of an already opened file whose configuration was resolved.
    pub fn from_file(file: &GgufFile, cfg: ModelConfig) -> Result<Self, ModelError> {
        let weights = Weights::load(file, &cfg)?;
        Ok(Self { cfg, weights })
    }

    /// Runs every token of `batch` through the model, writing their K/V into `kv`, and returns
    /// the logits of `batch.logit_rows` (`logit_rows.len() * vocab` floats, in that order).
    pub fn forward<'w>(
        &self,
        pool: &ThreadPool,
        batch: &Batch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32], ModelError> {
        check_batch(&self.cfg, batch, kv.num_blocks, kv.block_size)?;
        let c = &self.cfg;
        let n = batch.len();
        let (hidden, kv_dim, hd) = (c.hidden, c.kv_dim(), c.head_dim);
        let qkv_w = hidden + 2 * kv_dim;
        let half = c.rope_dim / 2;

        let x = sized(&mut ws.x, n * hidden);
        for (i, &t) in batch.tokens.iter().enumerate() {
            self.weights
                .embed
                .row(t as usize, &mut x[i * hidden..(i + 1) * hidden]);
        }
        let cos = sized(&mut ws.cos, n * half);
        let sin = sized(&mut ws.sin, n * half);
        for (i, &p) in batch.positions.iter().enumerate() {
            let r = i * half..(i + 1) * half;
            ops::rope_cache(
                p,
                c.rope_dim,
                c.rope_theta,
                &mut cos[r.clone()],
                &mut sin[r],
            );
        }
        let shape = AttnShape {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: hd,
            block_size: kv.block_size,
        };

        for (li, l) in self.weights.layers.iter().enumerate() {
            let h = sized(&mut ws.h, n * hidden);
            ops::rms_norm(x, &l.attn_norm, c.rms_eps, h);
            let qkv = sized(&mut ws.qkv, n * qkv_w);
            l.wqkv.forward(pool, h, n, qkv);
            for i in 0..n {
                let row = &mut qkv[i * qkv_w..(i + 1) * qkv_w];
                let (cs, sn) = (
                    &cos[i * half..(i + 1) * half],
                    &sin[i * half..(i + 1) * half],
                );
                let (q, rest) = row.split_at_mut(hidden);
                let (k, v) = rest.split_at_mut(kv_dim);
                ops::rope(q, hd, c.rope_style, cs, sn);
                ops::rope(k, hd, c.rope_style, cs, sn);
                kv.write(li, batch.slot(i, kv.block_size), k, v);
            }
            let attn = sized(&mut ws.attn, n * hidden);
            let (kc, vc) = kv.layer(li);
            paged_attention(pool, shape, batch, qkv, qkv_w, kc, vc, attn);
            let tmp = sized(&mut ws.tmp, n * hidden);
            l.wo.forward(pool, attn, n, tmp);
            ops::add_assign(x, tmp);

            let h = sized(&mut ws.h, n * hidden);
            ops::rms_norm(x, &l.ffn_norm, c.rms_eps, h);
            let tmp = sized(&mut ws.tmp, n * hidden);
            // The FFN's rows are 3x (gate+up: 6x) the hidden width: a long prefill takes them
            // FFN_ROWS tokens at a time instead of holding them all. Same results: every output
            // row depends on its own input row only.
            for r0 in (0..n).step_by(FFN_ROWS) {
                let m = (n - r0).min(FFN_ROWS);
                let rows = r0 * hidden..(r0 + m) * hidden;
                let gu = sized(&mut ws.gu, m * 2 * c.ffn);
                l.w_gate_up.forward(pool, &h[rows.clone()], m, gu);
                let act = sized(&mut ws.act, m * c.ffn);
                ops::swiglu(gu, c.ffn, act);
                l.w_down.forward(pool, act, m, &mut tmp[rows]);
            }
            ops::add_assign(x, tmp);
        }

        let r = batch.logit_rows.len();
        let last = sized(&mut ws.last, r * hidden);
        for (j, &row) in batch.logit_rows.iter().enumerate() {
            last[j * hidden..(j + 1) * hidden]
                .copy_from_slice(&x[row * hidden..(row + 1) * hidden]);
        }
        let last_norm = sized(&mut ws.last_norm, r * hidden);
        ops::rms_norm(last, &self.weights.out_norm, c.rms_eps, last_norm);
        let logits = sized(&mut ws.logits, r * c.vocab);
        self.weights.lm_head().forward(pool, last_norm, r, logits);
        Ok(&ws.logits[..r * c.vocab])
    }
}

/// Checks a batch against the model and a KV pool of `num_blocks` blocks of `block_size` before
/// any backend touches memory with it: token ids, positions, block tables, logits rows.
pub fn check_batch(
    cfg: &ModelConfig,
    batch: &Batch,
    num_blocks: usize,
    block_size: usize,
) -> Result<(), ModelError> {
    let bad = |m: String| Err(ModelError::Batch(m));
    let n = batch.len();
    if batch.positions.len() != n || batch.seq_of.len() != n {
        return bad("tokens, positions and sequence indices differ in length".into());
    }
    for i in 0..n {
        if batch.tokens[i] as usize >= cfg.vocab {
            return bad(format!(
                "token id {} is outside the vocabulary",
                batch.tokens[i]
            ));
        }
        if batch.positions[i] >= cfg.context_len {
            return bad(format!(
                "position {} is past the context length",
                batch.positions[i]
            ));
        }
        let table = batch.block_tables.get(batch.seq_of[i]);
        let need = batch.positions[i] / block_size;
        match table {
            Some(t) if need < t.len() && t[..=need].iter().all(|&b| (b as usize) < num_blocks) => {}
            _ => {
                return bad(format!(
                    "token {i}: block table does not cover its position"
                ));
            }
        }
    }
    if batch.logit_rows.iter().any(|&r| r >= n) {
        return bad("a logits row is outside the batch".into());
    }
    Ok(())
}

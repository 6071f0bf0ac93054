//! Attention on the CPU: paged (keys and values read through block tables, grouped-query heads),
//! plus a plain contiguous reference that tests hold it against.
//!
//! Work is split over the pool by (token, kv-head group); each query head's scores are computed
//! in one fixed order over its own sequence's positions, so a token's output never depends on
//! the rest of the batch.

use std::cell::RefCell;

use tpslab_kernels::{SendPtr, ThreadPool};

use crate::kv::Batch;

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
}

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `out[t]` = attention of the query rows `q[t]` over positions `0..=positions[t]` of token
/// `t`'s sequence, K/V read from `k_cache`/`v_cache` through the batch's block tables.
/// `q` rows are `q_stride` floats apart (they sit inside the fused QKV output).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    pool: &ThreadPool,
    shape: AttnShape,
    batch: &Batch,
    q: &[f32],
    q_stride: usize,
    k_cache: &[f32],
    v_cache: &[f32],
    out: &mut [f32],
) {
    let AttnShape { n_heads, n_kv_heads, head_dim: hd, block_size } = shape;
    let group = n_heads / n_kv_heads;
    let kv_dim = n_kv_heads * hd;
    let hidden = n_heads * hd;
    let n_items = batch.len() * n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let outp = SendPtr(out.as_mut_ptr());
    pool.run(&|tid, nth| {
        let per = n_items.div_ceil(nth);
        let (lo, hi) = (tid * per, ((tid + 1) * per).min(n_items));
        SCORES.with_borrow_mut(|scores| {
            for item in lo..hi {
                let (t, g) = (item / n_kv_heads, item % n_kv_heads);
                let n_ctx = batch.positions[t] + 1;
                let table = &batch.block_tables[batch.seq_of[t]];
                if scores.len() < n_ctx {
                    scores.resize(n_ctx, 0.0);
                }
                let slot = |p: usize| table[p / block_size] as usize * block_size + p % block_size;
                for h in g * group..(g + 1) * group {
                    let qh = &q[t * q_stride + h * hd..t * q_stride + (h + 1) * hd];
                    let sc = &mut scores[..n_ctx];
                    for (p, s) in sc.iter_mut().enumerate() {
                        let off = slot(p) * kv_dim + g * hd;
                        *s = dot(qh, &k_cache[off..off + hd]) * scale;
                    }
                    softmax_in_place(sc);
                    // SAFETY: each (t, h) output row is written by exactly one work item.
                    let oh = unsafe {
                        std::slice::from_raw_parts_mut(outp.get().add(t * hidden + h * hd), hd)
                    };
                    oh.fill(0.0);
                    for (p, &w) in sc.iter().enumerate() {
                        let off = slot(p) * kv_dim + g * hd;
                        for (o, &v) in oh.iter_mut().zip(&v_cache[off..off + hd]) {
                            *o += w * v;
                        }
                    }
                }
            }
        });
    });
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Eight independent partial sums: lets the compiler vectorize while the order stays fixed.
    let mut acc = [0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in ra.iter().zip(rb) {
        s += x * y;
    }
    s
}

/// Softmax with the maximum subtracted and the sum taken in f64 (as ggml does).
pub fn softmax_in_place(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += f64::from(*v);
    }
    let inv = (1.0 / sum) as f32;
    x.iter_mut().for_each(|v| *v *= inv);
}

/// Plain causal attention over one contiguous sequence (`q`, `k`, `v` are `[n, heads * hd]`),
/// written as directly as possible: the reference the paged kernel is tested against.
pub fn reference_attention(
    n_heads: usize,
    n_kv_heads: usize,
    hd: usize,
    q: &[f32],
    k: &[f32],
    v: &[f32],
) -> Vec<f32> {
    let n = q.len() / (n_heads * hd);
    let kv_dim = n_kv_heads * hd;
    let mut out = vec![0f32; n * n_heads * hd];
    for t in 0..n {
        for h in 0..n_heads {
            let g = h / (n_heads / n_kv_heads);
            let qh = &q[t * n_heads * hd + h * hd..][..hd];
            let mut s: Vec<f64> = (0..=t)
                .map(|p| {
                    let kp = &k[p * kv_dim + g * hd..][..hd];
                    qh.iter().zip(kp).map(|(a, b)| f64::from(*a) * f64::from(*b)).sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            s.iter_mut().for_each(|x| *x = (*x - max).exp());
            let sum: f64 = s.iter().sum();
            for d in 0..hd {
                let acc: f64 =
                    (0..=t).map(|p| s[p] / sum * f64::from(v[p * kv_dim + g * hd + d])).sum();
                out[t * n_heads * hd + h * hd + d] = acc as f32;
            }
        }
    }
    out
}

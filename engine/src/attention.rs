//! Attention on the CPU: paged (keys and values read through block tables, grouped-query heads),
//! plus a plain contiguous reference that tests hold it against.
//!
//! Work is split over the pool by (token, kv-head group); each query head's scores are computed
//! in one fixed order over its own sequence's positions, so a token's output never depends on
//! the rest of the batch.

use half::f16;
use half::slice::HalfFloatSliceExt;
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
    k_cache: &[f16],
    v_cache: &[f16],
    out: &mut [f32],
) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        block_size,
    } = shape;
    let group = n_heads / n_kv_heads;
    let kv_dim = n_kv_heads * hd;
    let hidden = n_heads * hd;
    let n_items = batch.len() * n_kv_heads;
    let scale = 1.0 / (hd as f32).sqrt();
    let outp = SendPtr(out.as_mut_ptr());
    pool.run(&|tid, nth| {
        let per = n_items.div_ceil(nth);
        let (lo, hi) = (tid * per, ((tid + 1) * per).min(n_items));
        for item in lo..hi {
            let (t, g) = (item / n_kv_heads, item % n_kv_heads);
            let table = &batch.block_tables[batch.seq_of[t]];
            let slots = (0..=batch.positions[t]).map(|p| {
                (table[p / block_size] as usize * block_size + p % block_size) * kv_dim + g * hd
            });
            for h in g * group..(g + 1) * group {
                let qh = &q[t * q_stride + h * hd..t * q_stride + (h + 1) * hd];
                // SAFETY: each (t, h) output row is written by exactly one work item.
                let oh = unsafe {
                    std::slice::from_raw_parts_mut(outp.get().add(t * hidden + h * hd), hd)
                };
                attend(qh, scale, slots.clone(), k_cache, v_cache, oh);
            }
        }
    });
}

/// Most head dimensions a model may have (stack buffers are this long).
pub const MAX_HEAD_DIM: usize = 256;

/// One query head over the K/V rows starting at `offsets`, in one pass with an online softmax,
/// the way llama.cpp's CPU flash attention does it: the query is rounded to f16 like the keys,
/// and each new maximum rescales what was accumulated so far. Unlike llama.cpp the output
/// accumulator stays f32 (llama.cpp rounds it to f16 after every position).
fn attend(
    q: &[f32],
    scale: f32,
    offsets: impl Iterator<Item = usize>,
    k_cache: &[f16],
    v_cache: &[f16],
    out: &mut [f32],
) {
    let hd = q.len();
    let mut q16 = [0f32; MAX_HEAD_DIM];
    let mut row = [0f32; MAX_HEAD_DIM];
    let mut acc = [0f32; MAX_HEAD_DIM];
    let (q16, row, acc) = (&mut q16[..hd], &mut row[..hd], &mut acc[..hd]);
    for (d, &x) in q16.iter_mut().zip(q) {
        *d = f16::from_f32(x).to_f32();
    }
    let (mut max, mut sum) = (f32::NEG_INFINITY, 0f32);
    for off in offsets {
        k_cache[off..off + hd].convert_to_f32_slice(row);
        let s = dot(q16, row) * scale;
        let (mut ms, mut vs) = (1f32, 1f32);
        if s > max {
            ms = (max - s).exp();
            max = s;
            acc.iter_mut().for_each(|a| *a *= ms);
        } else {
            vs = (s - max).exp();
        }
        v_cache[off..off + hd].convert_to_f32_slice(row);
        for (a, &v) in acc.iter_mut().zip(row.iter()) {
            *a += v * vs;
        }
        sum = sum * ms + vs;
    }
    let inv = if sum > 0.0 { 1.0 / sum } else { 0.0 };
    for (o, &a) in out.iter_mut().zip(acc.iter()) {
        *o = a * inv;
    }
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
                    qh.iter()
                        .zip(kp)
                        .map(|(a, b)| f64::from(*a) * f64::from(*b))
                        .sum::<f64>()
                        / (hd as f64).sqrt()
                })
                .collect();
            let max = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
            s.iter_mut().for_each(|x| *x = (*x - max).exp());
            let sum: f64 = s.iter().sum();
            for d in 0..hd {
                let acc: f64 = (0..=t)
                    .map(|p| s[p] / sum * f64::from(v[p * kv_dim + g * hd + d]))
                    .sum();
                out[t * n_heads * hd + h * hd + d] = acc as f32;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::config::{ModelConfig, RopeStyle};
    use crate::kv::KvCache;

    fn cfg(n_heads: usize, n_kv_heads: usize, hd: usize) -> ModelConfig {
        ModelConfig {
            arch: "llama".into(),
            n_layers: 1,
            hidden: n_heads * hd,
            ffn: 8,
            n_heads,
            n_kv_heads,
            head_dim: hd,
            vocab: 8,
            context_len: 4096,
            rope_theta: 10000.0,
            rope_dim: hd,
            rope_style: RopeStyle::Interleaved,
            rms_eps: 1e-5,
        }
    }

    /// Paged attention (f16 K/V, scattered blocks, sequences mixed in one batch) equals the plain
    /// f64 reference within 2e-3 of the largest |V| (the f16 rounding of K, V and Q).
    #[test]
    fn paged_equals_plain_attention_on_random_inputs() {
        let mut rng = StdRng::seed_from_u64(7);
        let pool = ThreadPool::new(2);
        for &(n_heads, n_kv, hd, bs) in &[
            (9, 3, 64, 16),
            (4, 4, 32, 1),
            (8, 2, 16, 5),
            (2, 1, 128, 32),
        ] {
            let c = cfg(n_heads, n_kv, hd);
            let lens = [1usize, 17, 70];
            let n_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 3;
            let mut kv = KvCache::new(&c, bs, n_blocks).expect("kv");
            // Hand out blocks in a shuffled order so tables are not contiguous.
            let mut ids: Vec<u32> = (0..n_blocks as u32).collect();
            for i in (1..ids.len()).rev() {
                ids.swap(i, rng.random_range(0..=i));
            }
            let mut batch = Batch::default();
            let mut seqs = Vec::new();
            let mut next = 0;
            for &len in &lens {
                let table: Vec<u32> = ids[next..next + len.div_ceil(bs)].to_vec();
                next += table.len();
                let mut r = |n: usize| {
                    (0..n)
                        .map(|_| rng.random_range(-2.0f32..2.0))
                        .collect::<Vec<_>>()
                };
                let (q, k, v) = (
                    r(len * n_heads * hd),
                    r(len * n_kv * hd),
                    r(len * n_kv * hd),
                );
                let toks = vec![0u32; len];
                batch.push_seq(table, 0, &toks, false);
                seqs.push((q, k, v));
            }
            let q_stride = n_heads * hd;
            let mut q_all = Vec::new();
            let mut tok = 0;
            for (q, k, v) in &seqs {
                for p in 0..q.len() / q_stride {
                    let kd = n_kv * hd;
                    kv.write(
                        0,
                        batch.slot(tok, bs),
                        &k[p * kd..(p + 1) * kd],
                        &v[p * kd..(p + 1) * kd],
                    );
                    tok += 1;
                }
                q_all.extend_from_slice(q);
            }
            let mut out = vec![0f32; batch.len() * q_stride];
            let shape = AttnShape {
                n_heads,
                n_kv_heads: n_kv,
                head_dim: hd,
                block_size: bs,
            };
            let (kc, vc) = kv.layer(0);
            paged_attention(&pool, shape, &batch, &q_all, q_stride, kc, vc, &mut out);
            let mut off = 0;
            for (q, k, v) in &seqs {
                let want = reference_attention(n_heads, n_kv, hd, q, k, v);
                let got = &out[off..off + want.len()];
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 2e-3 * 2.0,
                        "shape {n_heads}/{n_kv}/{hd}/{bs} elem {i}: {a} vs {b}"
                    );
                }
                off += want.len();
            }
        }
    }
}

//! Attention on the CPU: paged (keys and values read through block tables, grouped-query heads),
//! plus a plain contiguous reference that tests hold it against.
//!
//! The paged kernel itself lives in `tpslab_kernels::attn` (AVX2 with a portable fallback; each
//! query's arithmetic is fixed, so a token's output never depends on the rest of the batch or
//! the thread count); this module adapts the engine's [`Batch`] to it.

use tpslab_kernels::ThreadPool;
use tpslab_kernels::attn::{self, AttnInput, KvRows};

use crate::kv::Batch;
use crate::model::ops::AttnOpts;

pub use tpslab_kernels::attn::AttnShape;

/// Most head dimensions a model may have (the kernel's limit).
pub const MAX_HEAD_DIM: usize = attn::MAX_HEAD_DIM;

/// `out[t]` = attention of the query rows `q[t]` over positions `0..=positions[t]` of token
/// `t`'s sequence (those in the window of `opts`), K/V read from `k_cache`/`v_cache` (f16 or
/// quantized rows, see [`crate::kv::KvTypes`]) through the
/// batch's block tables, with one sink logit per query head where `sinks` is given. `q` rows
/// are `q_stride` floats apart (they sit inside the fused QKV output).
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    pool: &ThreadPool,
    shape: AttnShape,
    opts: AttnOpts,
    sinks: Option<&[f32]>,
    batch: &Batch,
    q: &[f32],
    q_stride: usize,
    k_cache: KvRows<'_>,
    v_cache: KvRows<'_>,
    out: &mut [f32],
) {
    let input = AttnInput {
        shape,
        positions: &batch.positions,
        seq_of: &batch.seq_of,
        tables: &batch.block_tables,
        q,
        q_stride,
        k_cache,
        v_cache,
        scale: opts.scale,
        softcap: opts.softcap,
        window: opts.window,
        sinks,
    };
    attn::paged_attention(pool, &input, out);
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
    use crate::kv::{KvCache, KvType, KvTypes};
    use crate::model::config::{Extras, ModelConfig, RopeScaling, RopeStyle};

    fn cfg(n_heads: usize, n_kv_heads: usize, hd: usize) -> ModelConfig {
        ModelConfig {
            arch: "llama".into(),
            family: crate::model::arch::Family::LLAMA,
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
            rope_scaling: RopeScaling::None,
            rms_eps: 1e-5,
            extras: Extras::plain(hd),
        }
    }

    /// Paged attention (f16 K/V, scattered blocks, sequences mixed in one batch) equals the plain
    /// f64 reference within 2e-3 of the largest |V| (the f16 rounding of K, V and Q). Over a
    /// quantized cache (K and V of different types), the reference takes the values the cache
    /// reads back (their rounding is checked in `engine/tests/serving/kv_types.rs`): what is tested is
    /// that attention finds each position's blocks.
    #[test]
    fn paged_equals_plain_attention_on_random_inputs() {
        let mut rng = StdRng::seed_from_u64(7);
        let pool = ThreadPool::new(2);
        let quant = [
            KvTypes {
                k: KvType::Q8_0,
                v: KvType::Q4_0,
            },
            KvTypes {
                k: KvType::Q4_0,
                v: KvType::BF16,
            },
        ];
        let shapes: [(usize, usize, usize, usize); 4] = [
            (9, 3, 64, 16),
            (4, 4, 32, 1),
            (8, 2, 16, 5),
            (2, 1, 128, 32),
        ];
        for types in std::iter::once(KvTypes::F16).chain(quant) {
            for &(n_heads, n_kv, hd, bs) in &shapes {
                if hd.is_multiple_of(32) || types.is_f16() {
                    check_paged(&mut rng, &pool, types, (n_heads, n_kv, hd, bs));
                }
            }
        }
    }

    fn check_paged(
        rng: &mut StdRng,
        pool: &ThreadPool,
        types: KvTypes,
        (n_heads, n_kv, hd, bs): (usize, usize, usize, usize),
    ) {
        let c = cfg(n_heads, n_kv, hd);
        let lens = [1usize, 17, 70];
        let n_blocks: usize = lens.iter().map(|l| l.div_ceil(bs)).sum::<usize>() + 3;
        let mut kv = KvCache::with_types(&c, bs, n_blocks, types).expect("kv");
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
        for (q, k, v) in &mut seqs {
            for p in 0..q.len() / q_stride {
                let kd = n_kv * hd;
                let (kp, vp) = (p * kd..(p + 1) * kd, p * kd..(p + 1) * kd);
                let slot = batch.slot(tok, bs);
                kv.write(0, slot, &k[kp.clone()], &v[vp.clone()]);
                if !types.is_f16() {
                    let (kc, vc) = kv.layer(0);
                    kc.to_f32(slot * kd, &mut k[kp]);
                    vc.to_f32(slot * kd, &mut v[vp]);
                }
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
        let opts = AttnOpts::plain(hd);
        paged_attention(
            pool, shape, opts, None, &batch, &q_all, q_stride, kc, vc, &mut out,
        );
        let mut off = 0;
        for (q, k, v) in &seqs {
            let want = reference_attention(n_heads, n_kv, hd, q, k, v);
            let got = &out[off..off + want.len()];
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 2e-3 * 2.0,
                    "{types} shape {n_heads}/{n_kv}/{hd}/{bs} elem {i}: {a} vs {b}"
                );
            }
            off += want.len();
        }
    }
}

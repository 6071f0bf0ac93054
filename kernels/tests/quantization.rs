//! Weight dequantization and activation quantization against candle's reference code, and the
//! AVX2 quantizers against the portable ones.

mod common;

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, BlockQ8_1, BlockQ8K, GgmlType,
};
use common::*;
use tpslab_kernels::quant::{ActType, QActs};
use tpslab_kernels::{Backend, QMatrix, ThreadPool, WType, dequantize_row, quantize_activations};

fn candle_dequant<T: GgmlType>(bytes: &[u8], k: usize) -> Vec<f32> {
    let mut out = vec![0f32; k];
    T::to_float(&blocks_from::<T>(bytes), &mut out);
    out
}

/// (a) `dequantize_row` equals candle's `to_float` bit for bit, for every type candle has
/// (IQ4_NL, IQ4_XS and MXFP4 are held against gguf-py in `reference.rs`).
#[test]
fn dequantize_matches_candle() {
    let mut r = rng(1);
    for ty in ALL_TYPES {
        for k in [256, 512, 1536] {
            let x = random_vec(&mut r, k, 0.1);
            let bytes = to_weight_bytes(ty, &x);
            let mut ours = vec![0f32; k];
            dequantize_row(ty, &bytes, &mut ours);
            let theirs = match ty {
                WType::F32 => x.clone(),
                WType::F16 => x.iter().map(|v| half::f16::from_f32(*v).to_f32()).collect(),
                WType::BF16 => x
                    .iter()
                    .map(|v| half::bf16::from_f32(*v).to_f32())
                    .collect(),
                WType::Q4_0 => candle_dequant::<BlockQ4_0>(&bytes, k),
                WType::Q4_1 => candle_dequant::<BlockQ4_1>(&bytes, k),
                WType::Q8_0 => candle_dequant::<BlockQ8_0>(&bytes, k),
                WType::Q4K => candle_dequant::<BlockQ4K>(&bytes, k),
                WType::Q5K => candle_dequant::<BlockQ5K>(&bytes, k),
                WType::Q6K => candle_dequant::<BlockQ6K>(&bytes, k),
                WType::Q5_0 => candle_dequant::<BlockQ5_0>(&bytes, k),
                WType::Q5_1 => candle_dequant::<BlockQ5_1>(&bytes, k),
                WType::Q2K => candle_dequant::<BlockQ2K>(&bytes, k),
                WType::Q3K => candle_dequant::<BlockQ3K>(&bytes, k),
                WType::IQ4NL | WType::IQ4XS | WType::MXFP4 => ours.clone(),
            };
            for (e, (a, b)) in ours.iter().zip(&theirs).enumerate() {
                assert_eq!(
                    a.to_bits(),
                    b.to_bits(),
                    "{ty:?} k={k} element {e}: {a} vs {b}"
                );
            }
            // And the quantization error is what the format allows (sanity of the layout).
            let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
            let err = ours
                .iter()
                .zip(&x)
                .fold(0f32, |a, (o, v)| a.max((o - v).abs()));
            // Q2_K's 4 levels per 16 weights are coarser: half a step of (max - min) / 3.
            // MXFP4's top level (1.5 * 2^floor(log2 amax)) clips a block's largest values by up
            // to a quarter of the next power of two.
            let bound = match ty {
                WType::Q2K => 0.35,
                WType::MXFP4 => 0.26,
                _ => 0.2,
            };
            assert!(
                err <= amax * bound,
                "{ty:?}: max error {err} for amax {amax}"
            );
        }
    }
}

fn acts(backend: Backend, ty: ActType, x: &[f32], m: usize, k: usize) -> QActs {
    let mut q = QActs::default();
    quantize_activations(backend, ty, x, m, k, &mut q);
    q
}

fn assert_same_acts(a: &QActs, b: &QActs) {
    assert_eq!(a.qs, b.qs);
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&a.d), bits(&b.d));
    assert_eq!(bits(&a.s), bits(&b.s));
    assert_eq!(a.bsums, b.bsums);
}

/// Inputs with exact ties (x * 127 / amax landing on .5) and zero blocks, besides random ones.
fn tricky_inputs(k: usize) -> Vec<Vec<f32>> {
    let mut r = rng(7);
    let mut v = vec![random_vec(&mut r, k, 1.0), vec![0.0; k]];
    // amax 127 makes the multiplier exactly 1, so x.5 values are exact ties.
    v.push(
        (0..k)
            .map(|i| {
                if i % 32 == 0 {
                    127.0
                } else {
                    (i % 64) as f32 - 31.5
                }
            })
            .collect(),
    );
    v.push(
        (0..k)
            .map(|i| {
                if i % 32 == 5 {
                    -127.0
                } else {
                    (i % 7) as f32 * 0.5 - 1.5
                }
            })
            .collect(),
    );
    // Largest magnitudes of both signs in one block: the first one found sets the sign.
    v.push(
        (0..k)
            .map(|i| match i % 256 {
                3 => -2.0,
                10 => 2.0,
                100 => 1.0,
                _ => (i % 13) as f32 * 0.1 - 0.6,
            })
            .collect(),
    );
    v.push(
        (0..k)
            .map(|i| match i % 256 {
                3 => 2.0,
                255 => -2.0,
                _ => (i % 11) as f32 * -0.1 + 0.5,
            })
            .collect(),
    );
    v
}

/// (c) The AVX2 and portable quantizers give bit-identical blocks.
#[test]
fn avx2_quantization_matches_portable() {
    if !Backend::Avx2.is_available() {
        return;
    }
    for ty in [ActType::Q8_0, ActType::Q8_1, ActType::Q8K] {
        for k in [256, 768, 1536] {
            for x in tricky_inputs(k * 3) {
                let a = acts(Backend::Avx2, ty, &x, 3, k);
                let p = acts(Backend::Portable, ty, &x, 3, k);
                assert_same_acts(&a, &p);
            }
        }
    }
}

/// Ties go to even (as ggml's AVX2 `_mm256_round_ps(.., _MM_ROUND_NEAREST)` and `nearest_int`).
#[test]
fn quantization_rounds_ties_to_even() {
    let mut x = vec![0f32; 32];
    x[0] = 127.0;
    x[1] = 2.5;
    x[2] = -3.5;
    x[3] = 0.5;
    for b in [Backend::Portable, Backend::detect()] {
        let q = acts(b, ActType::Q8_0, &x, 1, 32);
        assert_eq!(&q.qs[..4], &[127, 2, -4, 0], "{b:?}");
    }
}

/// Our Q8_0/Q8_1/Q8_K blocks against candle's `from_float`. Candle (like ggml's scalar
/// reference) uses `1 / d` and rounds half away from zero, ggml's AVX2 code (which we follow)
/// `127 / amax` and half to even; so quants may differ by one in rare cases, scales not at all.
#[test]
fn quantization_matches_candle_up_to_rounding() {
    let mut r = rng(3);
    for ty in [ActType::Q8_0, ActType::Q8_1, ActType::Q8K] {
        let k = 2048;
        let x = random_vec(&mut r, k, 1.0);
        let ours = acts(Backend::detect(), ty, &x, 1, k).row_ggml_bytes(0);
        let (theirs, bs, head) = match ty {
            ActType::Q8_0 => {
                let mut b = vec![BlockQ8_0::zeros(); k / 32];
                BlockQ8_0::from_float(&x, &mut b);
                (bytes_of(&b), 34, 2)
            }
            ActType::Q8_1 => {
                let mut b = vec![BlockQ8_1::zeros(); k / 32];
                BlockQ8_1::from_float(&x, &mut b);
                (bytes_of(&b), 36, 4)
            }
            _ => {
                let mut b = vec![BlockQ8K::zeros(); k / 256];
                BlockQ8K::from_float(&x, &mut b);
                (bytes_of(&b), 292, 4)
            }
        };
        assert_eq!(ours.len(), theirs.len());
        let mut differing = 0;
        for (bo, bt) in ours.chunks(bs).zip(theirs.chunks(bs)) {
            // d (first 2 or 4 bytes) identical.
            let dlen = if ty == ActType::Q8K { 4 } else { 2 };
            assert_eq!(bo[..dlen], bt[..dlen], "{ty:?}: scales differ");
            if ty == ActType::Q8_1 {
                // candle computes s in f16 arithmetic (f16(sum) * d), ggml in f32: near-equal.
                let so = half::f16::from_le_bytes([bo[2], bo[3]]).to_f32();
                let st = half::f16::from_le_bytes([bt[2], bt[3]]).to_f32();
                assert!(
                    (so - st).abs() <= 2e-3 * so.abs().max(st.abs()) + 1e-6,
                    "s {so} vs {st}"
                );
            }
            let n = if ty == ActType::Q8K { 256 } else { 32 };
            for (a, b) in bo[head..head + n].iter().zip(&bt[head..head + n]) {
                let d = (*a as i8 as i32 - *b as i8 as i32).abs();
                assert!(d <= 1, "{ty:?}: quants {a} vs {b}");
                differing += usize::from(d != 0);
            }
        }
        assert!(
            differing * 200 < k,
            "{ty:?}: {differing} of {k} quants differ from candle"
        );
    }
}

/// (d) Our dot of weight rows with quantized activations equals candle's `vec_dot` on the same
/// blocks, within float re-association error.
#[test]
fn dot_matches_candle_vec_dot() {
    fn check<T: GgmlType>(ty: WType, r: &mut rand::rngs::StdRng) {
        let k = 1024;
        let x = random_vec(r, k, 1.0);
        let wf = random_vec(r, k, 0.05);
        let wb = to_weight_bytes(ty, &wf);
        let pool = ThreadPool::new(1);
        let mut y = [0f32];
        tpslab_kernels::matmul(
            &pool,
            &QMatrix {
                ty,
                n: 1,
                k,
                data: &wb,
                layout: tpslab_kernels::Layout::Ggml,
            },
            &x,
            1,
            &mut y,
        );
        let q = acts(Backend::detect(), ActType::for_weight(ty), &x, 1, k);
        let xb = blocks_from::<T::VecDotType>(&q.row_ggml_bytes(0));
        let theirs = T::vec_dot(k, &blocks_from::<T>(&wb), &xb);
        let scale: f32 = wf.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
        assert!(
            (y[0] - theirs).abs() <= 1e-5 * scale,
            "{ty:?}: {} vs candle {theirs}",
            y[0]
        );
    }
    let mut r = rng(11);
    for _ in 0..20 {
        check::<BlockQ4_1>(WType::Q4_1, &mut r);
        check::<BlockQ4_0>(WType::Q4_0, &mut r);
        check::<BlockQ8_0>(WType::Q8_0, &mut r);
        check::<BlockQ4K>(WType::Q4K, &mut r);
        check::<BlockQ5K>(WType::Q5K, &mut r);
        check::<BlockQ6K>(WType::Q6K, &mut r);
        check::<BlockQ5_0>(WType::Q5_0, &mut r);
        check::<BlockQ5_1>(WType::Q5_1, &mut r);
        check::<BlockQ2K>(WType::Q2K, &mut r);
        check::<BlockQ3K>(WType::Q3K, &mut r);
    }
}

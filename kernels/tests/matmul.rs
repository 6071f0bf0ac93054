//! `matmul` against an f64 dequantize-then-dot reference, the backends against each other, and
//! batch invariance (a row's output bits do not depend on m, its tile position or the threads).

mod common;

use std::sync::OnceLock;

use common::*;
use proptest::prelude::*;
use tpslab_kernels::{Backend, QMatrix, ThreadPool, WType, matmul, matmul_with};

fn pools() -> &'static [ThreadPool; 3] {
    static P: OnceLock<[ThreadPool; 3]> = OnceLock::new();
    P.get_or_init(|| [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)])
}

/// Every backend this CPU has (the SIMD paths the CPU lacks cannot run here).
fn backends() -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| b.is_available())
        .collect()
}

/// Smallest k allowed for `ty` (K-quants need multiples of 256).
fn k_unit(ty: WType) -> usize {
    ty.block_size().max(32)
}

/// (b) Every type and backend against the f64 reference. Bound per output element: the
/// activation quantization error `sum_l |w_l| * amax_block(l) / 254` (half a quantization step
/// of Q8 blocks whose step is amax / 127), plus 4e-3 * sum_l |x_l| (|w_l| + |min_block(l)|) for
/// the f16-rounded scales and f32 accumulation; float weights (no quantization) 1e-5 * sum |x w|.
#[test]
fn matmul_matches_f64_reference() {
    let mut r = rng(5);
    for ty in ALL_TYPES {
        for &(n, k, m) in &[(7, 256, 1), (9, 512, 5), (16, 768, 8), (5, 256, 3)] {
            let data = random_weights(&mut r, ty, n, k);
            let w = QMatrix {
                ty,
                n,
                k,
                data: &data,
                layout: tpslab_kernels::Layout::Ggml,
            };
            let wf = dequantized(&w);
            let x = random_vec(&mut r, m * k, 1.0);
            let ab = if ty.block_size() == 256 { 256 } else { 32 };
            for backend in backends() {
                for pool in pools() {
                    let mut y = vec![0f32; m * n];
                    matmul_with(backend, pool, &w, &x, m, &mut y);
                    for i in 0..m {
                        let xi = &x[i * k..(i + 1) * k];
                        for j in 0..n {
                            let wj = &wf[j * k..(j + 1) * k];
                            let exact: f64 =
                                xi.iter().zip(wj).map(|(a, b)| *a as f64 * *b as f64).sum();
                            let abs: f64 = xi
                                .iter()
                                .zip(wj)
                                .map(|(a, b)| (*a as f64 * *b as f64).abs())
                                .sum();
                            let tol = if ab == 32 && ty.block_size() == 1 {
                                1e-5 * abs
                            } else {
                                let mut t = 4e-3 * abs;
                                for (xb, wb) in xi.chunks(ab).zip(wj.chunks(ab)) {
                                    let amax = xb.iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                                    let wmin =
                                        wb.iter().fold(f32::INFINITY, |a, v| a.min(v.abs())) as f64;
                                    let sw: f64 = wb.iter().map(|v| v.abs() as f64).sum();
                                    let sx: f64 = xb.iter().map(|v| v.abs() as f64).sum();
                                    t += sw * amax / 254.0 + 4e-3 * wmin * sx;
                                }
                                t
                            };
                            let got = y[i * n + j] as f64;
                            assert!(
                                (got - exact).abs() <= tol,
                                "{ty:?} {backend:?} {}t n={n} k={k} m={m} ({i},{j}): {got} vs {exact} (tol {tol})",
                                pool.n_threads()
                            );
                        }
                    }
                }
            }
        }
    }
}

/// Model-sized shapes at m = 1, small batches (in-place tiles) and past 9 rows (the repacked
/// panels, every tile width and partial panels; the other quantized types four rows at a time and
/// the float types in 2 x 4 tiles, with remainders): every SIMD path this CPU has (AVX2,
/// AVX-VNNI, AVX-512 VNNI) equals portable bit for bit. Prints which paths ran.
#[test]
fn backends_agree_bit_for_bit() {
    let simd: Vec<Backend> = backends()
        .into_iter()
        .filter(|b| *b != Backend::Portable)
        .collect();
    eprintln!(
        "SIMD paths on this CPU: {:?} (detected: {:?})",
        simd.iter().map(|b| b.name()).collect::<Vec<_>>(),
        Backend::detect()
    );
    let mut r = rng(9);
    for (ty, n, k, m) in [
        (WType::Q4_1, 192, 576, 1),
        (WType::Q4_1, 64, 1536, 13),
        (WType::Q4_1, 40, 576, 10),
        (WType::Q4_1, 50, 576, 37),
        (WType::Q8_0, 33, 576, 29),
        (WType::Q4_0, 24, 1024, 19),
        (WType::Q8_0, 8, 64, 16),
        (WType::Q8_0, 130, 576, 7),
        (WType::Q4_0, 66, 576, 5),
        (WType::Q4K, 10, 512, 3),
        (WType::Q6K, 10, 512, 3),
        (WType::Q5K, 10, 512, 3),
        (WType::Q4K, 37, 2048, 1),
        (WType::Q5K, 29, 1536, 2),
        (WType::Q6K, 41, 1024, 1),
        (WType::Q4K, 13, 768, 11),
        (WType::Q6K, 7, 256, 17),
        (WType::Q4K, 9, 256, 4),
        (WType::Q4K, 40, 512, 29),
        (WType::Q4K, 17, 256, 16),
        (WType::Q4K, 24, 1024, 10),
        (WType::Q6K, 40, 512, 29),
        (WType::Q6K, 17, 256, 16),
        (WType::Q6K, 9, 1024, 10),
        (WType::Q5K, 40, 512, 29),
        (WType::Q5K, 17, 256, 16),
        (WType::Q5K, 9, 1024, 10),
        (WType::Q5K, 12, 512, 9),
        (WType::Q6K, 11, 512, 6),
        (WType::F16, 10, 100, 3),
        (WType::F32, 9, 72, 5),
        (WType::BF16, 13, 200, 2),
        (WType::F16, 8, 64, 1),
        // Decode's in-place half dots: a partial group of rows, tails of 4 and 7 elements.
        (WType::F16, 13, 100, 1),
        (WType::BF16, 9, 71, 1),
        (WType::Q5_0, 66, 576, 5),
        (WType::Q5_1, 33, 576, 2),
        (WType::IQ4NL, 17, 576, 3),
        (WType::IQ4NL, 9, 544, 1),
        (WType::Q2K, 19, 1536, 2),
        (WType::Q3K, 23, 1024, 3),
        (WType::IQ4XS, 21, 768, 4),
        (WType::Q2K, 5, 256, 13),
        (WType::Q3K, 7, 512, 1),
        (WType::IQ4XS, 9, 2048, 1),
        (WType::Q5_1, 17, 576, 6),
        (WType::IQ4NL, 11, 544, 5),
        (WType::MXFP4, 9, 544, 7),
        (WType::MXFP4, 5, 576, 1),
        (WType::MXFP4, 6, 1024, 4),
        (WType::Q3K, 6, 512, 8),
        // The other 32-element types on the in-place tiles (up to 12 rows) and on the panels
        // (past them), partial panels included.
        (WType::Q5_0, 40, 576, 29),
        (WType::Q5_0, 24, 1024, 13),
        (WType::Q5_0, 13, 576, 12),
        (WType::Q5_1, 50, 576, 37),
        (WType::Q5_1, 17, 1024, 16),
        (WType::IQ4NL, 33, 544, 16),
        (WType::IQ4NL, 9, 576, 40),
    ] {
        let data = random_weights(&mut r, ty, n, k);
        let w = QMatrix {
            ty,
            n,
            k,
            data: &data,
            layout: tpslab_kernels::Layout::Ggml,
        };
        let x = random_vec(&mut r, m * k, 1.0);
        let mut p = vec![0f32; m * n];
        matmul_with(Backend::Portable, &pools()[2], &w, &x, m, &mut p);
        for &b in &simd {
            let mut a = vec![0f32; m * n];
            matmul_with(b, &pools()[1], &w, &x, m, &mut a);
            for (e, (u, v)) in a.iter().zip(&p).enumerate() {
                assert_eq!(
                    u.to_bits(),
                    v.to_bits(),
                    "{ty:?} {b:?} element {e}: {u} vs {v}"
                );
            }
        }
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// (e) Row i computed inside a batch of m (any tile position, any thread count) has the
    /// same bits as row i computed alone on one thread, and as inside any sub-batch.
    #[test]
    fn batch_invariance(
        ti in 0usize..ALL_TYPES.len(),
        n in 1usize..23,
        kb in 1usize..5,
        m in 1usize..40,
        lo_frac in 0.0f64..1.0,
        seed in any::<u64>(),
    ) {
        let ty = ALL_TYPES[ti];
        let k = kb * k_unit(ty);
        let mut r = rng(seed);
        let data = random_weights(&mut r, ty, n, k);
        let w = QMatrix::rows(ty, n, k, &data);
        let x = random_vec(&mut r, m * k, 1.0);
        for backend in backends() {
            let mut alone = vec![0f32; m * n];
            for i in 0..m {
                matmul_with(backend, &pools()[0], &w, &x[i * k..(i + 1) * k], 1, &mut alone[i * n..(i + 1) * n]);
            }
            for pool in pools() {
                let mut y = vec![0f32; m * n];
                matmul_with(backend, pool, &w, &x, m, &mut y);
                prop_assert_eq!(bits(&y), bits(&alone), "{:?} {:?} {} threads", ty, backend, pool.n_threads());
            }
            // A sub-batch starting mid-way (shifts every row's tile position).
            let lo = ((m as f64 * lo_frac) as usize).min(m - 1);
            let mut sub = vec![0f32; (m - lo) * n];
            matmul_with(backend, &pools()[1], &w, &x[lo * k..], m - lo, &mut sub);
            prop_assert_eq!(bits(&sub), bits(&alone[lo * n..]));
        }
    }
}

/// The names `TPSLAB_CPU_KERNELS` takes round-trip, and the detected backend is one this CPU has.
#[test]
fn backend_names_and_detection() {
    for b in Backend::ALL {
        assert_eq!(Backend::from_name(b.name()), Some(b));
        assert_eq!(Backend::from_name(&b.name().to_uppercase()), Some(b));
    }
    assert_eq!(Backend::from_name("avx9000"), None);
    assert!(Backend::detect().is_available());
    assert!(Backend::Portable.is_available());
}

/// The default entry point uses the detected backend and a thread-count-independent result.
#[test]
fn matmul_default_backend() {
    let mut r = rng(2);
    let (n, k, m) = (12, 64, 4);
    let data = random_weights(&mut r, WType::Q4_1, n, k);
    let w = QMatrix {
        ty: WType::Q4_1,
        n,
        k,
        data: &data,
        layout: tpslab_kernels::Layout::Ggml,
    };
    let x = random_vec(&mut r, m * k, 1.0);
    let mut a = vec![0f32; m * n];
    let mut b = vec![0f32; m * n];
    matmul(&pools()[2], &w, &x, m, &mut a);
    matmul_with(Backend::detect(), &pools()[0], &w, &x, m, &mut b);
    assert_eq!(bits(&a), bits(&b));
}

/// Large m takes the parallel activation-quantization path; results still match m = 1.
#[test]
fn large_batch_parallel_quantization() {
    let mut r = rng(4);
    let (n, k, m) = (8, 1536, 48);
    let data = random_weights(&mut r, WType::Q4_1, n, k);
    let w = QMatrix {
        ty: WType::Q4_1,
        n,
        k,
        data: &data,
        layout: tpslab_kernels::Layout::Ggml,
    };
    let x = random_vec(&mut r, m * k, 1.0);
    let mut y = vec![0f32; m * n];
    matmul(&pools()[2], &w, &x, m, &mut y);
    for i in [0, 17, 47] {
        let mut one = vec![0f32; n];
        matmul(&pools()[0], &w, &x[i * k..(i + 1) * k], 1, &mut one);
        assert_eq!(bits(&y[i * n..(i + 1) * n]), bits(&one));
    }
}

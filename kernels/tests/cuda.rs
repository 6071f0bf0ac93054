//! Every CUDA kernel against a plain CPU reference in f64, on fresh random inputs each run (the
//! seed is printed). Outputs are poisoned (NaN) before each launch, so an unwritten element fails.
//! Without a GPU or driver each test prints why and passes: CI machines have none.
//!
//! Tolerances (relative L2 error ||gpu - ref|| / ||ref||): f32 kernels 1e-5; matrix-vector kernels
//! (exact dequantization, f32 accumulation, up to 8 rows) 1e-4 — the K-quant ones over 8-bit
//! activations against a reference fed the same 8-bit activations (emulated here bit for bit),
//! and 2e-2 against the f32 activations; the cuBLAS path past 8 rows (f16
//! activations and weights, f32 accumulation) 5e-3; attention over f16 K/V 1e-3 (the reference reads the same f16 values).
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)]

use half::f16;
use rand::{Rng, SeedableRng, rngs::StdRng};
use tpslab_kernels::cuda::{AttnGeom, AttnIo, DevMatrix, Feature, GemmScratch, Gpu, Support};
use tpslab_kernels::{WType, dequantize_row};

/// The first GPU. These tests are ignored by default, with the reason (a machine without a GPU
/// lists them as ignored, never as passed); run with `--include-ignored` where there is one, and
/// fail when there is not.
fn gpu() -> Gpu {
    Gpu::new(0).unwrap_or_else(|e| panic!("this test needs a CUDA GPU: {e}"))
}

fn rng() -> StdRng {
    let seed: u64 = rand::rng().random();
    println!("seed {seed}");
    StdRng::seed_from_u64(seed)
}

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output {g}");
        num += (g as f64 - w).powi(2);
        den += w * w;
    }
    (num / den.max(1e-30)).sqrt()
}

fn floats(r: &mut StdRng, n: usize) -> Vec<f32> {
    (0..n).map(|_| r.random_range(-1.0f32..1.0)).collect()
}

fn put_f16(b: &mut [u8], at: usize, v: f32) {
    b[at..at + 2].copy_from_slice(&f16::from_f32(v).to_le_bytes());
}

/// A random `n x k` matrix of type `ty` with sane block scales.
fn random_matrix(r: &mut StdRng, ty: WType, n: usize, k: usize) -> Vec<u8> {
    let rb = ty.row_bytes(k);
    let mut d = vec![0u8; n * rb];
    match ty {
        WType::F32 => {
            for (c, v) in d.chunks_exact_mut(4).zip(floats(r, n * k)) {
                c.copy_from_slice(&v.to_le_bytes());
            }
        }
        WType::F16 => {
            for (c, v) in d.chunks_exact_mut(2).zip(floats(r, n * k)) {
                c.copy_from_slice(&f16::from_f32(v).to_le_bytes());
            }
        }
        WType::BF16 => {
            for (c, v) in d.chunks_exact_mut(2).zip(floats(r, n * k)) {
                c.copy_from_slice(&half::bf16::from_f32(v).to_le_bytes());
            }
        }
        WType::Q4_0 | WType::Q8_0 | WType::Q4_1 | WType::Q4K | WType::Q5K | WType::Q6K => {
            r.fill(&mut d[..]);
            let ts = ty.type_size();
            for blk in d.chunks_exact_mut(ts) {
                match ty {
                    WType::Q4_0 | WType::Q8_0 => put_f16(blk, 0, r.random_range(-0.1..0.1)),
                    WType::Q4_1 | WType::Q4K | WType::Q5K => {
                        put_f16(blk, 0, r.random_range(-0.1..0.1));
                        put_f16(blk, 2, r.random_range(-0.1..0.1));
                    }
                    WType::Q6K => put_f16(blk, 208, r.random_range(-0.01..0.01)),
                    _ => unreachable!(),
                }
            }
        }
        // The other types through the project's quantizer (valid blocks of every layout).
        _ => d = tpslab_kernels::quantize::quantize(ty, &floats(r, n * k)),
    }
    d
}

fn dequant(ty: WType, data: &[u8], n: usize, k: usize) -> Vec<f32> {
    let rb = ty.row_bytes(k);
    let mut out = vec![0f32; n * k];
    for i in 0..n {
        dequantize_row(
            ty,
            &data[i * rb..(i + 1) * rb],
            &mut out[i * k..(i + 1) * k],
        );
    }
    out
}

fn download(g: &Gpu, ptr: u64, n: usize) -> Vec<f32> {
    let mut v = vec![0f32; n];
    g.dtoh(ptr, &mut v).unwrap();
    v
}

/// Whether the CUDA backend takes weights of type `ty` (tried in the support table).
fn has_kernel(ty: WType) -> bool {
    Feature::Type(ty).runs(false)
}

/// The weight types the CUDA backend takes.
fn types() -> Vec<WType> {
    WType::ALL.into_iter().filter(|&t| has_kernel(t)).collect()
}

/// A type the backend does not take yet is refused with an error naming it, not launched.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn types_without_a_kernel_are_refused() {
    let g = gpu();
    let mut r = rng();
    for ty in WType::ALL.into_iter().filter(|&t| !has_kernel(t)) {
        let (n, k) = (8, 256);
        let wd = g.upload(&random_matrix(&mut r, ty, n, k)).unwrap();
        let mat = DevMatrix {
            ty,
            n,
            k,
            ptr: wd.ptr(),
        };
        let (x, y) = (g.alloc(k * 4).unwrap(), g.alloc(n * 4).unwrap());
        let err = g
            .matmul(&mat, x.ptr(), 1, y.ptr(), &mut GemmScratch::default())
            .unwrap_err();
        assert!(
            err.to_string().contains("has not run on a GPU yet"),
            "{ty:?}: {err}"
        );
        let tokens = g.upload(&[0i32]).unwrap();
        assert!(g.embed(&mat, tokens.ptr(), 1, x.ptr()).is_err(), "{ty:?}");
    }
}

/// The activations as `quantize_q8` (mmvq.cu) leaves them: per 32 values d = amax / 127 and
/// q = round-half-even(x * (127 / amax)), in f32 arithmetic as on the device; back as q * d.
fn q8_round(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|b| {
            let amax = b.iter().fold(0f32, |a, v| a.max(v.abs()));
            let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
            let d = amax / 127.0;
            b.iter()
                .map(move |v| (v * inv).round_ties_even() as f64 * d as f64)
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn matmul_every_type_and_batch_size() {
    let g = gpu();
    let mut r = rng();
    let mut scratch = GemmScratch::default();
    for ty in types() {
        let (n, k) = (200 + r.random_range(0..60), 256 * r.random_range(1..5));
        let w = random_matrix(&mut r, ty, n, k);
        let wf = dequant(ty, &w, n, k);
        let wd = g.upload(&w).unwrap();
        let mat = DevMatrix {
            ty,
            n,
            k,
            ptr: wd.ptr(),
        };
        for m in [1, 2, 3, 5, 8, 13, 40, 80] {
            let x = floats(&mut r, m * k);
            let xd = g.upload(&x).unwrap();
            let yd = g.alloc(m * n * 4).unwrap();
            g.memset(yd.ptr(), 0xff, m * n * 4).unwrap();
            g.matmul(&mat, xd.ptr(), m, yd.ptr(), &mut scratch).unwrap();
            let got = download(&g, yd.ptr(), m * n);
            let want: Vec<f64> = (0..m * n)
                .map(|i| {
                    let (row, col) = (i / n, i % n);
                    (0..k)
                        .map(|e| x[row * k + e] as f64 * wf[col * k + e] as f64)
                        .sum()
                })
                .collect();
            let err = rel_err(&got, &want);
            let tensor_cores = m > 8 && ty != WType::F32 && g.has_cublas();
            let tol = if tensor_cores { 5e-3 } else { 1e-4 };
            assert!(
                err < tol,
                "{ty:?} n={n} k={k} m={m}: rel err {err:e} > {tol:e}"
            );
        }
    }
}

/// The kernels over 8-bit activations (mmvq.cu, for the types with f32-activation kernels off
/// unless `TPSLAB_CUDA_MMVQ=1`) of every quantized type, those the backend does not take yet
/// included: against a reference fed the same 8-bit activations, and against the f32 ones.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn mmvq_kernels_of_every_quantized_type_over_8bit_activations() {
    let mut g = gpu();
    g.set_mmvq(true);
    let mut r = rng();
    let mut scratch = GemmScratch::default();
    for ty in WType::ALL.into_iter().filter(|t| t.block_size() > 1) {
        let (n, k) = (200 + r.random_range(0..60), 256 * r.random_range(1..5));
        let w = random_matrix(&mut r, ty, n, k);
        let wf = dequant(ty, &w, n, k);
        let wd = g.upload(&w).unwrap();
        let mat = DevMatrix {
            ty,
            n,
            k,
            ptr: wd.ptr(),
        };
        for m in [1, 2, 3, 5, 8, 13] {
            let x = floats(&mut r, m * k);
            let xd = g.upload(&x).unwrap();
            let yd = g.alloc(m * n * 4).unwrap();
            g.memset(yd.ptr(), 0xff, m * n * 4).unwrap();
            g.matvec(&mat, xd.ptr(), m, yd.ptr(), &mut scratch).unwrap();
            let got = download(&g, yd.ptr(), m * n);
            let dot = |xs: &dyn Fn(usize) -> f64| -> Vec<f64> {
                (0..m * n)
                    .map(|i| {
                        let (row, col) = (i / n, i % n);
                        (0..k)
                            .map(|e| xs(row * k + e) * wf[col * k + e] as f64)
                            .sum()
                    })
                    .collect()
            };
            let xq = q8_round(&x);
            let err_q = rel_err(&got, &dot(&|i| xq[i]));
            assert!(
                err_q < 1e-4,
                "{ty:?} n={n} k={k} m={m}: rel err {err_q:e} against 8-bit activations"
            );
            let err = rel_err(&got, &dot(&|i| x[i] as f64));
            assert!(
                err < 2e-2,
                "{ty:?} n={n} k={k} m={m}: rel err {err:e} against f32 activations"
            );
        }
    }
}

/// The wide-load F16/BF16 batch-1 kernels (matvec.cu `mmv_*_wide`, off unless
/// `TPSLAB_CUDA_WIDE=1`) against the f64 reference.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn wide_load_dense_kernels_for_one_row() {
    let mut g = gpu();
    g.set_wide(true);
    let mut r = rng();
    let mut scratch = GemmScratch::default();
    for ty in [WType::F16, WType::BF16] {
        let (n, k) = (300 + r.random_range(0..60), 8 * r.random_range(100..700));
        let w = random_matrix(&mut r, ty, n, k);
        let wf = dequant(ty, &w, n, k);
        let wd = g.upload(&w).unwrap();
        let mat = DevMatrix {
            ty,
            n,
            k,
            ptr: wd.ptr(),
        };
        let x = floats(&mut r, k);
        let xd = g.upload(&x).unwrap();
        let yd = g.alloc(n * 4).unwrap();
        g.memset(yd.ptr(), 0xff, n * 4).unwrap();
        g.matvec(&mat, xd.ptr(), 1, yd.ptr(), &mut scratch).unwrap();
        let got = download(&g, yd.ptr(), n);
        let want: Vec<f64> = (0..n)
            .map(|c| (0..k).map(|e| x[e] as f64 * wf[c * k + e] as f64).sum())
            .collect();
        let err = rel_err(&got, &want);
        assert!(err < 1e-5, "{ty:?} n={n} k={k}: rel err {err:e}");
    }
}

/// The gate-up product with SwiGLU gating (`gate_up_swiglu`: fused into the 8-bit-activation
/// kernels up to 8 rows, product then `swiglu` past them) against the f64 reference.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn gate_up_swiglu_fused_and_not() {
    let mut g = gpu();
    g.set_mmvq(true);
    let mut r = rng();
    let mut scratch = GemmScratch::default();
    for ty in types().into_iter().filter(|t| t.block_size() > 1) {
        let (ffn, k) = (300 + r.random_range(0..60), 256 * r.random_range(1..4));
        let w = random_matrix(&mut r, ty, 2 * ffn, k);
        let wf = dequant(ty, &w, 2 * ffn, k);
        let wd = g.upload(&w).unwrap();
        let mat = DevMatrix {
            ty,
            n: 2 * ffn,
            k,
            ptr: wd.ptr(),
        };
        for m in [1, 3, 8, 13] {
            let x = floats(&mut r, m * k);
            let xd = g.upload(&x).unwrap();
            let gu = g.alloc(m * 2 * ffn * 4).unwrap();
            let yd = g.alloc(m * ffn * 4).unwrap();
            g.memset(yd.ptr(), 0xff, m * ffn * 4).unwrap();
            g.gate_up_swiglu(&mat, xd.ptr(), m, gu.ptr(), yd.ptr(), &mut scratch)
                .unwrap();
            let got = download(&g, yd.ptr(), m * ffn);
            let xq = q8_round(&x);
            let want: Vec<f64> = (0..m * ffn)
                .map(|i| {
                    let (row, c) = (i / ffn, i % ffn);
                    let dot = |w_row: usize| -> f64 {
                        (0..k)
                            .map(|e| xq[row * k + e] * wf[w_row * k + e] as f64)
                            .sum()
                    };
                    let (gv, uv) = (dot(c), dot(ffn + c));
                    gv / (1.0 + (-gv).exp()) * uv
                })
                .collect();
            let err = rel_err(&got, &want);
            // Past 8 rows the product runs on f32 (or f16) activations: against the 8-bit ones
            // the difference is the activations' quantization.
            let tol = if m <= 8 { 1e-4 } else { 2e-2 };
            assert!(err < tol, "{ty:?} m={m}: rel err {err:e}");
        }
    }
}

/// The fused tensor-core kernels (mmq.cu, off unless `TPSLAB_CUDA_MMQ=1`) of every quantized
/// type, at row counts from 9 to 256: against f16-rounded weights and activations summed in f64
/// (what the kernel computes, up to the order of its f32 sums), and against the f32 ones.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn mmq_kernels_of_every_quantized_type() {
    let g = gpu();
    let mut r = rng();
    let h = |v: f32| f16::from_f32(v).to_f32() as f64;
    for ty in WType::ALL.into_iter().filter(|t| t.block_size() > 1) {
        let (n, k) = (200 + r.random_range(0..60), 256 * r.random_range(1..5));
        let w = random_matrix(&mut r, ty, n, k);
        let wf = dequant(ty, &w, n, k);
        let wd = g.upload(&w).unwrap();
        let mat = DevMatrix {
            ty,
            n,
            k,
            ptr: wd.ptr(),
        };
        for m in [9, 16, 33, 64, 100, 256] {
            let x = floats(&mut r, m * k);
            let xd = g.upload(&x).unwrap();
            let yd = g.alloc(m * n * 4).unwrap();
            g.memset(yd.ptr(), 0xff, m * n * 4).unwrap();
            g.mmq(&mat, xd.ptr(), m, yd.ptr()).unwrap();
            let got = download(&g, yd.ptr(), m * n);
            let dot = |xs: &dyn Fn(usize) -> f64, ws: &dyn Fn(usize) -> f64| -> Vec<f64> {
                (0..m * n)
                    .map(|i| {
                        let (row, col) = (i / n, i % n);
                        (0..k).map(|e| xs(row * k + e) * ws(col * k + e)).sum()
                    })
                    .collect()
            };
            let err_h = rel_err(&got, &dot(&|i| h(x[i]), &|i| h(wf[i])));
            assert!(
                err_h < 1e-4,
                "{ty:?} n={n} k={k} m={m}: rel err {err_h:e} against f16 operands"
            );
            let err = rel_err(&got, &dot(&|i| x[i] as f64, &|i| wf[i] as f64));
            assert!(
                err < 5e-3,
                "{ty:?} n={n} k={k} m={m}: rel err {err:e} against f32 operands"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn embedding_rows_of_every_type() {
    let g = gpu();
    let mut r = rng();
    for ty in types() {
        let (n, k) = (300, 512);
        let w = random_matrix(&mut r, ty, n, k);
        let wf = dequant(ty, &w, n, k);
        let wd = g.upload(&w).unwrap();
        let tokens: Vec<i32> = (0..17).map(|_| r.random_range(0..n as i32)).collect();
        let td = g.upload(&tokens).unwrap();
        let out = g.alloc(tokens.len() * k * 4).unwrap();
        g.memset(out.ptr(), 0xff, tokens.len() * k * 4).unwrap();
        let mat = DevMatrix {
            ty,
            n,
            k,
            ptr: wd.ptr(),
        };
        g.embed(&mat, td.ptr(), tokens.len(), out.ptr()).unwrap();
        let got = download(&g, out.ptr(), tokens.len() * k);
        let want: Vec<f64> = tokens
            .iter()
            .flat_map(|&t| {
                wf[t as usize * k..(t as usize + 1) * k]
                    .iter()
                    .map(|&v| v as f64)
            })
            .collect();
        assert!(rel_err(&got, &want) < 1e-6, "{ty:?}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn norms_swiglu_bias_add_argmax() {
    let g = gpu();
    let mut r = rng();
    let (rows, dim, eps) = (7, 576, 1e-5f32);
    let x = floats(&mut r, rows * dim);
    let delta = floats(&mut r, rows * dim);
    let w = floats(&mut r, dim);
    let (xd, dd, wd) = (
        g.upload(&x).unwrap(),
        g.upload(&delta).unwrap(),
        g.upload(&w).unwrap(),
    );
    let out = g.alloc(rows * dim * 4).unwrap();
    let norm = |v: &[f32]| -> Vec<f64> {
        let ms = v.iter().map(|&a| (a as f64).powi(2)).sum::<f64>() / dim as f64;
        let s = 1.0 / (ms + eps as f64).sqrt();
        v.iter()
            .zip(&w)
            .map(|(&a, &b)| a as f64 * s * b as f64)
            .collect()
    };
    // Selected rows, in a different order.
    let sel: Vec<i32> = vec![5, 0, 3];
    let sd = g.upload(&sel).unwrap();
    g.memset(out.ptr(), 0xff, rows * dim * 4).unwrap();
    g.rms_norm(
        xd.ptr(),
        Some(sd.ptr()),
        sel.len(),
        wd.ptr(),
        out.ptr(),
        dim,
        eps,
    )
    .unwrap();
    let want: Vec<f64> = sel
        .iter()
        .flat_map(|&i| norm(&x[i as usize * dim..][..dim]))
        .collect();
    assert!(rel_err(&download(&g, out.ptr(), sel.len() * dim), &want) < 1e-5);

    g.add_rms_norm(xd.ptr(), dd.ptr(), wd.ptr(), out.ptr(), rows, dim, eps)
        .unwrap();
    let sum: Vec<f32> = x.iter().zip(&delta).map(|(a, b)| a + b).collect();
    let want: Vec<f64> = sum.chunks(dim).flat_map(norm).collect();
    assert!(rel_err(&download(&g, out.ptr(), rows * dim), &want) < 1e-5);
    let want_sum: Vec<f64> = sum.iter().map(|&v| v as f64).collect();
    assert!(rel_err(&download(&g, xd.ptr(), rows * dim), &want_sum) < 1e-6);

    // SwiGLU over rows of [gate | up].
    let ffn = 1536;
    let gu = floats(&mut r, rows * 2 * ffn);
    let gud = g.upload(&gu).unwrap();
    let act = g.alloc(rows * ffn * 4).unwrap();
    g.memset(act.ptr(), 0xff, rows * ffn * 4).unwrap();
    g.swiglu(gud.ptr(), act.ptr(), ffn, rows).unwrap();
    let want: Vec<f64> = gu
        .chunks(2 * ffn)
        .flat_map(|row| {
            (0..ffn).map(move |c| {
                let (gg, u) = (row[c] as f64, row[ffn + c] as f64);
                gg / (1.0 + (-gg).exp()) * u
            })
        })
        .collect();
    assert!(rel_err(&download(&g, act.ptr(), rows * ffn), &want) < 1e-5);

    // Bias and add.
    let b = floats(&mut r, dim);
    let bd = g.upload(&b).unwrap();
    let yd = g.upload(&x).unwrap();
    g.add_bias(yd.ptr(), bd.ptr(), dim, rows).unwrap();
    g.add(yd.ptr(), dd.ptr(), rows * dim).unwrap();
    let want: Vec<f64> = (0..rows * dim)
        .map(|i| x[i] as f64 + b[i % dim] as f64 + delta[i] as f64)
        .collect();
    assert!(rel_err(&download(&g, yd.ptr(), rows * dim), &want) < 1e-6);

    // Argmax, with a planted tie (the lower index wins) and a NaN.
    let vocab = 49_152;
    let mut logits = floats(&mut r, 3 * vocab);
    logits[vocab + 100] = 5.0;
    logits[vocab + 40_000] = 5.0;
    logits[2 * vocab + 7] = f32::NAN;
    let ld = g.upload(&logits).unwrap();
    let od = g.alloc(3 * 4).unwrap();
    g.argmax(ld.ptr(), 3, vocab, od.ptr()).unwrap();
    let mut got = [0u32; 3];
    g.dtoh(od.ptr(), &mut got).unwrap();
    for (row, &t) in got.iter().enumerate() {
        let l = &logits[row * vocab..(row + 1) * vocab];
        let best = (0..vocab)
            .filter(|&i| !l[i].is_nan())
            .fold(0, |b, i| if l[i] > l[b] { i } else { b });
        assert_eq!(t as usize, best, "row {row}");
    }
    assert_eq!(got[1], 100);
}

#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn topk_matches_a_sort() {
    let g = gpu();
    let mut r = rng();
    let (rows, vocab) = (5, 49_152);
    let mut logits = floats(&mut r, rows * vocab);
    // Ties across the cut in row 1, a NaN and -inf in row 2.
    for i in 0..10 {
        logits[vocab + 1000 + i] = 7.0;
    }
    logits[2 * vocab + 3] = f32::NAN;
    logits[2 * vocab + 4] = f32::NEG_INFINITY;
    let ld = g.upload(&logits).unwrap();
    for k in [1, 5, 40, 64, 200] {
        let (idd, vd) = (
            g.alloc(rows * k * 4).unwrap(),
            g.alloc(rows * k * 4).unwrap(),
        );
        g.memset(idd.ptr(), 0xff, rows * k * 4).unwrap();
        g.topk(ld.ptr(), rows, vocab, k, idd.ptr(), vd.ptr())
            .unwrap();
        let mut ids = vec![0u32; rows * k];
        let mut vals = vec![0f32; rows * k];
        g.dtoh(idd.ptr(), &mut ids).unwrap();
        g.dtoh(vd.ptr(), &mut vals).unwrap();
        for row in 0..rows {
            let l = &logits[row * vocab..(row + 1) * vocab];
            let (ids, vals) = (&ids[row * k..(row + 1) * k], &vals[row * k..(row + 1) * k]);
            let mut seen = std::collections::HashSet::new();
            for (&i, &v) in ids.iter().zip(vals) {
                assert!(
                    (i as usize) < vocab && seen.insert(i),
                    "row {row} k {k}: bad or repeated id {i}"
                );
                assert_eq!(l[i as usize].to_bits(), v.to_bits());
            }
            let mut want: Vec<f32> = l.iter().copied().filter(|v| !v.is_nan()).collect();
            want.sort_by(|a, b| b.total_cmp(a));
            let mut got = vals.to_vec();
            got.sort_by(|a, b| b.total_cmp(a));
            assert_eq!(got, want[..k].to_vec(), "row {row} k {k}");
        }
    }
}

/// flash.cu's prefill tiles (with the per-token kernels over the rest, as `attention_split` runs
/// them) against the per-token kernels alone over every token, on a batch of decodes and
/// prefill chunks over a shared paged cache, for every head size the kernels take.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
fn flash_prefill_matches_the_per_token_kernels() {
    let g = gpu();
    let mut r = rng();
    let (n_heads, n_kv, bs, nblocks) = (8usize, 2usize, 16usize, 64usize);
    for hdl in [1usize, 2, 3, 4, 5, 6, 8] {
        let hd = 32 * hdl;
        let (kv_dim, stride) = (n_kv * hd, (n_heads + 2 * n_kv) * hd);
        // A decode at 300, a chunk of 130 from 50, a decode at 5, a chunk of 17 from 0.
        let chunks: [(usize, usize); 4] = [(300, 1), (50, 130), (5, 1), (0, 17)];
        let (mut seq_of, mut pos, mut bt_off, mut bt) = (vec![], vec![], vec![], vec![]);
        for (s, &(p0, len)) in chunks.iter().enumerate() {
            let off = bt.len() as i32;
            let blocks = (p0 + len).div_ceil(bs);
            bt.extend((0..blocks).map(|_| r.random_range(0..nblocks as i32)));
            for t in 0..len {
                seq_of.push(s);
                pos.push(p0 + t);
                bt_off.push(off);
            }
        }
        let n = pos.len();
        let (tiles, rest) = tpslab_kernels::cuda::flash_split(&seq_of, &pos, 16);
        let cache: Vec<f16> = floats(&mut r, nblocks * bs * kv_dim)
            .into_iter()
            .map(f16::from_f32)
            .collect();
        let kc = g.upload(&cache).unwrap();
        let vc = g
            .upload(&cache.iter().rev().copied().collect::<Vec<_>>())
            .unwrap();
        let qkv = g.upload(&floats(&mut r, n * stride)).unwrap();
        let pos32: Vec<i32> = pos.iter().map(|&p| p as i32).collect();
        let (pd, od, bd) = (
            g.upload(&pos32).unwrap(),
            g.upload(&bt_off).unwrap(),
            g.upload(&bt).unwrap(),
        );
        let (td, rd) = (g.upload(&tiles).unwrap(), g.upload(&rest).unwrap());
        let outs = [
            g.alloc(n * n_heads * hd * 4).unwrap(),
            g.alloc(n * n_heads * hd * 4).unwrap(),
        ];
        let geom = AttnGeom::plain(n_heads, n_kv, hd, bs);
        let io = |out: u64| AttnIo {
            qkv: qkv.ptr(),
            stride,
            kc: kc.ptr(),
            vc: vc.ptr(),
            pos: pd.ptr(),
            bt_off: od.ptr(),
            bt: bd.ptr(),
            out,
            n,
        };
        for o in &outs {
            g.memset(o.ptr(), 0xff, n * n_heads * hd * 4).unwrap();
        }
        g.paged_attention(&io(outs[0].ptr()), &geom).unwrap();
        let split = tpslab_kernels::cuda::AttnSplit {
            tiles: td.ptr(),
            n_tiles: tiles.len() / 2,
            rest: rd.ptr(),
            n_rest: rest.len(),
        };
        g.attention_split(&io(outs[1].ptr()), &geom, &split)
            .unwrap();
        let want: Vec<f64> = download(&g, outs[0].ptr(), n * n_heads * hd)
            .into_iter()
            .map(f64::from)
            .collect();
        let got = download(&g, outs[1].ptr(), n * n_heads * hd);
        let err = rel_err(&got, &want);
        assert!(err < 1e-3, "head dim {hd}: rel err {err:e}");
    }
}

/// Reference RoPE (as the engine's CPU ops do it) and attention in f64.
#[test]
#[ignore = "needs a CUDA GPU: tests/gpu/gpu-check.sh runs it"]
#[allow(clippy::too_many_lines)] // one scenario: inputs, both kernels, then the f64 reference
fn rope_store_and_paged_attention() {
    let g = gpu();
    let mut r = rng();
    for (n_heads, n_kv_heads, hd, neox) in [
        (9, 3, 64, false),
        (32, 8, 128, true),
        (16, 16, 32, false),
        (14, 2, 64, true),
        (12, 12, 256, false),
    ] {
        let geom = AttnGeom::plain(n_heads, n_kv_heads, hd, 16);
        let (hidden, kv_dim) = (n_heads * hd, n_kv_heads * hd);
        let stride = hidden + 2 * kv_dim;
        // Three sequences: a 37-token prefill, a decode at position 80 and one at 5, over
        // shuffled blocks of a 40-block pool.
        let num_blocks = 40;
        let mut ids: Vec<i32> = (0..num_blocks as i32).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, r.random_range(0..=i));
        }
        let tables = [ids[0..3].to_vec(), ids[3..9].to_vec(), ids[9..10].to_vec()];
        let mut toks: Vec<(usize, usize)> = (0..37).map(|p| (0, p)).collect();
        toks.push((1, 80));
        toks.push((2, 5));
        let n = toks.len();
        let slot = |s: usize, p: usize| tables[s][p / 16] as usize * 16 + p % 16;
        // Earlier positions of sequences 1 and 2 are already in the cache (random values).
        let slots_total = num_blocks * 16;
        let mut kc: Vec<f16> = (0..slots_total * kv_dim)
            .map(|_| f16::from_f32(r.random_range(-1.0..1.0)))
            .collect();
        let mut vc: Vec<f16> = (0..slots_total * kv_dim)
            .map(|_| f16::from_f32(r.random_range(-1.0..1.0)))
            .collect();
        let qkv = floats(&mut r, n * stride);
        let pos: Vec<i32> = toks.iter().map(|&(_, p)| p as i32).collect();
        let slots: Vec<i32> = toks.iter().map(|&(s, p)| slot(s, p) as i32).collect();
        let mut bt: Vec<i32> = Vec::new();
        let mut starts = Vec::new();
        for t in &tables {
            starts.push(bt.len() as i32);
            bt.extend(t);
        }
        let bt_off: Vec<i32> = toks.iter().map(|&(s, _)| starts[s]).collect();
        let (qd, pd, sd, bd, od) = (
            g.upload(&qkv).unwrap(),
            g.upload(&pos).unwrap(),
            g.upload(&slots).unwrap(),
            g.upload(&bt).unwrap(),
            g.upload(&bt_off).unwrap(),
        );
        let kd = g.upload(&kc).unwrap();
        let vd = g.upload(&vc).unwrap();
        let theta = 10_000.0f32;
        g.rope_store(
            qd.ptr(),
            stride,
            pd.ptr(),
            sd.ptr(),
            kd.ptr(),
            vd.ptr(),
            n,
            &geom,
            &tpslab_kernels::cuda::RopeSpec::plain(hd, theta, neox),
        )
        .unwrap();
        let out = g.alloc(n * hidden * 4).unwrap();
        let out_wide = g.alloc(n * hidden * 4).unwrap();
        g.memset(out.ptr(), 0xff, n * hidden * 4).unwrap();
        g.memset(out_wide.ptr(), 0xff, n * hidden * 4).unwrap();
        let io = |out: u64| AttnIo {
            qkv: qd.ptr(),
            stride,
            kc: kd.ptr(),
            vc: vd.ptr(),
            pos: pd.ptr(),
            bt_off: od.ptr(),
            bt: bd.ptr(),
            out,
            n,
        };
        g.paged_attention_with(false, &io(out.ptr()), &geom)
            .unwrap();
        g.paged_attention_with(true, &io(out_wide.ptr()), &geom)
            .unwrap();

        // Reference: rope in f32 as the CPU engine does, then store, then attention in f64.
        let mut q_ref = qkv.clone();
        let half = hd / 2;
        let scale = theta.powf(-2.0 / hd as f32);
        for (i, &(_, p)) in toks.iter().enumerate() {
            let row = &mut q_ref[i * stride..(i + 1) * stride];
            let mut th = p as f32;
            let (mut cs, mut sn) = (vec![0f32; half], vec![0f32; half]);
            for j in 0..half {
                cs[j] = th.cos();
                sn[j] = th.sin();
                th *= scale;
            }
            for head in row[..hidden + kv_dim].chunks_exact_mut(hd) {
                for j in 0..half {
                    let (a, b) = if neox {
                        (j, j + half)
                    } else {
                        (2 * j, 2 * j + 1)
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cs[j] - x1 * sn[j];
                    head[b] = x0 * sn[j] + x1 * cs[j];
                }
            }
            let s = slots[i] as usize;
            for e in 0..kv_dim {
                kc[s * kv_dim + e] = f16::from_f32(row[hidden + e]);
                vc[s * kv_dim + e] = f16::from_f32(row[hidden + kv_dim + e]);
            }
        }
        let mut kc_got = vec![f16::ZERO; kc.len()];
        g.dtoh(kd.ptr(), &mut kc_got).unwrap();
        let bad = kc
            .iter()
            .zip(&kc_got)
            .filter(|(a, b)| (a.to_f32() - b.to_f32()).abs() > 2e-3)
            .count();
        assert_eq!(
            bad, 0,
            "K cache after rope_store differs in {bad} values (hd {hd})"
        );
        let mut want = vec![0f64; n * hidden];
        let group = n_heads / n_kv_heads;
        for (i, &(s, p)) in toks.iter().enumerate() {
            for h in 0..n_heads {
                let kvh = h / group;
                let q = &q_ref[i * stride + h * hd..][..hd];
                let scores: Vec<f64> = (0..=p)
                    .map(|j| {
                        let k = &kc[slot(s, j) * kv_dim + kvh * hd..][..hd];
                        q.iter()
                            .zip(k)
                            .map(|(&a, b)| a as f64 * b.to_f64())
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let m = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..hd {
                    want[i * hidden + h * hd + d] = (0..=p)
                        .map(|j| e[j] / z * vc[slot(s, j) * kv_dim + kvh * hd + d].to_f64())
                        .sum();
                }
            }
        }
        for (name, buf) in [("lanes over keys", &out), ("wide", &out_wide)] {
            let err = rel_err(&download(&g, buf.ptr(), n * hidden), &want);
            assert!(
                err < 1e-3,
                "{name}: heads {n_heads}/{n_kv_heads} hd {hd}: rel err {err:e}"
            );
        }
    }
}

#[test]
fn no_driver_is_an_error_not_a_panic() {
    // On a machine with a GPU this opens it; on one without, it must say why.
    match tpslab_kernels::cuda::probe() {
        Ok(n) => assert!(n > 0),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
}

/// Without a GPU: the types whose CUDA kernels have not run on a GPU (Q5_K, Q5_0, Q5_1, Q2_K,
/// Q3_K, IQ4_NL, IQ4_XS, MXFP4) are refused by name before any launch, and every type's id is its place in
/// `WType::ALL` (the kernel tables are indexed by it).
#[test]
fn types_without_kernels_are_refused_by_name_and_ids_index_the_tables() {
    for (i, ty) in WType::ALL.into_iter().enumerate() {
        assert_eq!(tpslab_kernels::cuda::wtype_id(ty), i as i32, "{ty}");
    }
    for ty in [
        WType::Q5K,
        WType::Q5_0,
        WType::Q5_1,
        WType::Q2K,
        WType::Q3K,
        WType::IQ4NL,
        WType::IQ4XS,
        WType::MXFP4,
    ] {
        assert!(!has_kernel(ty));
        assert_eq!(Feature::Type(ty).support(), Support::Untried, "{ty}");
        let e = tpslab_kernels::cuda::check_type(ty).expect_err("untried");
        assert!(
            e.to_string().starts_with(&format!(
                "{ty} has a CUDA kernel that has not run on a GPU yet"
            )),
            "{e}"
        );
    }
    assert!(has_kernel(WType::Q4K) && has_kernel(WType::Q6K) && has_kernel(WType::Q4_1));
}

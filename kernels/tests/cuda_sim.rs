//! The CUDA kernels, run on the CPU by the simulator in `kernels/cuda/sim` (each thread an OS
//! thread, warp shuffles and tensor-core fragments emulated lane by lane, built with
//! AddressSanitizer and UBSan), against the same f64 references as `tests/cuda.rs` uses on a GPU.
//! This catches wrong indexing, unpacking and reductions, and out-of-bounds or misaligned loads,
//! on every machine; speed, and anything the hardware does differently, wait for
//! `tests/gpu/gpu-check.sh`. Launch shapes are those of `tpslab_kernels::cuda`.

#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used)]

mod common;

use common::sim::{A, Job};
use common::{dequantized, random_vec, random_weights, rng};
use half::f16;
use tpslab_kernels::cuda::wtype_id;
use tpslab_kernels::{QMatrix, WType};

fn rel_err(got: &[f32], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len());
    let (mut num, mut den) = (0f64, 0f64);
    for (g, w) in got.iter().zip(want) {
        let g = *g as f64;
        num += if g.is_finite() {
            (g - w) * (g - w)
        } else {
            f64::INFINITY
        };
        den += w * w;
    }
    (num / den.max(1e-30)).sqrt()
}

/// `y[r][c] = x[r] . W[c]` in f64 over `x` given element by element.
fn reference(x: &dyn Fn(usize) -> f64, wf: &[f32], m: usize, n: usize, k: usize) -> Vec<f64> {
    (0..m * n)
        .map(|i| {
            let (r, c) = (i / n, i % n);
            (0..k).map(|e| x(r * k + e) * wf[c * k + e] as f64).sum()
        })
        .collect()
}

/// The activations as `quantize_q8` (mmvq.cu) leaves them, back as q * d: per 32 values
/// d = amax / 127 and q = round-half-even(x * (127 / amax)) in f32.
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

/// The kernel of a family for `rows` activation rows (1, 2, 4, 8), as `Gpu::by_rows` picks it.
fn by_rows(family: &str, ty: WType, rows: usize) -> String {
    let m = match rows {
        1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    };
    format!("{family}_{}_{m}", ty.name().to_ascii_lowercase())
}

const MMV_TYPES: [WType; 8] = [
    WType::F32,
    WType::F16,
    WType::BF16,
    WType::Q4_0,
    WType::Q4_1,
    WType::Q8_0,
    WType::Q4K,
    WType::Q6K,
];

/// matvec.cu: f32 activations, up to 8 rows a launch, one warp per weight row.
#[test]
fn matvec_kernels_every_type_and_row_count() {
    let mut r = rng(0x5eed_0c0d);
    let (n, k) = (37, 512);
    for ty in MMV_TYPES {
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix { ty, n, k, data: &w });
        for m in [1, 3, 8] {
            let x = random_vec(&mut r, m * k, 0.5);
            let mut job = Job::new();
            let (wb, xb, yb) = (job.buf(&w), job.floats(&x), job.out(m * n * 4));
            let args = [
                A::P(wb, 0),
                A::L(ty.row_bytes(k) as i64),
                A::P(xb, 0),
                A::P(yb, 0),
                A::I(n as i32),
                A::I(k as i32),
                A::I(m as i32),
                A::I(n as i32),
            ];
            job.launch(
                &by_rows("mmv", ty, m),
                (n.div_ceil(4) as u32, 1),
                128,
                &args,
            );
            let got = job.run().floats(yb);
            let err = rel_err(&got, &reference(&|i| x[i] as f64, &wf, m, n, k));
            assert!(err < 1e-5, "{ty:?} m={m}: rel err {err:e}");
        }
    }
}

/// matvec.cu's wide-load F16/BF16 kernels for one activation row, at a length that takes both
/// their four-load loop and its remainder.
#[test]
fn wide_load_dense_kernels_for_one_row() {
    let mut r = rng(0x5eed_0f16);
    let (n, k) = (21, 1544);
    for ty in [WType::F16, WType::BF16] {
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix { ty, n, k, data: &w });
        let x = random_vec(&mut r, k, 0.5);
        let mut job = Job::new();
        let (wb, xb, yb) = (job.buf(&w), job.floats(&x), job.out(n * 4));
        let name = format!("mmv_{}_wide", ty.name().to_ascii_lowercase());
        let args = [
            A::P(wb, 0),
            A::L(ty.row_bytes(k) as i64),
            A::P(xb, 0),
            A::P(yb, 0),
            A::I(n as i32),
            A::I(k as i32),
        ];
        job.launch(&name, (n.div_ceil(4) as u32, 1), 128, &args);
        let got = job.run().floats(yb);
        let err = rel_err(&got, &reference(&|i| x[i] as f64, &wf, 1, n, k));
        assert!(err < 1e-5, "{ty:?}: rel err {err:e}");
    }
}

/// Every quantized type: mmvq.cu has a kernel for each.
fn quant_types() -> impl Iterator<Item = WType> {
    WType::ALL
        .into_iter()
        .filter(|t| !matches!(t, WType::F32 | WType::F16 | WType::BF16))
}

/// A row length for `ty`: 512, and for the 32-element block types also one that is not a
/// multiple of 256 (SmolLM2's 576 is one).
fn lengths(ty: WType) -> Vec<usize> {
    if ty.block_size() == 32 {
        vec![512, 96]
    } else {
        vec![512]
    }
}

/// mmvq.cu: `quantize_q8` of the activations, then the integer-dot kernels, against a reference
/// fed the same 8-bit activations.
#[test]
fn mmvq_kernels_every_type_over_8bit_activations() {
    let mut r = rng(0x5eed_0008);
    let n = 37;
    for (ty, k) in quant_types().flat_map(|t| lengths(t).into_iter().map(move |k| (t, k))) {
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix { ty, n, k, data: &w });
        for m in [1, 2, 5, 8] {
            let x = random_vec(&mut r, m * k, 0.5);
            let blocks = m * k / 32;
            let mut job = Job::new();
            let (wb, xb, yb) = (job.buf(&w), job.floats(&x), job.out(m * n * 4));
            let (qb, db) = (job.out(m * k), job.out(blocks * 4));
            job.launch(
                "quantize_q8",
                (blocks.div_ceil(8) as u32, 1),
                256,
                &[A::P(xb, 0), A::P(qb, 0), A::P(db, 0), A::L(blocks as i64)],
            );
            let args = [
                A::P(wb, 0),
                A::L(ty.row_bytes(k) as i64),
                A::P(qb, 0),
                A::P(db, 0),
                A::P(yb, 0),
                A::I(n as i32),
                A::I(k as i32),
                A::I(m as i32),
                A::I(n as i32),
            ];
            job.launch(
                &by_rows("mmvq", ty, m),
                (n.div_ceil(4) as u32, 1),
                128,
                &args,
            );
            let got = job.run().floats(yb);
            let xq = q8_round(&x);
            let err = rel_err(&got, &reference(&|i| xq[i], &wf, m, n, k));
            assert!(err < 1e-5, "{ty:?} m={m}: rel err {err:e}");
        }
    }
}

/// elementwise.cu's `embed_rows` (any type, element by element) and `dequant_f16` (a 32-element
/// group a thread, for cuBLAS) against `dequantize_row`.
#[test]
fn embedding_rows_and_f16_dequantization_of_every_type() {
    let mut r = rng(0x5eed_00e6);
    for ty in WType::ALL {
        let (n, k) = (9, lengths(ty)[lengths(ty).len() - 1]);
        let w = random_weights(&mut r, ty, n, k);
        let wf = dequantized(&QMatrix { ty, n, k, data: &w });
        let tokens = [3, 0, 8, 3];
        let groups = n * k / 32;
        let mut job = Job::new();
        let (wb, tb) = (job.buf(&w), job.ints(&tokens));
        let (eb, hb) = (job.out(tokens.len() * k * 4), job.out(n * k * 2));
        let rb = ty.row_bytes(k) as i64;
        let id = wtype_id(ty);
        job.launch(
            "embed_rows",
            (tokens.len() as u32, 1),
            256,
            &[
                A::P(wb, 0),
                A::I(id),
                A::I(k as i32),
                A::L(rb),
                A::P(tb, 0),
                A::P(eb, 0),
            ],
        );
        if ty.block_size() > 1 {
            job.launch(
                "dequant_f16",
                (groups.div_ceil(256) as u32, 1),
                256,
                &[
                    A::P(wb, 0),
                    A::I(id),
                    A::I(k as i32),
                    A::L(rb),
                    A::L(groups as i64),
                    A::P(hb, 0),
                ],
            );
        }
        let out = job.run();
        let rows: Vec<f32> = tokens
            .iter()
            .flat_map(|&t| wf[t as usize * k..(t as usize + 1) * k].to_vec())
            .collect();
        assert_eq!(out.floats(eb), rows, "{ty:?}: embedding rows");
        if ty.block_size() > 1 {
            let got: Vec<f32> = out
                .bytes(hb)
                .chunks_exact(2)
                .map(|c| f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect();
            let want: Vec<f32> = wf.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
            assert_eq!(got, want, "{ty:?}: f16 dequantization");
        }
    }
}

/// mmq.cu: weights decoded to f16 tiles in shared memory times f16 activations on the
/// (emulated) tensor cores, against f16-rounded weights and activations summed in f64, for
/// both tile heights, row counts that leave partial tiles, and a weight row count that is not a
/// multiple of 64.
#[test]
fn mmq_tensor_core_kernels_every_type() {
    let mut r = rng(0x5eed_0a11);
    let n = 70;
    let h = |v: f32| half::f16::from_f32(v).to_f32() as f64;
    for ty in quant_types() {
        let k = lengths(ty)[lengths(ty).len() - 1].min(256);
        let k = if ty.block_size() == 256 { 256 } else { k };
        let w = random_weights(&mut r, ty, n, k);
        let wf: Vec<f32> = dequantized(&QMatrix { ty, n, k, data: &w })
            .iter()
            .map(|&v| h(v) as f32)
            .collect();
        for (m, bm) in [(9, 32), (40, 32), (71, 64)] {
            let x = random_vec(&mut r, m * k, 0.5);
            let mut job = Job::new();
            let (wb, xb, yb) = (job.buf(&w), job.floats(&x), job.out(m * n * 4));
            let args = [
                A::P(wb, 0),
                A::L(ty.row_bytes(k) as i64),
                A::P(xb, 0),
                A::P(yb, 0),
                A::I(n as i32),
                A::I(k as i32),
                A::I(m as i32),
                A::I(n as i32),
            ];
            let name = format!("mmq_{}_{bm}", ty.name().to_ascii_lowercase());
            job.launch(
                &name,
                (n.div_ceil(64) as u32, m.div_ceil(bm) as u32),
                128,
                &args,
            );
            let got = job.run().floats(yb);
            let err = rel_err(&got, &reference(&|i| h(x[i]), &wf, m, n, k));
            assert!(err < 1e-5, "{ty:?} m={m} tile {bm}: rel err {err:e}");
        }
    }
}

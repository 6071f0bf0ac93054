//! The CUDA kernels, run on the CPU by the simulator in `kernels/cuda/sim` (each thread an OS
//! thread, warp shuffles and tensor-core fragments emulated lane by lane, built with
//! AddressSanitizer and UBSan), against the same f64 references as `tests/cuda.rs` uses on a GPU.
//! This catches wrong indexing, unpacking and reductions, and out-of-bounds or misaligned loads,
//! on every machine; speed, and anything the hardware does differently, wait for
//! `tests/gpu/gpu-check.sh`. Launch shapes are those of `tpslab_kernels::cuda`.

#![allow(clippy::unwrap_used)]

mod common;

use common::sim::{A, Job};
use common::{dequantized, random_vec, random_weights, rng};
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

/// Every type mmvq.cu has a kernel for.
const MMVQ_TYPES: [WType; 3] = [WType::Q4K, WType::Q5K, WType::Q6K];

/// mmvq.cu: `quantize_q8` of the activations, then the integer-dot kernels, against a reference
/// fed the same 8-bit activations.
#[test]
fn mmvq_kernels_every_type_over_8bit_activations() {
    let mut r = rng(0x5eed_0008);
    let (n, k) = (37, 512);
    for ty in MMVQ_TYPES {
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

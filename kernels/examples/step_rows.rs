//! One decode step's matmuls of SmolLM2-135M (30 layers of its 7 Q4_1 matrices, distinct
//! weights so they stream from memory as the real model's do) at 1 to 16 activation rows: the
//! step time per row count shows where batching stops being nearly free. Prints a markdown
//! table; `TPSLAB_BENCH_THREADS` sets the threads (default 2), `TPSLAB_CPU_KERNELS` the path,
//! `TPSLAB_ROWS` the largest row count (default 16), `TPSLAB_ROWS_FROM` the smallest (1).
//!
//! `cargo run --release -p tpslab-kernels --example step_rows`

use std::time::Instant;

use tpslab_kernels::{Backend, QMatrix, ThreadPool, WType, matmul};

#[path = "../benches/common/smollm2_shape.rs"]
mod smollm2_shape;
use smollm2_shape::{LAYER, LAYERS};

fn main() {
    let threads = std::env::var("TPSLAB_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let pool = ThreadPool::new(threads);
    let ty = WType::Q4_1;
    let mut seed = 0x2545_f491_4f6c_dd1d_u64;
    let mut byte = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed as u8
    };
    // TPSLAB_LAYERS=1: one layer's weights (cache-resident), to tell compute from memory.
    let layers = std::env::var("TPSLAB_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(LAYERS);
    let mats: Vec<(usize, usize, Vec<u8>)> = (0..layers)
        .flat_map(|_| LAYER)
        .map(|(n, k)| {
            let mut v: Vec<u8> = (0..n * ty.row_bytes(k)).map(|_| byte()).collect();
            for b in v.chunks_exact_mut(ty.type_size()) {
                b[0..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                b[2..4].copy_from_slice(&half::f16::from_f32(-0.07).to_le_bytes());
            }
            (n, k, v)
        })
        .collect();
    let bytes: usize = mats.iter().map(|m| m.2.len()).sum();
    println!(
        "{} kernels, {threads} threads, {} matrices, {:.1} MB of Q4_1 weights",
        Backend::detect().name(),
        mats.len(),
        bytes as f64 / 1e6
    );
    println!("| rows | step ms (median) | best | ms per row | rows/s |");
    println!("|---|---|---|---|---|");
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    for m in env("TPSLAB_ROWS_FROM", 1)..=env("TPSLAB_ROWS", 16) {
        let x: Vec<f32> = (0..m * 1536)
            .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
            .collect();
        let mut y = vec![0f32; m * 1536];
        let mut times = Vec::new();
        for _ in 0..env("TPSLAB_REPS", 15) {
            let t = Instant::now();
            for (n, k, data) in mats.iter().cycle().take(LAYERS * LAYER.len()) {
                let w = QMatrix {
                    ty,
                    n: *n,
                    k: *k,
                    data,
                    layout: tpslab_kernels::Layout::Ggml,
                };
                matmul(&pool, &w, &x[..m * k], m, &mut y[..m * n]);
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        times.sort_by(f64::total_cmp);
        let ms = times[times.len() / 2];
        println!(
            "| {m} | {ms:.2} | {:.2} | {:.2} | {:.0} |",
            times[0],
            ms / m as f64,
            m as f64 / ms * 1e3
        );
    }
}

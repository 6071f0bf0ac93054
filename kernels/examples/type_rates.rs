//! The matmul rate of every weight type on one Llama-3.2-1B layer (fused Q/K/V 3072x2048, output
//! 2048x2048, fused gate/up 16384x2048, down 2048x8192: 60.8 M multiply-adds a row, every k a
//! whole number of 256-element blocks), at a prefill batch and at decode. Prints a markdown
//! table of GMAC/s (the integer or float multiply-adds a second) and of weight GB/s (bytes of
//! weights streamed a second), the two limits a kernel runs into: the CPU's dot rate when many
//! rows share each weight tile, memory bandwidth at one row.
//!
//! `TPSLAB_BENCH_THREADS` sets the threads (default 2), `TPSLAB_CPU_KERNELS` the path,
//! `TPSLAB_ROWS` the row counts (default `1,128`), `TPSLAB_TYPES` the types (default all, by
//! name as `--precision` takes them), `TPSLAB_REPS` the timed runs per cell (default 5),
//! `TPSLAB_LAYERS` the distinct copies of the layer streamed per run (default 4: past a 32 MiB
//! last-level cache for every type, so one row measures memory, not the cache). The read
//! bandwidth of the same pool is measured first ([`membw`]) and each row's weight GB/s is also
//! given as its share of it. `TPSLAB_LAYOUT=ggml` keeps every matrix in ggml rows; by default
//! the types with a packed layout are packed ([`packed::fields`]).
//!
//! `cargo run --release -p tpslab-kernels --example type_rates`

use std::time::Instant;

use tpslab_kernels::{
    Backend, Layout, QMatrix, ThreadPool, WType, matmul, membw, packed, quantize::quantize,
};

/// One Llama-3.2-1B layer's matrices as the engine runs them (n outputs, k inputs).
const LAYER: [(usize, usize); 4] = [(3072, 2048), (2048, 2048), (16384, 2048), (2048, 8192)];

/// Distinct quantized rows per matrix, repeated to fill it (the bytes differ in place, so every
/// row still streams from memory; only the quantizer's time is saved).
const DISTINCT_ROWS: usize = 64;

fn env_list(name: &str) -> Option<Vec<String>> {
    std::env::var(name)
        .ok()
        .map(|v| v.split(',').map(|s| s.trim().to_string()).collect())
}

fn main() {
    let threads = std::env::var("TPSLAB_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2);
    let reps: usize = std::env::var("TPSLAB_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let rows: Vec<usize> = env_list("TPSLAB_ROWS")
        .map(|v| v.iter().filter_map(|s| s.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 128]);
    let types: Vec<WType> = match env_list("TPSLAB_TYPES") {
        Some(names) => names
            .iter()
            .map(|n| n.parse().unwrap_or_else(|e| panic!("TPSLAB_TYPES: {e}")))
            .collect(),
        None => WType::ALL.to_vec(),
    };
    let layers: usize = std::env::var("TPSLAB_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(4)
        .max(1);
    let pool = ThreadPool::new(threads);
    let bw = membw::read_bandwidth(&pool, membw::DEFAULT_BYTES, 16);
    let macs_per_row: usize = LAYER.iter().map(|(n, k)| n * k).sum();
    println!(
        "{} kernels, {threads} threads, {layers} copies of a Llama-3.2-1B layer ({:.1} M MACs a \
         row each), best of {reps}; read bandwidth {bw:.1} GB/s (best of 16 passes)",
        Backend::detect().name(),
        macs_per_row as f64 / 1e6
    );
    println!(
        "| type | layout | weights MB | rows | best ms | GMAC/s | weight GB/s | of read bandwidth |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    let max_rows = rows.iter().copied().max().unwrap_or(1);
    let x: Vec<f32> = (0..max_rows * 8192)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect();
    let mut y = vec![0f32; max_rows * 16384];
    for ty in types {
        let mats: Vec<(usize, usize, Vec<u8>)> = LAYER
            .iter()
            .map(|&(n, k)| {
                let f: Vec<f32> = (0..DISTINCT_ROWS * k)
                    .map(|i| (((i * 2_654_435_761) >> 7) % 2001) as f32 * 1e-3 - 1.0)
                    .collect();
                let some = quantize(ty, &f);
                let data = some.repeat(n / DISTINCT_ROWS);
                (n, k, data)
            })
            .collect();
        let ggml_only = std::env::var("TPSLAB_LAYOUT").is_ok_and(|v| v == "ggml");
        let layout = if ggml_only || packed::fields(ty).is_none() {
            Layout::Ggml
        } else {
            Layout::Rows8
        };
        let mats: Vec<(usize, usize, Vec<u8>)> = (0..layers)
            .flat_map(|_| mats.iter().cloned())
            .map(|(n, k, d)| match layout {
                Layout::Ggml => (n, k, d),
                Layout::Rows8 => (n, k, packed::pack(ty, n, k, &d)),
            })
            .collect();
        let bytes: usize = mats.iter().map(|m| m.2.len()).sum();
        for &m in &rows {
            let mut best = f64::INFINITY;
            for _ in 0..reps + 1 {
                let t = Instant::now();
                for (n, k, data) in &mats {
                    let w = QMatrix {
                        ty,
                        n: *n,
                        k: *k,
                        data,
                        layout,
                    };
                    matmul(&pool, &w, &x[..m * k], m, &mut y[..m * n]);
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            let gbs = bytes as f64 / best / 1e9;
            println!(
                "| {ty} | {layout:?} | {:.1} | {m} | {:.2} | {:.1} | {gbs:.1} | {:.0}% |",
                bytes as f64 / 1e6,
                best * 1e3,
                (layers * m * macs_per_row) as f64 / best / 1e9,
                100.0 * gbs / bw
            );
        }
    }
}

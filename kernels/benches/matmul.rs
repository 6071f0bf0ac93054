//! Matmul throughput on SmolLM2-135M's shapes (Q4_1 layers, Q8_0 tied lm_head) at decode (m=1)
//! and prompt (m=128) sizes, 2 threads by default; throughput is in flops (2 * m * n * k per call). Also the
//! whole model's matmuls for one step (30 layers of 7 matrices + lm_head, distinct weights so
//! decode reads ~96 MB like the real model), the naive reference kernel for comparison, and the
//! K-quants (Q4_K, Q5_K, Q6_K) on a 2048 x 2048 matrix, AVX2 against portable.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use tpslab_kernels::{Backend, QMatrix, ThreadPool, WType, matmul, matmul_with, reference_matmul};

#[path = "common/smollm2_shape.rs"]
mod smollm2_shape;
use smollm2_shape::LAYER;
const VOCAB: usize = 49152;

/// Random but valid blocks: f16 scales/mins of sensible size, random quants.
fn weights(ty: WType, n: usize, k: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let bytes = n * ty.row_bytes(k);
    let ts = ty.type_size();
    let mut v: Vec<u8> = (0..bytes).map(|_| next() as u8).collect();
    for blk in v.chunks_exact_mut(ts) {
        let d = if ty == WType::Q6K { 208 } else { 0 };
        blk[d..d + 2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        if matches!(ty, WType::Q4_1 | WType::Q4K | WType::Q5K) {
            blk[2..4].copy_from_slice(&half::f16::from_f32(-0.07).to_le_bytes());
        }
    }
    v
}

fn acts(len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-3)
        .collect()
}

/// Threads: `TPSLAB_BENCH_THREADS` (default 2, the target machine's cores).
fn threads() -> usize {
    std::env::var("TPSLAB_BENCH_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
}

/// The SIMD backends this CPU can run.
fn simd_paths() -> Vec<Backend> {
    Backend::ALL
        .into_iter()
        .filter(|b| *b != Backend::Portable && b.is_available())
        .collect()
}

fn shapes(c: &mut Criterion) {
    let pool = ThreadPool::new(threads());
    let mut g = c.benchmark_group(format!("matmul_{}t", threads()));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let cases = [
        (WType::Q4_1, 576, 576),
        (WType::Q4_1, 192, 576),
        (WType::Q4_1, 1536, 576),
        (WType::Q4_1, 576, 1536),
        (WType::Q8_0, VOCAB, 576),
    ];
    for (ty, n, k) in cases {
        let data = weights(ty, n, k, n as u64 * 31 + k as u64);
        let w = QMatrix {
            ty,
            n,
            k,
            data: &data,
            layout: tpslab_kernels::Layout::Ggml,
        };
        for m in [1usize, 128] {
            let x = acts(m * k);
            let mut y = vec![0f32; m * n];
            g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            let id = format!("{ty:?}_n{n}_k{k}_m{m}");
            g.bench_function(BenchmarkId::new("fast", &id), |b| {
                b.iter(|| matmul(&pool, &w, black_box(&x), m, &mut y))
            });
            // Every SIMD path this CPU has, same binary (new integer dots against AVX2).
            for backend in simd_paths() {
                g.bench_function(BenchmarkId::new(backend.name(), &id), |b| {
                    b.iter(|| matmul_with(backend, &pool, &w, black_box(&x), m, &mut y))
                });
            }
            if n == 576 && k == 576 {
                g.bench_function(BenchmarkId::new("naive", &id), |b| {
                    b.iter(|| reference_matmul(&pool, &w, black_box(&x), m, &mut y))
                });
            }
        }
    }
    g.finish();
}

fn model_step(c: &mut Criterion) {
    let pool = ThreadPool::new(threads());
    let layers: Vec<Vec<(usize, usize, Vec<u8>)>> = (0..30)
        .map(|l| {
            LAYER
                .iter()
                .enumerate()
                .map(|(i, &(n, k))| (n, k, weights(WType::Q4_1, n, k, l * 10 + i as u64)))
                .collect()
        })
        .collect();
    let head = weights(WType::Q8_0, VOCAB, 576, 999);
    let flops_per_token: usize =
        30 * LAYER.iter().map(|(n, k)| 2 * n * k).sum::<usize>() + 2 * VOCAB * 576;
    let mut g = c.benchmark_group(format!("model_step_{}t", threads()));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    for m in [1usize, 128] {
        let x = acts(m * 1536);
        let mut y = vec![0f32; m * VOCAB];
        g.throughput(Throughput::Elements((m * flops_per_token) as u64));
        g.bench_function(BenchmarkId::new("all_matmuls", format!("m{m}")), |b| {
            b.iter(|| {
                for layer in &layers {
                    for (n, k, data) in layer {
                        let w = QMatrix {
                            ty: WType::Q4_1,
                            n: *n,
                            k: *k,
                            data,
                            layout: tpslab_kernels::Layout::Ggml,
                        };
                        matmul(&pool, &w, black_box(&x[..m * k]), m, &mut y[..m * n]);
                    }
                }
                let w = QMatrix {
                    ty: WType::Q8_0,
                    n: VOCAB,
                    k: 576,
                    data: &head,
                    layout: tpslab_kernels::Layout::Ggml,
                };
                matmul(&pool, &w, black_box(&x[..m * 576]), m, &mut y);
            })
        });
    }
    g.finish();
}

/// K-quant matmuls (Q8_K activations) on a 1B model's square projection (2048 x 2048), at
/// decode and a small batch: every backend this CPU has (portable, AVX2, AVX-VNNI, AVX-512 VNNI).
fn kquants(c: &mut Criterion) {
    let pool = ThreadPool::new(threads());
    let mut g = c.benchmark_group(format!("kquant_{}t", threads()));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    let (n, k) = (2048, 2048);
    for ty in [WType::Q4K, WType::Q5K, WType::Q6K] {
        let data = weights(ty, n, k, 77);
        let w = QMatrix {
            ty,
            n,
            k,
            data: &data,
            layout: tpslab_kernels::Layout::Ggml,
        };
        for m in [1usize, 16] {
            let x = acts(m * k);
            let mut y = vec![0f32; m * n];
            g.throughput(Throughput::Elements((2 * m * n * k) as u64));
            for backend in Backend::ALL {
                if !backend.is_available() {
                    continue;
                }
                let id = format!("{ty:?}_n{n}_k{k}_m{m}");
                g.bench_function(BenchmarkId::new(format!("{backend:?}"), &id), |b| {
                    b.iter(|| matmul_with(backend, &pool, &w, black_box(&x), m, &mut y))
                });
            }
        }
    }
    g.finish();
}

/// The cost of one `ThreadPool::run` with an empty job (dispatch + join).
fn pool_dispatch(c: &mut Criterion) {
    let pool = ThreadPool::new(threads());
    let mut g = c.benchmark_group(format!("pool_{}t", threads()));
    g.sample_size(10)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    g.bench_function("empty_run", |b| {
        b.iter(|| pool.run(&|tid, n| _ = black_box((tid, n))))
    });
    g.finish();
}

criterion_group!(benches, pool_dispatch, shapes, model_step, kquants);
criterion_main!(benches);

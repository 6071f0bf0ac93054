//! The CPU's peak integer dot-product rate: independent chains of `vpdpbusd` (AVX-512 VNNI on
//! zmm and ymm, AVX-VNNI on ymm) and of AVX2's `vpmaddubsw` + `vpmaddwd` + `vpaddd`, per core
//! and on every core at once, in int8 multiply-adds per second (one `vpdpbusd` on ymm is 32).
//! It is the ceiling the quantized kernels are measured against in BENCHMARKS.md.
//!
//! Build and run (no dependencies): `rustc -O --edition 2024 tests/bench/int_dot_peak.rs -o
//! /tmp/int_dot_peak && /tmp/int_dot_peak [threads]`.

use std::arch::x86_64::*;
use std::time::Instant;

/// Independent accumulators per loop: enough to cover the instruction's latency (5 cycles at
/// most on current cores) times its throughput (2 per cycle).
const CHAINS: usize = 12;
const ITERS: u64 = 20_000_000;

/// `CHAINS` independent `vpdpbusd` chains on ymm, compiled for `features` with `dot` (AVX-VNNI's
/// or AVX-512 VNNI's encoding of the same instruction).
macro_rules! ymm_chains {
    ($name:ident, $features:literal, $dot:ident) => {
        #[target_feature(enable = $features)]
        fn $name(iters: u64) -> i32 {
            let a = _mm256_set1_epi8(3);
            let b = _mm256_set1_epi8(-2);
            let mut acc = [_mm256_setzero_si256(); CHAINS];
            for _ in 0..iters {
                // Keeps the compiler from folding the loop: the inputs look changed each round.
                let (a, b) = std::hint::black_box((a, b));
                for c in &mut acc {
                    *c = $dot(*c, a, b);
                }
            }
            sum(&acc)
        }
    };
}

ymm_chains!(vnni_ymm, "avx2,avxvnni", _mm256_dpbusd_avx_epi32);
ymm_chains!(vnni512_ymm, "avx2,avx512f,avx512vl,avx512vnni", _mm256_dpbusd_epi32);

#[target_feature(enable = "avx2,avx512f,avx512vnni")]
fn vnni_zmm(iters: u64) -> i32 {
    let a = _mm512_set1_epi8(3);
    let b = _mm512_set1_epi8(-2);
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..iters {
        // Keeps the compiler from folding the loop: the inputs look changed each round.
        let (a, b) = std::hint::black_box((a, b));
        for c in &mut acc {
            *c = _mm512_dpbusd_epi32(*c, a, b);
        }
    }
    acc.iter().map(|v| _mm512_reduce_add_epi32(*v)).sum()
}

#[target_feature(enable = "avx2")]
fn maddubs_ymm(iters: u64) -> i32 {
    let a = _mm256_set1_epi8(3);
    let b = _mm256_set1_epi8(-2);
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    for _ in 0..iters {
        // Keeps the compiler from folding the loop: the inputs look changed each round.
        let (a, b) = std::hint::black_box((a, b));
        for c in &mut acc {
            // The accumulator is the unsigned operand, so no two chains compute the same
            // product (the compiler would share it) and each one is a real dependency chain.
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_xor_si256(*c, a), b), ones);
            *c = _mm256_add_epi32(*c, p);
        }
    }
    sum(&acc)
}

#[target_feature(enable = "avx2")]
fn sum(acc: &[__m256i]) -> i32 {
    let mut out = [0i32; 8];
    let mut t = _mm256_setzero_si256();
    for v in acc {
        t = _mm256_add_epi32(t, *v);
    }
    // SAFETY: `out` is 8 i32 = 32 bytes.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), t) };
    out.iter().sum()
}

/// Runs `f` on `threads` threads at once; returns int8 MACs per second over all of them.
fn rate(threads: usize, macs_per_op: u64, f: fn(u64) -> i32) -> f64 {
    let t0 = Instant::now();
    let hs: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || std::hint::black_box(f(ITERS))))
        .collect();
    for h in hs {
        let _ = h.join();
    }
    let ops = ITERS * CHAINS as u64 * threads as u64;
    (ops * macs_per_op) as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    println!("# int8 multiply-adds per second (GMAC/s), best of 3; threads: 1 and {threads}");
    let mut rows: Vec<(&str, u64, fn(u64) -> i32)> = Vec::new();
    // SAFETY (each closure): called only after the feature check on the same line.
    if is_x86_feature_detected!("avx2") {
        rows.push(("avx2 vpmaddubsw+vpmaddwd ymm", 32, |n| unsafe { maddubs_ymm(n) }));
    }
    if is_x86_feature_detected!("avxvnni") {
        rows.push(("avx-vnni vpdpbusd ymm", 32, |n| unsafe { vnni_ymm(n) }));
    }
    if is_x86_feature_detected!("avx512vnni") {
        rows.push(("avx512-vnni vpdpbusd zmm", 64, |n| unsafe { vnni_zmm(n) }));
        rows.push(("avx512-vnni vpdpbusd ymm", 32, |n| unsafe { vnni512_ymm(n) }));
    }
    for (name, macs, f) in rows {
        let best = |t: usize| (0..3).map(|_| rate(t, macs, f)).fold(0.0, f64::max) / 1e9;
        println!(
            "{name:32} 1 thread {:8.1}   {threads} threads {:8.1}",
            best(1),
            best(threads)
        );
    }
}

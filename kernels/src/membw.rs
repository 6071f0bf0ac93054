//! The memory read bandwidth of this machine, measured: every thread of a pool sums its share of
//! a buffer larger than any cache, best of a few passes. Decode of a model larger than the cache
//! streams its weights once a token, so this is the limit its speed is stated against
//! (`tpslab bench --tg` prints decode's share of it).

use std::time::Instant;

use crate::pool::ThreadPool;

/// Bytes read per pass by default: 1 GiB, past the largest last-level caches of this machine kind
/// (a 300 MB L3).
pub const DEFAULT_BYTES: usize = 1 << 30;

/// Sums `words` with four independent accumulators (the loop vectorizes; the sum only keeps
/// the reads from being optimized away).
fn sum(words: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let mut chunks = words.chunks_exact(4);
    for c in chunks.by_ref() {
        for (a, &w) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(w);
        }
    }
    let tail = chunks
        .remainder()
        .iter()
        .fold(0u64, |a, &w| a.wrapping_add(w));
    acc.iter().fold(tail, |a, &w| a.wrapping_add(w))
}

/// Between two passes: a shared host's memory is busier at some moments than others (here the
/// same probe read 35 GB/s one second and 60 the next), so the passes are spread over a while
/// and the best is the machine's rate.
const PAUSE: std::time::Duration = std::time::Duration::from_millis(100);

/// The best read rate, in GB/s (10^9 bytes a second), of `passes` passes over `bytes` bytes
/// split across `pool`'s threads, 100 ms apart (`PAUSE`). The buffer is written once first, so its
/// pages exist.
pub fn read_bandwidth(pool: &ThreadPool, bytes: usize, passes: usize) -> f64 {
    let words = vec![1u64; (bytes / 8).max(1)];
    let n = words.len();
    let mut best = f64::INFINITY;
    for pass in 0..passes.max(1) {
        if pass > 0 {
            std::thread::sleep(PAUSE);
        }
        let t = Instant::now();
        pool.run(&|tid, nth| {
            let (lo, hi) = (n * tid / nth, n * (tid + 1) / nth);
            std::hint::black_box(sum(std::hint::black_box(&words[lo..hi])));
        });
        best = best.min(t.elapsed().as_secs_f64());
    }
    (n * 8) as f64 / best / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_reads_every_word() {
        let w: Vec<u64> = (1..=11).collect();
        assert_eq!(sum(&w), 66);
        assert_eq!(sum(&[]), 0);
    }

    #[test]
    fn a_measured_rate_is_finite_and_positive() {
        let bw = read_bandwidth(&ThreadPool::new(2), 1 << 20, 2);
        assert!(bw.is_finite() && bw > 0.0, "{bw}");
    }
}

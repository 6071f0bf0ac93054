//! Gated linear units over rows: `out = act(gate) * up` for rows of `gu` = `[gate | up]`, split
//! over the pool's threads ([`gated_rows`]); the activations' formulas are the engine's
//! (`device::rowops`). Every output depends on its own two inputs only, so the split never
//! changes a value.
//!
//! SwiGLU's exp is the C library's. ggml's vectorized exp (`ggml_v_expf`, within 1.5 ulp) was tried.
//! It cut the gating's time by a further ~3% of a 1B prefill. But it moved the default model's
//! greedy tokens off llama.cpp's recorded ones on a near-tie (93 of 96 teacher-forced steps
//! agreed, where 94 are required). It also changed which n-gram proposals a seeded sampled run
//! accepts.

use crate::SendPtr;
use crate::pool::ThreadPool;

/// One piece of a row: its gate, its up and its outputs, all the same length.
pub type Piece = dyn Fn(&[f32], &[f32], &mut [f32]) + Sync;

/// Below this many outputs a gating runs on the calling thread (a pool hand-off costs more).
const PARALLEL_MIN: usize = 1 << 15;

/// `out[r][c] = f(gate, up, out)` for each row `r` of `gu` (`ffn` gate floats, then `ffn` up
/// floats), split over `pool` by contiguous ranges of outputs: `f` gets equal-length pieces of
/// one row's gate, up and output.
pub fn gated_rows(pool: &ThreadPool, gu: &[f32], ffn: usize, out: &mut [f32], f: &Piece) {
    let rows = out.len() / ffn.max(1);
    assert!(ffn > 0 && gu.len() >= rows * 2 * ffn && out.len() == rows * ffn);
    let total = out.len();
    if total < PARALLEL_MIN || pool.n_threads() == 1 {
        piece(gu, ffn, out, 0, f);
        return;
    }
    let dst = SendPtr(out.as_mut_ptr());
    pool.run(&|tid, nth| {
        let (start, end) = (total * tid / nth, total * (tid + 1) / nth);
        // SAFETY: the threads' ranges `start..end` are disjoint and inside `out`, which outlives
        // the pool's run.
        let mine = unsafe { std::slice::from_raw_parts_mut(dst.get().add(start), end - start) };
        piece(gu, ffn, mine, start, f);
    });
}

/// The outputs `start..start + out.len()` of [`gated_rows`], row piece by row piece.
fn piece(gu: &[f32], ffn: usize, out: &mut [f32], start: usize, f: &Piece) {
    let mut at = start;
    let mut rest = out;
    while !rest.is_empty() {
        let (row, col) = (at / ffn, at % ffn);
        let len = (ffn - col).min(rest.len());
        let (o, tail) = rest.split_at_mut(len);
        let g = &gu[row * 2 * ffn + col..][..len];
        let u = &gu[row * 2 * ffn + ffn + col..][..len];
        f(g, u, o);
        at += len;
        rest = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SwiGLU's piece: `silu(g) * u`.
    fn silu_mul(g: &[f32], u: &[f32], o: &mut [f32]) {
        for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
            *o = silu(g) * u;
        }
    }

    fn silu(x: f32) -> f32 {
        x / (1.0 + (-x).exp())
    }

    fn swiglu(pool: &ThreadPool, gu: &[f32], ffn: usize, out: &mut [f32]) {
        gated_rows(pool, gu, ffn, out, &silu_mul);
    }

    /// The split over threads changes nothing: a 3-thread pool over rows longer and shorter
    /// than a thread's share gives the one-thread bits.
    #[test]
    fn any_split_gives_the_same_rows() {
        let (rows, ffn) = (5, 9001);
        let gu: Vec<f32> = (0..rows * 2 * ffn)
            .map(|i| ((i * 7919) % 2001) as f32 * 0.01 - 10.0)
            .collect();
        let mut one = vec![0f32; rows * ffn];
        swiglu(&ThreadPool::new(1), &gu, ffn, &mut one);
        let mut three = vec![f32::NAN; rows * ffn];
        swiglu(&ThreadPool::new(3), &gu, ffn, &mut three);
        assert!(
            one.iter()
                .zip(&three)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        for (r, row) in one.chunks_exact(ffn).enumerate() {
            for c in [0, 1, ffn / 2, ffn - 1] {
                let (g, u) = (gu[r * 2 * ffn + c], gu[r * 2 * ffn + ffn + c]);
                assert_eq!(row[c].to_bits(), (silu(g) * u).to_bits(), "row {r} col {c}");
            }
        }
    }
}

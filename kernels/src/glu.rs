//! Gated linear units over rows: `out = act(gate) * up` for rows of `gu` = `[gate | up]`, split
//! over the pool's threads ([`gated_rows`]), and SwiGLU's `silu(gate) * up` ([`silu_mul`]) with
//! ggml's vectorized exp (`ggml_v_expf` as its AVX2 path writes it, from Arm's optimized
//! routines: at most 1.5 ulp off). The 8-lane AVX2 loop and the one-lane form that covers tails
//! and CPUs without AVX2/FMA are the same IEEE operations, so a value never depends on the CPU,
//! its place in the row or how the rows were split.

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

/// SwiGLU over rows: `out = silu(gate) * up`, split over `pool` ([`gated_rows`]).
pub fn swiglu(pool: &ThreadPool, gu: &[f32], ffn: usize, out: &mut [f32]) {
    gated_rows(pool, gu, ffn, out, &silu_mul);
}

/// `o[i] = silu(g[i]) * u[i]`, `silu(x) = x / (1 + exp(-x))` with [`expf`].
pub fn silu_mul(g: &[f32], u: &[f32], o: &mut [f32]) {
    assert!(g.len() >= o.len() && u.len() >= o.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
        // SAFETY: AVX2 and FMA checked just above; the lengths were checked on entry.
        done = unsafe { x86::silu_mul(g, u, o) };
    }
    for ((o, &g), &u) in o[done..].iter_mut().zip(&g[done..]).zip(&u[done..]) {
        *o = silu(g) * u;
    }
}

/// `x / (1 + exp(-x))` as ggml's `ggml_v_silu` computes each lane.
pub fn silu(x: f32) -> f32 {
    x / (1.0 + expf(0.0 - x))
}

/// The constants of `ggml_v_expf`, by their bits (ggml writes them as hex floats).
mod c {
    /// 0x1.8p23: adding it rounds to an integer in the low mantissa bits.
    pub const SHIFT: u32 = 0x4b40_0000;
    /// 0x1.715476p+0, log2(e).
    pub const LOG2E: u32 = 0x3fb8_aa3b;
    /// 0x1.62e4p-1 and 0x1.7f7d1cp-20: ln 2 in two parts.
    pub const LN2_HI: u32 = 0x3f31_7200;
    pub const LN2_LO: u32 = 0x35bf_be8e;
    /// The polynomial's coefficients, highest first: 0x1.0e4020p-7, 0x1.573e2ep-5,
    /// 0x1.555e66p-3, 0x1.fffdb6p-2, 0x1.ffffecp-1.
    pub const P: [u32; 5] = [
        0x3c07_2010,
        0x3d2b_9f17,
        0x3e2a_af33,
        0x3eff_fedb,
        0x3f7f_fff6,
    ];
}

fn k(bits: u32) -> f32 {
    f32::from_bits(bits)
}

/// `exp(x)` as ggml's AVX2 `ggml_v_expf` computes one lane: `2^n * (1 + j)` for `n` the
/// nearest integer to `x log2 e`, with the scaling split in two where `|n| > 126` and
/// overflow to infinity or zero where `|n| > 192`.
pub fn expf(x: f32) -> f32 {
    let r = k(c::SHIFT);
    let z = x.mul_add(k(c::LOG2E), r);
    let n = z - r;
    let b = (-n).mul_add(k(c::LN2_LO), (-n).mul_add(k(c::LN2_HI), x));
    let e = z.to_bits() << 23;
    let scale = k(e.wrapping_add(1.0f32.to_bits()));
    let u = b * b;
    let [p0, p1, p2, p3, p4] = c::P.map(k);
    let j = p0
        .mul_add(b, p1)
        .mul_add(u, p2.mul_add(b, p3))
        .mul_add(u, p4 * b);
    if n.abs() <= 126.0 || n.is_nan() {
        return j.mul_add(scale, scale);
    }
    let g: u32 = if n <= 0.0 { 0x8200_0000 } else { 0 };
    let s1 = k(g.wrapping_add(0x7f00_0000));
    let s2 = k(e.wrapping_sub(g));
    if n.abs() > 192.0 {
        s1 * s1
    } else {
        s2.mul_add(j, s2) * s1
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{c, k};

    /// [`super::expf`] on 8 lanes: ggml's AVX2 `ggml_v_expf`, operation for operation.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    fn expf8(x: __m256) -> __m256 {
        let set = |bits: u32| _mm256_set1_ps(k(bits));
        let r = set(c::SHIFT);
        let z = _mm256_fmadd_ps(x, set(c::LOG2E), r);
        let n = _mm256_sub_ps(z, r);
        let b = _mm256_fnmadd_ps(n, set(c::LN2_LO), _mm256_fnmadd_ps(n, set(c::LN2_HI), x));
        let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
        let scale = _mm256_castsi256_ps(_mm256_add_epi32(
            e,
            _mm256_castps_si256(_mm256_set1_ps(1.0)),
        ));
        let abs_n = _mm256_andnot_ps(_mm256_set1_ps(-0.0), n);
        let big = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(126.0)));
        let u = _mm256_mul_ps(b, b);
        let [p0, p1, p2, p3, p4] = c::P.map(set);
        let j = _mm256_fmadd_ps(
            _mm256_fmadd_ps(_mm256_fmadd_ps(p0, b, p1), u, _mm256_fmadd_ps(p2, b, p3)),
            u,
            _mm256_mul_ps(p4, b),
        );
        if _mm256_movemask_ps(_mm256_castsi256_ps(big)) == 0 {
            return _mm256_fmadd_ps(j, scale, scale);
        }
        let g = _mm256_and_si256(
            _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(n, _mm256_setzero_ps())),
            _mm256_set1_epi32(0x8200_0000_u32 as i32),
        );
        let s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f00_0000)));
        let s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
        let huge = _mm256_cmp_ps::<_CMP_GT_OQ>(abs_n, _mm256_set1_ps(192.0));
        let big = _mm256_castsi256_ps(big);
        _mm256_or_ps(
            _mm256_and_ps(huge, _mm256_mul_ps(s1, s1)),
            _mm256_andnot_ps(
                huge,
                _mm256_or_ps(
                    _mm256_and_ps(big, _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                    _mm256_andnot_ps(big, _mm256_fmadd_ps(scale, j, scale)),
                ),
            ),
        )
    }

    /// [`super::silu_mul`] over whole groups of 8; returns how many outputs it wrote.
    #[target_feature(enable = "avx2,fma")]
    pub(super) fn silu_mul(g: &[f32], u: &[f32], o: &mut [f32]) -> usize {
        let n = o.len() / 8 * 8;
        assert!(g.len() >= n && u.len() >= n);
        let one = _mm256_set1_ps(1.0);
        for i in (0..n).step_by(8) {
            // SAFETY: `i + 8 <= n`, which `g`, `u` and `o` all hold (asserted above).
            unsafe {
                let x = _mm256_loadu_ps(g.as_ptr().add(i));
                let e = expf8(_mm256_sub_ps(_mm256_setzero_ps(), x));
                let s = _mm256_div_ps(x, _mm256_add_ps(one, e));
                let y = _mm256_mul_ps(s, _mm256_loadu_ps(u.as_ptr().add(i)));
                _mm256_storeu_ps(o.as_mut_ptr().add(i), y);
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Inputs across exp's whole range: ordinary values, the scaling split (|n| > 126), the
    /// overflow and underflow past |n| > 192, signed zeros, infinities.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.061).collect();
        v.extend((-300..=300).map(|i| i as f32 * 0.5));
        v.extend([0.0, -0.0, 1e-30, -1e-30, f32::INFINITY, f32::NEG_INFINITY]);
        v.extend([
            88.3, 88.4, 88.8, -87.0, -87.5, -103.9, -104.0, -150.0, 150.0,
        ]);
        v
    }

    /// The 8-lane path and the one-lane form give the same bits everywhere (where this CPU has
    /// AVX2/FMA), in every place of a row, and whatever the split.
    #[test]
    fn lanes_and_tails_agree_bit_for_bit() {
        let x = inputs();
        let u: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let want: Vec<f32> = x.iter().zip(&u).map(|(&g, &u)| silu(g) * u).collect();
        for skip in [0, 3] {
            let mut got = vec![f32::NAN; x.len() - skip];
            silu_mul(&x[skip..], &u[skip..], &mut got);
            for (i, (a, b)) in got.iter().zip(&want[skip..]).enumerate() {
                assert_eq!(a.to_bits(), b.to_bits(), "x = {} ({a} vs {b})", x[skip + i]);
            }
        }
    }

    /// exp within ggml's stated error of an f64 exp (1.45 + 0.5 ulp) wherever the result is a
    /// normal float, infinity past f32's largest, zero below its smallest subnormal.
    #[test]
    fn exp_is_within_two_ulps() {
        for x in inputs() {
            let got = expf(x);
            let want = f64::from(x).exp();
            if want > f64::from(f32::MAX) {
                assert_eq!(got, f32::INFINITY, "exp({x})");
            } else if want < 1e-46 {
                assert_eq!(got, 0.0, "exp({x})");
            } else if want >= f64::from(f32::MIN_POSITIVE) {
                let ulp = f64::from(f32::EPSILON) * want;
                let err = (f64::from(got) - want).abs() / ulp;
                assert!(err <= 2.0, "exp({x}) = {got}, want {want}: {err} ulp");
            }
        }
        assert!(expf(f32::NAN).is_nan());
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

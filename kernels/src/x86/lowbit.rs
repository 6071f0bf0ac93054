//! AVX2 dots of the types in `dots` (Q2_K, Q3_K, IQ4_XS, MXFP4): ggml's
//! `ggml_vec_dot_*` AVX2 code, bit-identical to the portable formulas there (same exact
//! integer lanes, same per-block FMAs and final reductions). Each takes `R` activation rows (1 at
//! decode, 4 in batches) and unpacks a weight block once for all of them.

use std::arch::x86_64::*;

use crate::dequant::{KVALUES_IQ4NL, iq4xs_scale, q3k_scales};
use crate::dots::{Grid4, grid4_lanes};
use crate::quant::{ActRow, QK_K, QK8};
use crate::x86::isa::Dots;
use crate::x86::kquant::{check_row, f16_at, hsum_epi32, hsum8};

/// Signed bytes `x` times signed bytes `y`, summed per 4 into 8 i32 (ggml's sign trick; exact
/// for |x| <= 127 or |y| <= 127).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn dot_i8_lanes<D: Dots>(x: __m256i, y: __m256i) -> __m256i {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        D::dpbusd(
            _mm256_setzero_si256(),
            _mm256_sign_epi8(x, x),
            _mm256_sign_epi8(y, x),
        )
    }
}

/// 32 bytes of activations at `x.qs[at..]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_acts(qs: &[i8], at: usize) -> __m256i {
    assert!(qs.len() >= at + 32);
    // SAFETY: 32 bytes from `at`, checked above.
    unsafe { _mm256_loadu_si256(qs.as_ptr().add(at).cast()) }
}

/// The i16 scales of sub-blocks `2s` (low 128 bits) and `2s + 1` (high) of `scales` (8 i16
/// per 128-bit half), in every lane of their half: ggml's `get_scale_shuffle_q3k(s)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_pair(scales: __m256i, s: usize) -> __m256i {
    let pat = |i: usize| i16::from_le_bytes([2 * i as u8, 2 * i as u8 + 1]);
    let shuf = _mm256_set_m128i(_mm_set1_epi16(pat(2 * s + 1)), _mm_set1_epi16(pat(2 * s)));
    _mm256_shuffle_epi8(scales, shuf)
}

/// 16 i16 scales as two registers, scales 0..8 and 8..16 each in both 128-bit halves.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_halves(all: __m256i) -> [__m256i; 2] {
    let (l, h) = (
        _mm256_castsi256_si128(all),
        _mm256_extracti128_si256::<1>(all),
    );
    [_mm256_set_m128i(l, l), _mm256_set_m128i(h, h)]
}

/// Q2_K x Q8_K over a row ([`crate::dots::dot_q2k`]).
#[inline(always)]
pub(crate) unsafe fn dot_q2k<D: Dots>(w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: as the caller's.
    unsafe { dot_q2k_rows::<D, 1>(w, [x])[0] }
}

/// [`dot_q2k`] of one weight row with `R` activation rows (as [`dot_grid4_rows`]).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn dot_q2k_rows<D: Dots, const R: usize>(
    w: &[u8],
    xs: [ActRow<'_>; R],
) -> [f32; R] {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        for x in &xs {
            check_row(w, 84, x);
        }
        let m3 = _mm256_set1_epi8(3);
        let m4 = _mm_set1_epi8(0x0f);
        let mut acc = [0f32; R];
        for (b, blk) in w.chunks_exact(84).enumerate() {
            let (dw, mw) = (f16_at(blk, 80), f16_at(blk, 82));
            // SAFETY: `blk` is 84 bytes (scales 0..16, qs 16..80); row `b` of each `x` holds 256
            // quants and 16 bsums (checked in `check_row`).
            unsafe {
                let ms = _mm_loadu_si128(blk.as_ptr().cast());
                let mins = _mm256_cvtepi8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(ms), m4));
                let mut imin = [0i32; R];
                for r in 0..R {
                    let bsums = _mm256_loadu_si256(xs[r].bsums.as_ptr().add(b * 16).cast());
                    imin[r] = hsum_epi32(_mm256_madd_epi16(mins, bsums));
                }
                let scales = scale_halves(_mm256_cvtepi8_epi16(_mm_and_si128(ms, m4)));
                // Two accumulators a row: a chained `vpdpwssd` waits its full latency each step;
                // integer adds are exact, so splitting the sum changes no bit.
                let mut sumi = [[_mm256_setzero_si256(); 2]; R];
                for (j, sc) in scales.iter().enumerate() {
                    let bits = _mm256_loadu_si256(blk.as_ptr().add(16 + 32 * j).cast());
                    for s in 0..4 {
                        let sh = _mm_cvtsi32_si128(2 * s as i32);
                        let q2 = _mm256_and_si256(_mm256_srl_epi16(bits, sh), m3);
                        let scale = scale_pair(*sc, s);
                        for r in 0..R {
                            let q8 = load_acts(xs[r].qs, b * QK_K + 128 * j + 32 * s);
                            let p = _mm256_maddubs_epi16(q2, q8);
                            sumi[r][s % 2] = D::dpwssd(sumi[r][s % 2], scale, p);
                        }
                    }
                }
                for r in 0..R {
                    let (d, dmin) = (xs[r].d[b] * dw, xs[r].d[b] * mw);
                    let sumi = hsum_epi32(_mm256_add_epi32(sumi[r][0], sumi[r][1]));
                    acc[r] = d.mul_add(sumi as f32, acc[r]);
                    acc[r] = (-dmin).mul_add(imin[r] as f32, acc[r]);
                }
            }
        }
        acc
    }
}

/// Q3_K x Q8_K over a row ([`crate::dots::dot_q3k`]): the 2 low bits dotted unsigned, minus 4
/// times the activations where the high bit is clear; the block's integers summed, one FMA.
#[inline(always)]
pub(crate) unsafe fn dot_q3k<D: Dots>(w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: as the caller's.
    unsafe { dot_q3k_rows::<D, 1>(w, [x])[0] }
}

/// [`dot_q3k`] of one weight row with `R` activation rows (as [`dot_grid4_rows`]).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn dot_q3k_rows<D: Dots, const R: usize>(
    w: &[u8],
    xs: [ActRow<'_>; R],
) -> [f32; R] {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        for x in &xs {
            check_row(w, 110, x);
        }
        let m3 = _mm256_set1_epi8(3);
        let four = _mm256_set1_epi8(4);
        let mut acc = [0f32; R];
        for (b, blk) in w.chunks_exact(110).enumerate() {
            let dw = f16_at(blk, 108);
            let sc8 = q3k_scales(&blk[96..108]);
            // SAFETY: `blk` is 110 bytes (hmask 0..32, qs 32..96); `sc8` is 16 bytes; row `b` of
            // each `x` holds 256 quants (checked in `check_row`).
            unsafe {
                let scales =
                    scale_halves(_mm256_cvtepi8_epi16(_mm_loadu_si128(sc8.as_ptr().cast())));
                let hbits = _mm256_loadu_si256(blk.as_ptr().cast());
                // Two accumulators a row, as in `dot_q2k_rows`.
                let mut sumi = [[_mm256_setzero_si256(); 2]; R];
                for (j, sc) in scales.iter().enumerate() {
                    let bits = _mm256_loadu_si256(blk.as_ptr().add(32 + 32 * j).cast());
                    for s in 0..4 {
                        let sh = _mm_cvtsi32_si128(2 * s as i32);
                        let q3l = _mm256_and_si256(_mm256_srl_epi16(bits, sh), m3);
                        let mask = _mm256_set1_epi8((1u8 << (4 * j + s)) as i8);
                        let clear = _mm256_cmpeq_epi8(
                            _mm256_and_si256(hbits, mask),
                            _mm256_setzero_si256(),
                        );
                        let q3h = _mm256_and_si256(clear, four);
                        let scale = scale_pair(*sc, s);
                        for r in 0..R {
                            let q8 = load_acts(xs[r].qs, b * QK_K + 128 * j + 32 * s);
                            let p = _mm256_sub_epi16(
                                _mm256_maddubs_epi16(q3l, q8),
                                _mm256_maddubs_epi16(q3h, q8),
                            );
                            sumi[r][s % 2] = D::dpwssd(sumi[r][s % 2], scale, p);
                        }
                    }
                }
                for r in 0..R {
                    let d = xs[r].d[b] * dw;
                    let sumi = hsum_epi32(_mm256_add_epi32(sumi[r][0], sumi[r][1]));
                    acc[r] = d.mul_add(sumi as f32, acc[r]);
                }
            }
        }
        acc
    }
}

/// 32 values of a 16-entry grid from 16 bytes of indices (low nibbles first).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn grid4_values(grid: &[i8; 16], p: &[u8]) -> __m256i {
    assert!(p.len() >= 16);
    let m4 = _mm_set1_epi8(0x0f);
    // SAFETY: the 16-entry table and 16 bytes of `p` (checked above) are in bounds.
    unsafe {
        let values = _mm_loadu_si128(grid.as_ptr().cast());
        let bits = _mm_loadu_si128(p.as_ptr().cast());
        _mm256_set_m128i(
            _mm_shuffle_epi8(values, _mm_and_si128(_mm_srli_epi16::<4>(bits), m4)),
            _mm_shuffle_epi8(values, _mm_and_si128(bits, m4)),
        )
    }
}

/// MXFP4 x Q8_0 over a row ([`crate::dots::dot_grid4`]).
#[inline(always)]
pub(crate) unsafe fn dot_grid4<D: Dots>(g: &Grid4, w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: as the caller's.
    unsafe { dot_grid4_rows::<D, 1>(g, w, [x])[0] }
}

/// [`dot_grid4`] of one weight row with `R` activation rows: each block unpacked once for all
/// of them, each row's operations those of `R` = 1 (so the same bits).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn dot_grid4_rows<D: Dots, const R: usize>(
    g: &Grid4,
    w: &[u8],
    xs: [ActRow<'_>; R],
) -> [f32; R] {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        let nb = w.len() / g.ts;
        for x in &xs {
            assert!(x.qs.len() >= nb * QK8 && x.d.len() >= nb);
        }
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let pairs = nb / 2 * 2;
        for (b, blk) in w.chunks_exact(g.ts).take(pairs).enumerate() {
            let q4 = grid4_values(g.values, &blk[g.qs..g.qs + 16]);
            let scale = g.scale(blk);
            for r in 0..R {
                let p = dot_i8_lanes::<D>(q4, load_acts(xs[r].qs, b * QK8));
                let d = _mm256_set1_ps(xs[r].d[b] * scale);
                acc[r][b % 2] = _mm256_fmadd_ps(d, _mm256_cvtepi32_ps(p), acc[r][b % 2]);
            }
        }
        let mut out = [0f32; R];
        for r in 0..R {
            let x = &xs[r];
            let mut sumf = hsum8(_mm256_add_ps(acc[r][0], acc[r][1]));
            if pairs < nb {
                // The odd last block as ggml's scalar tail.
                let b = pairs;
                let blk = &w[g.ts * b..g.ts * (b + 1)];
                let xq = &x.qs[b * QK8..(b + 1) * QK8];
                let sumi: i32 = grid4_lanes(g.values, &blk[g.qs..g.qs + 16], xq)
                    .iter()
                    .sum();
                sumf = (x.d[b] * g.scale(blk)).mul_add(sumi as f32, sumf);
            }
            out[r] = sumf;
        }
        out
    }
}

/// IQ4_XS x Q8_K over a row ([`crate::dots::dot_iq4xs`]).
#[inline(always)]
pub(crate) unsafe fn dot_iq4xs<D: Dots>(w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: as the caller's.
    unsafe { dot_iq4xs_rows::<D, 1>(w, [x])[0] }
}

/// [`dot_iq4xs`] of one weight row with `R` activation rows (as [`dot_grid4_rows`]).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn dot_iq4xs_rows<D: Dots, const R: usize>(
    w: &[u8],
    xs: [ActRow<'_>; R],
) -> [f32; R] {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        for x in &xs {
            check_row(w, 136, x);
        }
        let mut acc = [0f32; R];
        for (b, blk) in w.chunks_exact(136).enumerate() {
            // Two accumulators a row, as in `dot_q2k_rows`.
            let mut sumi = [[_mm256_setzero_si256(); 2]; R];
            for ib in 0..8 {
                let q4 = grid4_values(&KVALUES_IQ4NL, &blk[8 + 16 * ib..24 + 16 * ib]);
                let q4_abs = _mm256_sign_epi8(q4, q4);
                let ls = _mm256_set1_epi16((iq4xs_scale(blk, ib) - 32) as i16);
                for r in 0..R {
                    let p16 = _mm256_maddubs_epi16(
                        q4_abs,
                        _mm256_sign_epi8(load_acts(xs[r].qs, b * QK_K + 32 * ib), q4),
                    );
                    sumi[r][ib % 2] = D::dpwssd(sumi[r][ib % 2], p16, ls);
                }
            }
            let dw = f16_at(blk, 0);
            for r in 0..R {
                // The block's exact integer, then one FMA ([`crate::dots::dot_iq4xs`]).
                let sumi = hsum_epi32(_mm256_add_epi32(sumi[r][0], sumi[r][1]));
                acc[r] = (dw * xs[r].d[b]).mul_add(sumi as f32, acc[r]);
            }
        }
        acc
    }
}

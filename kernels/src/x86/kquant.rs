//! AVX2 dots of K-quant weight rows (Q4_K, Q5_K, Q6_K) with Q8_K activations: ggml's
//! `ggml_vec_dot_q{4,5,6}_K_q8_K` AVX2 code, bit-identical to the portable formulas in `quant`
//! (same exact integer lanes; the per-block float work is the whole block's, as
//! `quant::dot_q4k` says). Each kernel takes `R`
//! activation rows (1 at decode, 4 in batches), so a weight block's bits and scales are unpacked
//! once for all of them, and each row's operations are those of `R` = 1.

use std::arch::x86_64::*;

use crate::quant::{ActRow, QK_K};
use crate::x86::isa::Dots;

const KMASK1: u32 = 0x3f3f_3f3f;
const KMASK2: u32 = 0x0f0f_0f0f;
const KMASK3: u32 = 0x0303_0303;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
        u16::from_le_bytes([b[i], b[i + 1]]) as i32,
    )))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum8(x: __m256) -> f32 {
    // ggml's hsum_float_8, operation for operation.
    let mut r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// The 12 packed scale bytes of a Q4_K/Q5_K block as 8 scales (low 128 bits) and 8 mins (high)
/// in i16 lanes: ggml's `utmp` shuffle. As 32-bit words: the scale pairs `(sc[2t], sc[2t + 1])`,
/// then the min pairs.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn mins_and_scales(sc: &[u8]) -> __m256i {
    let u = |i: usize| u32::from_le_bytes([sc[4 * i], sc[4 * i + 1], sc[4 * i + 2], sc[4 * i + 3]]);
    let (u0, u1, u2) = (u(0), u(1), u(2));
    let t3 = ((u2 >> 4) & KMASK2) | (((u1 >> 6) & KMASK3) << 4);
    let t2 = u1 & KMASK1;
    let t1 = (u2 & KMASK2) | (((u0 >> 6) & KMASK3) << 4);
    let t0 = u0 & KMASK1;
    _mm256_cvtepu8_epi16(_mm_set_epi32(t3 as i32, t2 as i32, t1 as i32, t0 as i32))
}

/// `bsums` pairs summed: `[b0 + b1, b2 + b3, ..., b14 + b15]` as 8 i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bsum_pairs(bsums: &[i16]) -> __m128i {
    assert!(bsums.len() >= 16);
    // SAFETY: 16 i16 = 32 bytes, checked above.
    let v = unsafe { _mm256_loadu_si256(bsums.as_ptr().cast()) };
    _mm_hadd_epi16(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v))
}

/// Sub-block `i`'s scale (i16 lane `i` of the low half of `scales`) in all 16 lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn scale_k4(scales: __m256i, i: i8) -> __m256i {
    _mm256_shuffle_epi8(
        scales,
        _mm256_set1_epi16(i16::from_le_bytes([2 * i as u8, 2 * i as u8 + 1])),
    )
}

/// Bit `bit` of each byte of `hbits` moved to bit 4 (the fifth bit of Q5_K's levels).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hi_bit(hbits: __m256i, bit: i32) -> __m256i {
    let h = _mm256_and_si256(hbits, _mm256_set1_epi8((1u8 << bit) as i8));
    _mm256_slli_epi16::<4>(_mm256_srl_epi16(h, _mm_cvtsi32_si128(bit)))
}

/// The float work of one Q4_K / Q5_K block for one row ([`crate::quant::dot_q4k`]): the lanes
/// of the scaled dots `sumi` and of the mins products `imin4` reduced to their exact sums, then
/// `acc = fma(d_x * d, isum, acc)` and `acc = fma(-(d_x * dmin), imin, acc)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k4_block_tail(acc: f32, dx: f32, dw: f32, mw: f32, sumi: __m256i, imin4: __m128i) -> f32 {
    let isum4 = _mm_add_epi32(
        _mm256_castsi256_si128(sumi),
        _mm256_extracti128_si256::<1>(sumi),
    );
    // [isum, imin] in lanes 0 and 1, as floats.
    let h = _mm_hadd_epi32(isum4, imin4);
    let f = _mm_cvtepi32_ps(_mm_hadd_epi32(h, h));
    let acc = (dx * dw).mul_add(_mm_cvtss_f32(f), acc);
    (-(dx * mw)).mul_add(_mm_cvtss_f32(_mm_movehdup_ps(f)), acc)
}

/// Asserts `x` holds the Q8_K blocks of a weight row of `ts`-byte blocks; returns the count.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn check_row(w: &[u8], ts: usize, x: &ActRow<'_>) -> usize {
    let nb = w.len() / ts;
    assert!(x.qs.len() >= nb * QK_K && x.d.len() >= nb && x.bsums.len() >= nb * 16);
    nb
}

/// Q4_K x Q8_K over a row ([`crate::quant::dot_q4k`]).
#[inline(always)]
pub(crate) unsafe fn dot_q4k<D: Dots>(w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: as the caller's.
    unsafe { dot_q4k_rows::<D, 1>(w, [x])[0] }
}

/// One Q4_K block's integer work for `R` activation rows: per row the 8 lanes of its scaled
/// sub-block dots (exact), and the block's 8 mins (i16, for the `bsums` pairs).
///
/// # Safety
/// The CPU has `D`'s features; `blk` is one 144-byte block and block `b` of each row of `xs`
/// is in bounds (`check_row`).
#[inline(always)]
unsafe fn q4k_block<D: Dots, const R: usize>(
    blk: &[u8],
    b: usize,
    xs: &[ActRow<'_>; R],
) -> ([__m256i; R], __m128i) {
    // SAFETY: the caller's promise; `blk` is 144 bytes (qs at 16..144) and block `b` of each
    // `x.qs` holds 256 bytes.
    unsafe {
        let m4 = _mm256_set1_epi8(0x0f);
        let ms = mins_and_scales(&blk[4..16]);
        let sc128 = _mm256_castsi256_si128(ms);
        let scales = _mm256_set_m128i(sc128, sc128);
        // Two accumulators a row: a chained `vpdpwssd` waits its full latency each step;
        // integer adds are exact, so splitting the sum changes no bit.
        let mut sumi = [[_mm256_setzero_si256(); 2]; R];
        let q4 = blk.as_ptr().add(16);
        for j in 0..4 {
            let scale_l = scale_k4(scales, 2 * j as i8);
            let scale_h = scale_k4(scales, 2 * j as i8 + 1);
            let bits = _mm256_loadu_si256(q4.add(32 * j).cast());
            let q4l = _mm256_and_si256(bits, m4);
            let q4h = _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4);
            for (x, sumi) in xs.iter().zip(&mut sumi) {
                let q8 = x.qs.as_ptr().add(b * QK_K);
                let q8l = _mm256_loadu_si256(q8.add(64 * j).cast());
                let q8h = _mm256_loadu_si256(q8.add(64 * j + 32).cast());
                sumi[0] = D::dpwssd(sumi[0], scale_l, _mm256_maddubs_epi16(q4l, q8l));
                sumi[1] = D::dpwssd(sumi[1], scale_h, _mm256_maddubs_epi16(q4h, q8h));
            }
        }
        (
            sumi.map(|s| _mm256_add_epi32(s[0], s[1])),
            _mm256_extracti128_si256::<1>(ms),
        )
    }
}

/// Q4_K x Q8_K of one weight row with `R` activation rows: each weight block is unpacked once
/// for all of them, and each row's result takes the same operations in the same order as
/// [`dot_q4k`] (which is this with `R` = 1), so it is bit-identical whatever `R`. Per block and
/// row, the two exact integers of [`crate::quant::dot_q4k`] come out of one horizontal
/// reduction, then two scalar FMAs.
#[inline(always)]
pub(crate) unsafe fn dot_q4k_rows<D: Dots, const R: usize>(
    w: &[u8],
    xs: [ActRow<'_>; R],
) -> [f32; R] {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        for x in &xs {
            check_row(w, 144, x);
        }
        let mut acc = [0f32; R];
        for (b, blk) in w.chunks_exact(144).enumerate() {
            let (sumi, mins) = q4k_block::<D, R>(blk, b, &xs);
            let (dw, mw) = (f16_at(blk, 0), f16_at(blk, 2));
            for r in 0..R {
                let x = &xs[r];
                let imin4 = _mm_madd_epi16(mins, bsum_pairs(&x.bsums[b * 16..]));
                acc[r] = k4_block_tail(acc[r], x.d[b], dw, mw, sumi[r], imin4);
            }
        }
        acc
    }
}

/// Q5_K x Q8_K over a row ([`crate::quant::dot_q5k`]).
#[inline(always)]
pub(crate) unsafe fn dot_q5k<D: Dots>(w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: as the caller's.
    unsafe { dot_q5k_rows::<D, 1>(w, [x])[0] }
}

/// Q5_K x Q8_K of one weight row with `R` activation rows, each bit-identical to [`dot_q5k`]
/// (as [`dot_q4k_rows`]).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn dot_q5k_rows<D: Dots, const R: usize>(
    w: &[u8],
    xs: [ActRow<'_>; R],
) -> [f32; R] {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        for x in &xs {
            check_row(w, 176, x);
        }
        let m4 = _mm256_set1_epi8(0x0f);
        let mut acc = [0f32; R];
        for (b, blk) in w.chunks_exact(176).enumerate() {
            let ms = mins_and_scales(&blk[4..16]);
            let mins = _mm256_extracti128_si256::<1>(ms);
            let sc128 = _mm256_castsi256_si128(ms);
            let scales = _mm256_set_m128i(sc128, sc128);
            // Two accumulators a row, as in `dot_q4k_rows`.
            let mut sumi = [[_mm256_setzero_si256(); 2]; R];
            // SAFETY: `blk` is 176 bytes (qh at 16..48, qs at 48..176) and row `b` of each
            // `x.qs` holds 256 bytes (checked in `check_row`).
            unsafe {
                let hbits = _mm256_loadu_si256(blk.as_ptr().add(16).cast());
                let q5 = blk.as_ptr().add(48);
                for j in 0..4 {
                    let scale_0 = scale_k4(scales, 2 * j as i8);
                    let scale_1 = scale_k4(scales, 2 * j as i8 + 1);
                    let bits = _mm256_loadu_si256(q5.add(32 * j).cast());
                    let q5_0 =
                        _mm256_add_epi8(_mm256_and_si256(bits, m4), hi_bit(hbits, 2 * j as i32));
                    let q5_1 = _mm256_add_epi8(
                        _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m4),
                        hi_bit(hbits, 2 * j as i32 + 1),
                    );
                    for (x, sumi) in xs.iter().zip(&mut sumi) {
                        let q8 = x.qs.as_ptr().add(b * QK_K);
                        let q8_0 = _mm256_loadu_si256(q8.add(64 * j).cast());
                        let q8_1 = _mm256_loadu_si256(q8.add(64 * j + 32).cast());
                        sumi[0] = D::dpwssd(sumi[0], scale_0, _mm256_maddubs_epi16(q5_0, q8_0));
                        sumi[1] = D::dpwssd(sumi[1], scale_1, _mm256_maddubs_epi16(q5_1, q8_1));
                    }
                }
            }
            let (dw, mw) = (f16_at(blk, 0), f16_at(blk, 2));
            for r in 0..R {
                let x = &xs[r];
                acc[r] = k4_block_tail(
                    acc[r],
                    x.d[b],
                    dw,
                    mw,
                    _mm256_add_epi32(sumi[r][0], sumi[r][1]),
                    _mm_madd_epi16(mins, bsum_pairs(&x.bsums[b * 16..])),
                );
            }
        }
        acc
    }
}

/// Q6_K x Q8_K over a row ([`crate::quant::dot_q6k`]).
#[inline(always)]
pub(crate) unsafe fn dot_q6k<D: Dots>(w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: as the caller's.
    unsafe { dot_q6k_rows::<D, 1>(w, [x])[0] }
}

/// Q6_K x Q8_K of one weight row with `R` activation rows, each bit-identical to [`dot_q6k`]
/// (as [`dot_q4k_rows`]).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn dot_q6k_rows<D: Dots, const R: usize>(
    w: &[u8],
    xs: [ActRow<'_>; R],
) -> [f32; R] {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        for x in &xs {
            check_row(w, 210, x);
        }
        let mut acc = [0f32; R];
        for (b, blk) in w.chunks_exact(210).enumerate() {
            let sumi = q6k_block::<D, R>(blk, b, &xs);
            let dw = f16_at(blk, 208);
            for r in 0..R {
                acc[r] = (xs[r].d[b] * dw).mul_add(hsum_epi32(sumi[r]) as f32, acc[r]);
            }
        }
        acc
    }
}

/// One Q6_K block's integer work for `R` activation rows: per row 8 lanes whose sum is the
/// block's exact `isum` ([`crate::quant::dot_q6k`]: unsigned levels times the signed scales,
/// less `32 * bsums . scales`).
///
/// # Safety
/// The CPU has `D`'s features; `blk` is one 210-byte block and block `b` of each row of `xs`
/// is in bounds (`check_row`).
#[inline(always)]
unsafe fn q6k_block<D: Dots, const R: usize>(
    blk: &[u8],
    b: usize,
    xs: &[ActRow<'_>; R],
) -> [__m256i; R] {
    // SAFETY: the caller's promise; `blk` is 210 bytes (ql 0..128, qh 128..192, scales
    // 192..208), block `b` of each `x.qs` holds 256 bytes and of each `x.bsums` 16.
    unsafe {
        let m3 = _mm256_set1_epi8(3);
        let m15 = _mm256_set1_epi8(15);
        let scales = _mm_loadu_si128(blk.as_ptr().add(192).cast());
        // Two accumulators a row, as in `q4k_block`.
        let mut sumi = [[_mm256_setzero_si256(); 2]; R];
        for j in 0..2 {
            let q4 = blk.as_ptr().add(64 * j);
            let qh = blk.as_ptr().add(128 + 32 * j);
            let bits1 = _mm256_loadu_si256(q4.cast());
            let bits2 = _mm256_loadu_si256(q4.add(32).cast());
            let bits_h = _mm256_loadu_si256(qh.cast());
            let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(bits_h, m3));
            let h1 = _mm256_slli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(12)));
            let h2 = _mm256_and_si256(bits_h, _mm256_set1_epi8(48));
            let h3 = _mm256_srli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(-64)));
            let q = [
                _mm256_or_si256(_mm256_and_si256(bits1, m15), h0),
                _mm256_or_si256(_mm256_and_si256(bits2, m15), h1),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15), h2),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15), h3),
            ];
            for (i, qi) in q.iter().enumerate() {
                // Scales 8j + 2i (elements 0..16 of this 32) and 8j + 2i + 1 (16..32).
                let s = (8 * j + 2 * i) as i8;
                let shuf = _mm_set_epi64x(
                    i64::from_ne_bytes([s as u8 + 1; 8]),
                    i64::from_ne_bytes([s as u8; 8]),
                );
                let sc = _mm256_cvtepi8_epi16(_mm_shuffle_epi8(scales, shuf));
                for (x, sumi) in xs.iter().zip(&mut sumi) {
                    let q8 = x.qs.as_ptr().add(b * QK_K + 128 * j);
                    let x8 = _mm256_loadu_si256(q8.add(32 * i).cast());
                    let p16 = _mm256_maddubs_epi16(*qi, x8);
                    sumi[i % 2] = D::dpwssd(sumi[i % 2], sc, p16);
                }
            }
        }
        let sc16 = _mm256_cvtepi8_epi16(scales);
        let mut out = [_mm256_setzero_si256(); R];
        for r in 0..R {
            let q8sums = _mm256_loadu_si256(xs[r].bsums.as_ptr().add(b * 16).cast());
            let q8sclsub = _mm256_slli_epi32::<5>(_mm256_madd_epi16(q8sums, sc16));
            out[r] = _mm256_sub_epi32(_mm256_add_epi32(sumi[r][0], sumi[r][1]), q8sclsub);
        }
        out
    }
}

/// The sum of the 8 i32 lanes of `v` (exact, given the callers' bounds).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<1>(s)))
}

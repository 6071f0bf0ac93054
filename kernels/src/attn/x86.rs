//! The AVX2 (+ FMA + F16C) kernels of paged attention: f16 rounding and conversion of rows,
//! prefetch, exp, and the block step (see the parent module for the order of operations).

use std::arch::x86_64::*;

use half::f16;

use super::{BLOCK, Block, KvRows, cap_score};
use crate::WType;

/// Rounds `src` to f16 and back (round to nearest even, like `f16::from_f32`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn round_to_f16(src: &[f32], dst: &mut [f32]) {
    assert!(src.len() == dst.len() && src.len().is_multiple_of(8));
    for (s, d) in src.chunks_exact(8).zip(dst.chunks_exact_mut(8)) {
        // SAFETY: both chunks are 8 floats.
        unsafe {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(s.as_ptr()));
            _mm256_storeu_ps(d.as_mut_ptr(), _mm256_cvtph_ps(h));
        }
    }
}

/// Converts the rows of `k_cache`/`v_cache` at `offs` (each `hd = k.len() / offs.len()`
/// long) into consecutive rows of `k`/`v`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn convert_rows(
    k_cache: &[f16],
    v_cache: &[f16],
    offs: &[usize],
    k: &mut [f32],
    v: &mut [f32],
) {
    let hd = k.len() / offs.len().max(1);
    assert!(hd.is_multiple_of(8) && k.len() == offs.len() * hd && v.len() == k.len());
    assert!(k_cache.len() == v_cache.len());
    for (r, &off) in offs.iter().enumerate() {
        assert!(off + hd <= k_cache.len());
        for c in (0..hd).step_by(8) {
            // SAFETY: `off + c + 8 <= off + hd <= len` for both caches (f16 is a
            // transparent u16, so 8 of them are 16 bytes); `r * hd + c + 8 <= k.len()`.
            unsafe {
                let hk = _mm_loadu_si128(k_cache.as_ptr().add(off + c).cast());
                let hv = _mm_loadu_si128(v_cache.as_ptr().add(off + c).cast());
                _mm256_storeu_ps(k.as_mut_ptr().add(r * hd + c), _mm256_cvtph_ps(hk));
                _mm256_storeu_ps(v.as_mut_ptr().add(r * hd + c), _mm256_cvtph_ps(hv));
            }
        }
    }
}

/// Converts one cache's rows at `offs` (whole blocks of its type; `dst.len() / offs.len()`
/// elements each) into consecutive f32 rows of `dst`: Q8_0, Q4_0 and BF16 here with AVX2, the
/// values [`KvRows::to_f32`] gives bit for bit (each value is `d * q` with `d` and `q` exact in
/// f32, one rounding, as ggml's dequantization); f16 and other types through `to_f32`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn convert_cache(cache: KvRows<'_>, offs: &[usize], dst: &mut [f32]) {
    let hd = dst.len() / offs.len().max(1);
    assert_eq!(dst.len(), offs.len() * hd);
    let (ty, data) = match cache {
        KvRows::Blocks { ty, data } if matches!(ty, WType::Q8_0 | WType::Q4_0 | WType::BF16) => {
            (ty, data)
        }
        _ => {
            for (r, &off) in offs.iter().enumerate() {
                cache.to_f32(off, &mut dst[r * hd..][..hd]);
            }
            return;
        }
    };
    let (bs, ts) = (ty.block_size(), ty.type_size());
    // Whole blocks of 32 per head (`KvTypes::check`), or BF16 in steps of 8 (the backend's).
    assert!(hd.is_multiple_of(if ty == WType::BF16 { 8 } else { 32 }));
    for (r, &off) in offs.iter().enumerate() {
        assert!(
            off.is_multiple_of(bs),
            "KV rows of {ty} are read in whole blocks of {bs}"
        );
        let out = &mut dst[r * hd..][..hd];
        let row = &data[off / bs * ts..][..hd / bs * ts];
        match ty {
            WType::BF16 => {
                for (o, b) in out.chunks_exact_mut(8).zip(row.chunks_exact(16)) {
                    // SAFETY: 16 bytes in, 8 floats out (the chunks' sizes).
                    unsafe {
                        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(b.as_ptr().cast()));
                        let f = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(h));
                        _mm256_storeu_ps(o.as_mut_ptr(), f);
                    }
                }
            }
            WType::Q8_0 => {
                for (o, blk) in out.chunks_exact_mut(32).zip(row.chunks_exact(34)) {
                    let d = _mm256_set1_ps(f16::from_le_bytes([blk[0], blk[1]]).to_f32());
                    for (j, o8) in o.chunks_exact_mut(8).enumerate() {
                        // SAFETY: bytes 2 + 8j .. 10 + 8j of a 34-byte block; 8 floats out.
                        unsafe {
                            let q = _mm_loadl_epi64(blk[2 + 8 * j..].as_ptr().cast());
                            let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
                            _mm256_storeu_ps(o8.as_mut_ptr(), _mm256_mul_ps(d, f));
                        }
                    }
                }
            }
            _ => {
                // Q4_0: element j is the low nibble of byte j, element 16 + j its high one,
                // each less 8.
                for (o, blk) in out.chunks_exact_mut(32).zip(row.chunks_exact(18)) {
                    let d = _mm256_set1_ps(f16::from_le_bytes([blk[0], blk[1]]).to_f32());
                    // SAFETY: bytes 2..18 of an 18-byte block; 4 x 8 floats out.
                    unsafe {
                        let qs = _mm_loadu_si128(blk[2..].as_ptr().cast());
                        let m4 = _mm_set1_epi8(0x0f);
                        let eight = _mm_set1_epi8(8);
                        let lo = _mm_sub_epi8(_mm_and_si128(qs, m4), eight);
                        let hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16::<4>(qs), m4), eight);
                        for (j, v) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)]
                            .into_iter()
                            .enumerate()
                        {
                            let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                            _mm256_storeu_ps(o.as_mut_ptr().add(8 * j), _mm256_mul_ps(d, f));
                        }
                    }
                }
            }
        }
    }
}

/// Asks for the cache lines of the rows at `offs` (`hd` halves each) ahead of use.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn prefetch_rows(k_cache: &[f16], v_cache: &[f16], offs: &[usize], hd: usize) {
    for &off in offs {
        // 32 halves = one 64-byte line; rows were bounds-checked by `row_offsets`, and a
        // prefetch never faults anyway.
        for c in (0..hd).step_by(32) {
            let (k, v) = (k_cache.get(off + c), v_cache.get(off + c));
            if let (Some(k), Some(v)) = (k, v) {
                let (k, v): (*const f16, *const f16) = (k, v);
                // A hint only (it reads nothing, hence safe): inside the caches all the same.
                _mm_prefetch::<_MM_HINT_T0>(k.cast());
                _mm_prefetch::<_MM_HINT_T0>(v.cast());
            }
        }
    }
}

/// exp of 8 lanes: `n = round(x * log2 e)`, `r = x - n ln2` (ln2 split in two, FMA), Cephes'
/// degree-5 polynomial for `(e^r - 1 - r) / r^2`, then scaling by `2^n` in two halves so
/// results down into the subnormals round once, correctly. Inputs are clamped to
/// [-105, 88.8]: below, the result rounds to 0; above, it overflows to infinity. NaN stays NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn exp8(x: __m256) -> __m256 {
    // `max`/`min` return their second operand when either is NaN: keep x second.
    let x = _mm256_max_ps(_mm256_set1_ps(-105.0), x);
    let x = _mm256_min_ps(_mm256_set1_ps(88.8), x);
    let n = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(_mm256_mul_ps(
        x,
        _mm256_set1_ps(std::f32::consts::LOG2_E),
    ));
    // 0.693359375 has few bits, so n * C1 is exact and r keeps its low bits.
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut y = _mm256_set1_ps(1.987_569_1e-4);
    for c in [
        1.398_199_9e-3,
        8.333_452e-3,
        4.166_579_6e-2,
        0.166_666_65,
        0.5,
    ] {
        y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(c));
    }
    // e^r = 1 + (r + r^2 y): add the small terms first, then 1.
    let y = _mm256_add_ps(
        _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), r),
        _mm256_set1_ps(1.0),
    );
    let ni = _mm256_cvtps_epi32(n);
    let n1 = _mm256_srai_epi32::<1>(ni);
    let n2 = _mm256_sub_epi32(ni, n1);
    let bias = _mm256_set1_epi32(127);
    let s1 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n1, bias)));
    let s2 = _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n2, bias)));
    _mm256_mul_ps(_mm256_mul_ps(y, s1), s2)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn exp_slice(x: &mut [f32]) {
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: `c` is 8 floats.
        unsafe { _mm256_storeu_ps(c.as_mut_ptr(), exp8(_mm256_loadu_ps(c.as_ptr()))) };
    }
    let rest = chunks.into_remainder();
    let mut buf = [0f32; 8];
    buf[..rest.len()].copy_from_slice(rest);
    // SAFETY: `buf` is 8 floats.
    unsafe { _mm256_storeu_ps(buf.as_mut_ptr(), exp8(_mm256_loadu_ps(buf.as_ptr()))) };
    let n = rest.len();
    rest.copy_from_slice(&buf[..n]);
}

/// Dots of `q` with 8 consecutive rows of `k` (`hd` apart), one per lane: eight partial
/// sums per row over the head, then `((0+1)+(2+3))+((4+5)+(6+7))` for every lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn dot8(q: &[f32], k: &[f32]) -> __m256 {
    let hd = q.len();
    assert!(k.len() >= 8 * hd && hd.is_multiple_of(8));
    let mut a = [_mm256_setzero_ps(); 8];
    for c in (0..hd).step_by(8) {
        // SAFETY: `c + 8 <= hd`, and row `j < 8` of `k` ends at `(j + 1) * hd <= k.len()`.
        unsafe {
            let qc = _mm256_loadu_ps(q.as_ptr().add(c));
            for (j, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(qc, _mm256_loadu_ps(k.as_ptr().add(j * hd + c)), *a);
            }
        }
    }
    tree8(a)
}

/// Each of 8 keys' lane sums (`a[j]`, 8 partial sums) reduced by one fixed tree, key `j` in
/// lane `j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn tree8(a: [__m256; 8]) -> __m256 {
    let h01 = _mm256_hadd_ps(a[0], a[1]);
    let h23 = _mm256_hadd_ps(a[2], a[3]);
    let h45 = _mm256_hadd_ps(a[4], a[5]);
    let h67 = _mm256_hadd_ps(a[6], a[7]);
    // Lanes: rows 0-3 then 4-7, low halves' sums in `lo`, high halves' in `hi`.
    let h0123 = _mm256_hadd_ps(h01, h23);
    let h4567 = _mm256_hadd_ps(h45, h67);
    let lo = _mm256_permute2f128_ps::<0x20>(h0123, h4567);
    let hi = _mm256_permute2f128_ps::<0x31>(h0123, h4567);
    _mm256_add_ps(lo, hi)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hmax(x: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_movehdup_ps(m));
    _mm_cvtss_f32(m)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn hsum(x: __m256) -> f32 {
    let r = _mm_add_ps(_mm256_extractf128_ps::<1>(x), _mm256_castps256_ps128(x));
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    let r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// `acc[..8 R] += sum_p w[p] * v[p * hd..][..8 R]`, in position order, the accumulators in
/// registers for the whole block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn acc_v<const R: usize>(acc: &mut [f32], v: &[f32], hd: usize, w: &[f32]) {
    assert!(acc.len() >= 8 * R && (w.is_empty() || v.len() >= (w.len() - 1) * hd + 8 * R));
    // SAFETY: lane `r < R` of position `p < w.len()` reads `v[p * hd + 8 r..][..8]`, inside
    // `v` by the assertion; the accumulators are `8 R` floats of `acc`.
    unsafe {
        let mut a: [__m256; R] = std::array::from_fn(|r| _mm256_loadu_ps(acc.as_ptr().add(8 * r)));
        for (p, &wp) in w.iter().enumerate() {
            let wv = _mm256_set1_ps(wp);
            let row = v.as_ptr().add(p * hd);
            for (r, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(wv, _mm256_loadu_ps(row.add(8 * r)), *a);
            }
        }
        for (r, a) in a.iter().enumerate() {
            _mm256_storeu_ps(acc.as_mut_ptr().add(8 * r), *a);
        }
    }
}

/// The block step (see the module doc for the order of operations) of the target features
/// `$features`, its 8 keys' dots by `$dot8`, and its V accumulation begun by `$acc_wide` (which
/// returns how many floats of the head it did). Needs `q.len() % 8 == 0`.
macro_rules! block_step {
    ($(#[$doc:meta])* $name:ident, $features:literal, $dot8:path, $acc_wide:path) => {
        $(#[$doc])*
        #[target_feature(enable = $features)]
        pub(super) fn $name(b: &Block<'_>, state: &mut (f32, f32), acc: &mut [f32]) {
            let hd = b.q.len();
            assert!(hd.is_multiple_of(8) && b.k.len() >= BLOCK * hd && b.v.len() >= BLOCK * hd);
            assert!(b.lo < b.nv && b.nv <= BLOCK && acc.len() == hd);
            let ng = b.nv.div_ceil(8);
            let neg_inf = _mm256_set1_ps(f32::NEG_INFINITY);
            let scale = _mm256_set1_ps(b.scale);
            let nv = _mm256_set1_epi32(b.nv as i32);
            let lo = _mm256_set1_epi32(b.lo as i32 - 1);
            let mut s = [neg_inf; BLOCK / 8];
            for (j, s) in s[..ng].iter_mut().enumerate() {
                let mut x = _mm256_mul_ps($dot8(b.q, &b.k[j * 8 * hd..]), scale);
                if b.softcap.is_some() {
                    let mut lanes = [0f32; 8];
                    // SAFETY: `lanes` is 8 floats.
                    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), x) };
                    lanes.iter_mut().for_each(|v| *v = cap_score(*v, b.softcap));
                    // SAFETY: as above.
                    x = unsafe { _mm256_loadu_ps(lanes.as_ptr()) };
                }
                let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                let lane = _mm256_add_epi32(lane, _mm256_set1_epi32(8 * j as i32));
                // Lanes at or past `nv` are other queries' (or no) positions, lanes before `lo` are
                // outside the window: -inf, weight 0.
                let keep = _mm256_and_si256(_mm256_cmpgt_epi32(nv, lane), _mm256_cmpgt_epi32(lane, lo));
                *s = _mm256_blendv_ps(neg_inf, x, _mm256_castsi256_ps(keep));
            }
            let m = hmax(_mm256_max_ps(
                _mm256_max_ps(s[0], s[1]),
                _mm256_max_ps(s[2], s[3]),
            ));
            if m > state.0 {
                if state.0 > f32::NEG_INFINITY {
                    let r = _mm256_set1_ps(state.0 - m);
                    let r = exp8(r);
                    for c in acc.chunks_exact_mut(8) {
                        // SAFETY: `c` is 8 floats.
                        unsafe {
                            _mm256_storeu_ps(
                                c.as_mut_ptr(),
                                _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), r),
                            )
                        };
                    }
                    state.1 *= _mm256_cvtss_f32(r);
                }
                state.0 = m;
            }
            let mv = _mm256_set1_ps(state.0);
            let mut w = [_mm256_setzero_ps(); BLOCK / 8];
            for (w, &s) in w[..ng].iter_mut().zip(&s) {
                *w = exp8(_mm256_sub_ps(s, mv));
            }
            let sum = _mm256_add_ps(_mm256_add_ps(w[0], w[1]), _mm256_add_ps(w[2], w[3]));
            state.1 += hsum(sum);
            let mut wf = [0f32; BLOCK];
            for (c, w) in wf.chunks_exact_mut(8).zip(&w) {
                // SAFETY: `c` is 8 floats.
                unsafe { _mm256_storeu_ps(c.as_mut_ptr(), *w) };
            }
            let w = &wf[..b.nv];
            let mut d = $acc_wide(acc, b.v, hd, w);
            while d < hd {
                let (acc, v) = (&mut acc[d..], &b.v[d..]);
                match (hd - d).min(64) / 8 {
                    8 => acc_v::<8>(acc, v, hd, w),
                    7 => acc_v::<7>(acc, v, hd, w),
                    6 => acc_v::<6>(acc, v, hd, w),
                    5 => acc_v::<5>(acc, v, hd, w),
                    4 => acc_v::<4>(acc, v, hd, w),
                    3 => acc_v::<3>(acc, v, hd, w),
                    2 => acc_v::<2>(acc, v, hd, w),
                    _ => acc_v::<1>(acc, v, hd, w),
                }
                d += 64;
            }
        }
    };
}

block_step!(
    /// The AVX2 block step.
    block,
    "avx2,fma,f16c",
    dot8,
    none_wide
);

block_step!(
    /// [`block`] with the scores' dots and the V accumulation on 512-bit vectors ([`wide`]):
    /// every lane does the same operations in the same order, so the result is [`block`]'s bit
    /// for bit.
    block_zmm,
    "avx2,fma,f16c,avx512f",
    wide::dot8,
    wide::acc_v
);

/// No part of the V accumulation on wide vectors.
fn none_wide(_: &mut [f32], _: &[f32], _: usize, _: &[f32]) -> usize {
    0
}

/// The 512-bit forms of [`dot8`] and [`acc_v`]: the same per-lane operations, two keys (or 16
/// head elements) a vector.
mod wide {
    use std::arch::x86_64::*;

    use super::tree8;

    /// Two 8-float rows in one vector: `lo` in the low half.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    fn join(lo: __m256, hi: __m256) -> __m512 {
        let lo = _mm512_castpd256_pd512(_mm256_castps_pd(lo));
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(lo, _mm256_castps_pd(hi)))
    }

    /// [`super::dot8`]: keys `2p` and `2p + 1` in the halves of accumulator `p`, then the
    /// same tree over the halves.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) fn dot8(q: &[f32], k: &[f32]) -> __m256 {
        let hd = q.len();
        assert!(k.len() >= 8 * hd && hd.is_multiple_of(8));
        let mut a = [_mm512_setzero_ps(); 4];
        for c in (0..hd).step_by(8) {
            // SAFETY: `c + 8 <= hd`, and row `j < 8` of `k` ends at `(j + 1) * hd <= k.len()`.
            unsafe {
                let qc = _mm256_loadu_ps(q.as_ptr().add(c));
                let qc = join(qc, qc);
                for (p, a) in a.iter_mut().enumerate() {
                    let row = |j: usize| _mm256_loadu_ps(k.as_ptr().add(j * hd + c));
                    *a = _mm512_fmadd_ps(qc, join(row(2 * p), row(2 * p + 1)), *a);
                }
            }
        }
        let half = |a: __m512, hi: bool| {
            let a = _mm512_castps_pd(a);
            _mm256_castpd_ps(if hi {
                _mm512_extractf64x4_pd::<1>(a)
            } else {
                _mm512_castpd512_pd256(a)
            })
        };
        tree8(std::array::from_fn(|j| half(a[j / 2], j % 2 == 1)))
    }

    /// [`super::acc_v`] over the head's whole 16-float groups; returns how many floats of
    /// `acc` it covered (the rest is left to the 8-float form).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    pub(super) fn acc_v(acc: &mut [f32], v: &[f32], hd: usize, w: &[f32]) -> usize {
        let mut d = 0;
        while hd - d >= 16 {
            let (acc, v) = (&mut acc[d..], &v[d..]);
            d += 16
                * match (hd - d).min(128) / 16 {
                    8 => acc_v16::<8>(acc, v, hd, w),
                    7 => acc_v16::<7>(acc, v, hd, w),
                    6 => acc_v16::<6>(acc, v, hd, w),
                    5 => acc_v16::<5>(acc, v, hd, w),
                    4 => acc_v16::<4>(acc, v, hd, w),
                    3 => acc_v16::<3>(acc, v, hd, w),
                    2 => acc_v16::<2>(acc, v, hd, w),
                    _ => acc_v16::<1>(acc, v, hd, w),
                };
        }
        d
    }

    /// `acc[..16 R] += sum_p w[p] * v[p * hd..][..16 R]` in position order; returns `R`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f")]
    fn acc_v16<const R: usize>(acc: &mut [f32], v: &[f32], hd: usize, w: &[f32]) -> usize {
        assert!(acc.len() >= 16 * R && (w.is_empty() || v.len() >= (w.len() - 1) * hd + 16 * R));
        // SAFETY: lane `r < R` of position `p < w.len()` reads `v[p * hd + 16 r..][..16]`,
        // inside `v` by the assertion; the accumulators are `16 R` floats of `acc`.
        unsafe {
            let mut a: [__m512; R] =
                std::array::from_fn(|r| _mm512_loadu_ps(acc.as_ptr().add(16 * r)));
            for (p, &wp) in w.iter().enumerate() {
                let wv = _mm512_set1_ps(wp);
                let row = v.as_ptr().add(p * hd);
                for (r, a) in a.iter_mut().enumerate() {
                    *a = _mm512_fmadd_ps(wv, _mm512_loadu_ps(row.add(16 * r)), *a);
                }
            }
            for (r, a) in a.iter().enumerate() {
                _mm512_storeu_ps(acc.as_mut_ptr().add(16 * r), *a);
            }
        }
        R
    }
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::quantize_row;

    /// The AVX2 conversion of Q8_0, Q4_0 and BF16 rows gives `to_f32`'s values bit for bit,
    /// rows picked out of order, blocks of zeros and outliers of both signs included.
    #[test]
    fn quantized_rows_convert_as_to_f32_does() {
        if !(is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")) {
            return;
        }
        let mut rng = StdRng::seed_from_u64(45);
        let (hd, slots) = (64usize, 9usize);
        for ty in [WType::Q8_0, WType::Q4_0, WType::BF16] {
            let mut data = vec![0u8; slots * ty.row_bytes(hd)];
            for (s, row) in data.chunks_exact_mut(ty.row_bytes(hd)).enumerate() {
                let mut x: Vec<f32> = (0..hd).map(|_| rng.random_range(-3.0f32..3.0)).collect();
                x[s % hd] = if s % 2 == 0 { 50.0 } else { -50.0 };
                if s == 4 {
                    x[32..].fill(0.0);
                }
                quantize_row(ty, &x, row);
            }
            let cache = KvRows::Blocks { ty, data: &data };
            let offs: Vec<usize> = [7usize, 0, 4, 8, 3].iter().map(|s| s * hd).collect();
            let mut got = vec![f32::NAN; offs.len() * hd];
            // SAFETY: AVX2 and F16C checked above.
            unsafe { convert_cache(cache, &offs, &mut got) };
            for (r, &off) in offs.iter().enumerate() {
                let mut want = vec![0f32; hd];
                cache.to_f32(off, &mut want);
                let g = &got[r * hd..][..hd];
                let same = g.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} row at {off}: {g:?} vs {want:?}");
            }
        }
    }
}

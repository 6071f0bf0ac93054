//! `x86::panel_k`: the Q4_K, Q5_K and Q6_K matmuls for batches past the in-place dots
//! (prefill, and decode of many sequences), on repacked 8-row panels as `x86::panel32` does for
//! Q4_0 / Q4_1 / Q8_0.
//!
//! Each group of [`ROWS`] weight rows is repacked once per call ([`repack`]) into panels of 8
//! rows. Per block (256 weights) and panel:
//! - Q4_K: the 128 nibble bytes as 4 x 8 vectors: vector `(t, j)` holds bytes
//!   `32t + 4j..32t + 4j + 4` of the 8 rows, so its low nibbles are elements `32s + 4j..+4` of
//!   sub-block `s = 2t` and its high nibbles those of sub-block `2t + 1`. Q5_K and Q6_K: the
//!   256 levels unpacked to bytes (0..31, 0..63) as 8 x 8 vectors, vector `(c, j)` holding
//!   elements `32c + 4j..+4` of the 8 rows;
//! - the scales as i16 pairs, one vector per pair of sub-blocks holding the 8 rows' pair
//!   (Q4_K, Q5_K: `ggml`'s `utmp` unpack per row, vector `t` the scale pair `(sc[2t], sc[2t + 1])`,
//!   vector `4 + t` the min pair; Q6_K: vector `t` the signed scales of its 16-element
//!   sub-blocks `2t` and `2t + 1`);
//! - `d` (and Q4_K's, Q5_K's `dmin`) widened to f32, 8 rows side by side.
//!
//! A `dpbusd` of a level vector with the activation's 4 bytes broadcast adds 4 products to
//! each row's lane; a sub-block's steps give its integer dot of 8 rows, times the rows' scales
//! (`vpmulld`) into `isum`. The mins (Q4_K, Q5_K) and the level offset of 32 (Q6_K) meet the
//! activation's `bsums` through `vpmaddwd`. These are the exact integers of `quant::dot_q4k`,
//! `dot_q5k` and `dot_q6k`, and the FMAs per block are their float operations, lane by lane, so
//! every row has the bits of the in-place dots (`x86::kquant`) and of the portable formulas.
//! The tiles also run Q3_K, Q2_K and IQ4_XS groups repacked from packed matrices
//! (`x86::packed_dots`); the 16-element sub-block types' integer part is `x86::k16`'s.

use std::arch::x86_64::*;

use crate::WType;
use crate::quant::QK_K;
use crate::x86::isa::Dots;
use crate::x86::job::GroupJob;
use crate::x86::k16::k16_block;
use crate::x86::kblock::{
    Block, IQ4XS, Q2K, Q3K, Q4K, Q5K, Q5K_QH_GAP, Q5KP, Q6K, add_pairs16, add_scaled16, vec_at,
};
use crate::x86::kquant::{bsum_pairs, hi_bit, mins_and_scales};
use crate::x86::panel32::{LANES, ROWS, store_lanes, tile_cols, transpose8x8_words};
use crate::x86::wide;

pub(crate) const PANELS: usize = ROWS / LANES;
/// Level vectors of one block of one panel: Q4_K 4 pairs of sub-blocks x 8 steps of nibbles,
/// Q6_K 8 chunks of 32 x 8 steps of bytes.
const QVECS_Q4K: usize = 32;
/// Q5_K and Q6_K: levels unpacked to bytes, 8 chunks of 32 x 8 steps.
pub(crate) const QVECS_BYTES: usize = 64;

/// A repacked group of Q4_K, Q5_K or Q6_K weight rows (reused across calls).
#[derive(Default)]
pub(crate) struct PanelsK {
    /// `nb x PANELS x QVECS_*` level vectors, as the module doc says.
    pub(crate) qs: Vec<__m256i>,
    /// `nb x PANELS x 8` scale (and min) pair vectors.
    pub(crate) sm: Vec<__m256i>,
    /// `nb x ROWS` weight `d` and `dmin` (0 for rows past `n`).
    pub(crate) d: Vec<f32>,
    pub(crate) dmin: Vec<f32>,
}

/// Whether `ty` has panels here.
pub(crate) fn has_panels(ty: WType) -> bool {
    matches!(ty, WType::Q4K | WType::Q5K | WType::Q6K)
}

/// Repacks weight rows `j0..j0 + ROWS` of type `T` (rows past `n` become zeros) into `pn`.
///
/// # Safety
/// The CPU has `D`'s features (AVX2 and F16C at least); called from their compiled copies.
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn repack<D: Dots, const T: u8>(
    data: &[u8],
    n: usize,
    k: usize,
    j0: usize,
    pn: &mut PanelsK,
) {
    let nb = k / QK_K;
    let (ts, qv) = match T {
        Q4K => (144, QVECS_Q4K),
        Q5K => (176, QVECS_BYTES),
        _ => (210, QVECS_BYTES),
    };
    let rb = nb * ts;
    assert!(data.len() >= n * rb);
    // SAFETY: the CPU has AVX2 and F16C (the caller's promise). Reads stay inside rows j < n of
    // `data` (checked above); writes inside `pn`'s buffers as sized here.
    unsafe {
        pn.qs.resize(nb * PANELS * qv, _mm256_setzero_si256());
        pn.sm.resize(nb * PANELS * LANES, _mm256_setzero_si256());
        pn.d.resize(nb * ROWS, 0.0);
        pn.dmin.resize(nb * ROWS, 0.0);
        let (m3, m15) = (_mm256_set1_epi8(3), _mm256_set1_epi8(15));
        for b in 0..nb {
            for p in 0..PANELS {
                // No closures here: they would be compiled without the path's features and
                // call every intrinsic out of line.
                let mut sm = [_mm256_setzero_si256(); LANES];
                let mut qs = [[_mm256_setzero_si256(); LANES]; 8];
                for l in 0..LANES {
                    let r = p * LANES + l;
                    let j = j0 + r;
                    if j >= n {
                        pn.d[b * ROWS + r] = 0.0;
                        pn.dmin[b * ROWS + r] = 0.0;
                        continue;
                    }
                    let blk = data.as_ptr().add(j * rb + b * ts);
                    if T == Q4K || T == Q5K {
                        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                            blk.cast::<i32>(),
                        )));
                        pn.d[b * ROWS + r] = _mm_cvtss_f32(dm);
                        pn.dmin[b * ROWS + r] = _mm_cvtss_f32(_mm_movehdup_ps(dm));
                        sm[l] = mins_and_scales(std::slice::from_raw_parts(blk.add(4), 12));
                    }
                    if T == Q4K {
                        for (t, q) in qs.iter_mut().take(4).enumerate() {
                            q[l] = _mm256_loadu_si256(blk.add(16 + 32 * t).cast());
                        }
                        continue;
                    }
                    if T == Q5K {
                        // qh 16..48, qs 48..176: chunk 2t the low nibbles of bytes 32t.., plus
                        // bit 2t of qh; chunk 2t + 1 the high nibbles, plus bit 2t + 1.
                        let hbits = _mm256_loadu_si256(blk.add(16).cast());
                        for t in 0..4 {
                            let bits = _mm256_loadu_si256(blk.add(48 + 32 * t).cast());
                            qs[2 * t][l] = _mm256_add_epi8(
                                _mm256_and_si256(bits, m15),
                                hi_bit(hbits, 2 * t as i32),
                            );
                            qs[2 * t + 1][l] = _mm256_add_epi8(
                                _mm256_and_si256(_mm256_srli_epi16::<4>(bits), m15),
                                hi_bit(hbits, 2 * t as i32 + 1),
                            );
                        }
                        continue;
                    }
                    // Q6_K: ql 0..128, qh 128..192, scales 192..208, d at 208; levels as
                    // `kquant::dot_q6k_rows` unpacks them, chunk 4h + i = elements
                    // 128h + 32i..+32.
                    let dh = std::ptr::read_unaligned(blk.add(208).cast::<u16>());
                    pn.d[b * ROWS + r] = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(dh as i32)));
                    pn.dmin[b * ROWS + r] = 0.0;
                    sm[l] = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192).cast()));
                    for h in 0..2 {
                        let bits1 = _mm256_loadu_si256(blk.add(64 * h).cast());
                        let bits2 = _mm256_loadu_si256(blk.add(64 * h + 32).cast());
                        let bits_h = _mm256_loadu_si256(blk.add(128 + 32 * h).cast());
                        let h0 = _mm256_slli_epi16::<4>(_mm256_and_si256(bits_h, m3));
                        let h1 =
                            _mm256_slli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(12)));
                        let h2 = _mm256_and_si256(bits_h, _mm256_set1_epi8(48));
                        let h3 =
                            _mm256_srli_epi16::<2>(_mm256_and_si256(bits_h, _mm256_set1_epi8(-64)));
                        qs[4 * h][l] = _mm256_or_si256(_mm256_and_si256(bits1, m15), h0);
                        qs[4 * h + 1][l] = _mm256_or_si256(_mm256_and_si256(bits2, m15), h1);
                        qs[4 * h + 2][l] = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(bits1), m15),
                            h2,
                        );
                        qs[4 * h + 3][l] = _mm256_or_si256(
                            _mm256_and_si256(_mm256_srli_epi16::<4>(bits2), m15),
                            h3,
                        );
                    }
                }
                let at = (b * PANELS + p) * qv;
                for (c, q) in qs.into_iter().take(qv / LANES).enumerate() {
                    for (s, v) in transpose8x8_words(q).into_iter().enumerate() {
                        *pn.qs.as_mut_ptr().add(at + LANES * c + s) = v;
                    }
                }
                let at = (b * PANELS + p) * LANES;
                for (s, v) in transpose8x8_words(sm).into_iter().enumerate() {
                    *pn.sm.as_mut_ptr().add(at + s) = v;
                }
            }
        }
    }
}

/// The `PP` panels from `p0` by activation rows `c0..c0 + CC`, for type `T`.
#[inline(always)]
// The register tile is indexed [panel][column] from loops in the order the loads want.
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile<D: Dots, const T: u8, const PP: usize, const CC: usize>(
    job: &GroupJob<'_>,
    pn: &PanelsK,
    j0: usize,
    p0: usize,
    c0: usize,
) {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        let (k, n) = (job.k, job.n);
        let nb = k / QK_K;
        let acts = job.acts;
        assert!(p0 + PP <= PANELS && c0 + CC <= job.m);
        let qv = qvecs(T);
        assert!(pn.qs.len() >= nb * PANELS * qv && pn.sm.len() >= nb * PANELS * LANES);
        assert!(pn.d.len() >= nb * ROWS && pn.dmin.len() >= nb * ROWS);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(acts.bsums.len() >= (c0 + CC) * nb * 16);
        let xq = acts.qs.as_ptr().add(c0 * k);
        let mut acc = [[_mm256_setzero_ps(); CC]; PP];
        for b in 0..nb {
            // SAFETY: block b of the panels and of each activation row is in bounds (above).
            unsafe {
                let qb = pn.qs.as_ptr().add((b * PANELS + p0) * qv);
                let smb = pn.sm.as_ptr().add((b * PANELS + p0) * LANES);
                let mut isum = [[_mm256_setzero_si256(); CC]; PP];
                let mut imin = [[_mm256_setzero_si256(); CC]; PP];
                let at = Block {
                    qb: qb.cast(),
                    qstride: 32 * qv,
                    smb,
                    sstride: LANES,
                    xq,
                    k,
                    b,
                    acts,
                    c0,
                    nb,
                };
                if T == Q4K {
                    k4_block::<D, Q4K, PP, CC>(at, &mut isum, &mut imin);
                } else if T == Q5K {
                    k4_block::<D, Q5K, PP, CC>(at, &mut isum, &mut imin);
                } else if T == IQ4XS {
                    // The levels are the grid values flipped by 128 (VNNI only) and the "mins"
                    // the scales: take 128 * sum ls * xsum off in the integers.
                    k4_block::<D, IQ4XS, PP, CC>(at, &mut isum, &mut imin);
                    for p in 0..PP {
                        for c in 0..CC {
                            isum[p][c] =
                                _mm256_sub_epi32(isum[p][c], _mm256_slli_epi32::<7>(imin[p][c]));
                            imin[p][c] = _mm256_setzero_si256();
                        }
                    }
                } else {
                    k16_block::<D, T, false, PP, CC>(at, &mut isum, &mut imin);
                }
                let dw: [__m256; PP] = std::array::from_fn(|p| {
                    _mm256_loadu_ps(pn.d.as_ptr().add(b * ROWS + (p0 + p) * LANES))
                });
                let mw: [__m256; PP] = std::array::from_fn(|p| {
                    _mm256_loadu_ps(pn.dmin.as_ptr().add(b * ROWS + (p0 + p) * LANES))
                });
                block_floats::<T, PP, CC>(&mut acc, &isum, &imin, &dw, &mw, at);
            }
        }
        for c in 0..CC {
            for (p, acc_p) in acc.iter().enumerate() {
                let row0 = j0 + (p0 + p) * LANES;
                if row0 >= n {
                    continue;
                }
                // SAFETY: only this thread's group writes these columns.
                unsafe { store_lanes(job, c0 + c, row0, acc_p[c]) };
            }
        }
    }
}

/// The float work of one block of a `PP x CC` tile, lane by lane `quant::dot_q4k`'s (or
/// `dot_q6k`'s, `T` = Q6_K, without the mins): `acc = fma(d_w * d_x, isum, acc)`, then
/// `acc = fma(-(dmin_w * d_x), imin, acc)`.
///
/// # Safety
/// As [`tile`]'s: `at`'s activation block is in bounds.
#[inline(always)]
pub(crate) unsafe fn block_floats<const T: u8, const PP: usize, const CC: usize>(
    acc: &mut [[__m256; CC]; PP],
    isum: &[[__m256i; CC]; PP],
    imin: &[[__m256i; CC]; PP],
    dw: &[__m256; PP],
    mw: &[__m256; PP],
    at: Block<'_>,
) {
    // SAFETY: the caller's promise.
    unsafe {
        for c in 0..CC {
            let dx = _mm256_set1_ps(*at.acts.d.as_ptr().add((at.c0 + c) * at.nb + at.b));
            for p in 0..PP {
                acc[p][c] = _mm256_fmadd_ps(
                    _mm256_mul_ps(dw[p], dx),
                    _mm256_cvtepi32_ps(isum[p][c]),
                    acc[p][c],
                );
                if T == Q4K || T == Q5K || T == Q5KP || T == Q2K {
                    acc[p][c] = _mm256_fnmadd_ps(
                        _mm256_mul_ps(mw[p], dx),
                        _mm256_cvtepi32_ps(imin[p][c]),
                        acc[p][c],
                    );
                }
            }
        }
    }
}

/// `five` (0x10 in every byte) where bit `bit` of a byte of `h` is set, else 0: a packed Q5_K
/// block's fifth bits of sub-block `bit` (ggml's `qh[l] & (1 << bit)`).
///
/// # Safety
/// On an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn fifth_bit(h: __m256i, bit: usize, five: __m256i) -> __m256i {
    // SAFETY: on an AVX2 CPU (the caller's promise).
    unsafe {
        let m = _mm256_set1_epi8((1u8 << bit) as i8);
        _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(h, m), m), five)
    }
}

/// The levels of sub-block `s` at elements `32 s + 4 step..+4` of the 8 rows of a panel block
/// whose level vectors start at `q`: Q5_K's and IQ4_XS's bytes as they are, Q4_K's nibbles (the
/// high ones for odd `s`), packed Q5_K's nibbles with their fifth bits put back.
///
/// # Safety
/// The block at `q` (and a packed Q5_K block's fifth bits before it) is readable, on an AVX2
/// CPU.
#[inline(always)]
unsafe fn k4_levels<const T: u8>(q: *const u8, s: usize, step: usize) -> __m256i {
    // SAFETY: the caller's promise.
    unsafe {
        if T == Q5K || T == IQ4XS {
            return vec_at(q, LANES * s + step);
        }
        let v = vec_at(q, LANES * (s / 2) + step);
        let v = if s % 2 == 1 {
            _mm256_srli_epi16::<4>(v)
        } else {
            v
        };
        let v = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
        if T == Q5KP {
            let h = vec_at(q.sub(Q5K_QH_GAP), step);
            return _mm256_or_si256(v, fifth_bit(h, s, _mm256_set1_epi8(0x10)));
        }
        v
    }
}

/// [`k4_block`]'s sub-blocks on AVX2 without VNNI, for Q4_K and Q5_K (unsigned levels up to
/// 15 and 31): the `vpmaddubsw` pairs of a run of steps summed as i16, then one `vpmaddwd`
/// with the sub-block's scale in both halves of each row's lane, which sums the pair and
/// multiplies it by the scale at once: 8 + 7 + 1 + 1 instructions a sub-block where
/// `Dots::dpbusd` and `vpmulld` take 3 x 8 + 2 + 1. The same integers: with activations in
/// -127..=127, a pair is at most 2 * 31 * 127 = 7874 in size, so a run of 8 Q4_K steps (8 *
/// 3810) or 4 Q5_K steps (4 * 7874) stays inside i16, and each lane's scale times its two
/// halves is the scale times the lane's sum.
///
/// # Safety
/// As [`k4_block`]'s, on an AVX2 CPU.
#[inline(always)]
unsafe fn k4_sums16<D: Dots, const T: u8, const PP: usize, const CC: usize>(
    at: Block<'_>,
    isum: &mut [[__m256i; CC]; PP],
) {
    // SAFETY: the caller's promise.
    unsafe {
        let Block {
            qb,
            qstride,
            smb,
            sstride,
            xq,
            k,
            b,
            ..
        } = at;
        // Steps summed as i16 before the scale: 8 for Q4_K's nibbles, 4 for Q5_K's 5 bits.
        let run = if T == Q4K { LANES } else { LANES / 2 };
        // Each lane's low or high i16 (the scale of an even or odd sub-block) in both halves:
        // byte indices within each 128-bit half.
        let dup_lo = _mm256_setr_epi32(
            0x0100_0100,
            0x0504_0504,
            0x0908_0908,
            0x0d0c_0d0c,
            0x0100_0100,
            0x0504_0504,
            0x0908_0908,
            0x0d0c_0d0c,
        );
        let dup_hi = _mm256_add_epi8(dup_lo, _mm256_set1_epi8(2));
        // No closures: they would be compiled without the path's features.
        for s in 0..8 {
            let (t, high) = (s / 2, s % 2 == 1);
            let mut sc = [_mm256_setzero_si256(); PP];
            for (p, sc) in sc.iter_mut().enumerate() {
                let pair = _mm256_loadu_si256(smb.add(p * sstride + t));
                *sc = _mm256_shuffle_epi8(pair, if high { dup_hi } else { dup_lo });
            }
            for r0 in (0..LANES).step_by(run) {
                let mut dot = [[_mm256_setzero_si256(); CC]; PP];
                for step in r0..r0 + run {
                    let mut w = [_mm256_setzero_si256(); PP];
                    for (p, w) in w.iter_mut().enumerate() {
                        *w = k4_levels::<T>(qb.add(p * qstride), s, step);
                    }
                    add_pairs16(&mut dot, &w, xq, k, b * QK_K + 32 * s + 4 * step);
                }
                add_scaled16(isum, &dot, &sc);
            }
        }
    }
}

/// [`k4_block`] for one activation row (decode) of Q4_K or packed Q5_K: each nibble vector
/// loaded once for its two sub-blocks, and 2 x PP dot chains side by side instead of PP.
///
/// # Safety
/// As [`k4_block`]'s.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn k4_one_row<D: Dots, const T: u8, const PP: usize, const CC: usize>(
    at: Block<'_>,
    isum: &mut [[__m256i; CC]; PP],
) {
    // SAFETY: the caller's promise.
    unsafe {
        let Block {
            qb,
            qstride,
            smb,
            sstride,
            xq,
            b,
            ..
        } = at;
        let m4 = _mm256_set1_epi8(0x0f);
        let lo16 = _mm256_set1_epi32(0xffff);
        let five = _mm256_set1_epi8(0x10);
        // One activation row (decode): each nibble vector loaded once for its two
        // sub-blocks, and 2 x PP dot chains side by side instead of PP.
        for t in 0..4 {
            let mut lo = [_mm256_setzero_si256(); PP];
            let mut hi = [_mm256_setzero_si256(); PP];
            let xt = xq.add(b * QK_K + 64 * t);
            for step in 0..LANES {
                let xl = _mm256_set1_epi32(std::ptr::read_unaligned(xt.add(4 * step).cast()));
                let xh = _mm256_set1_epi32(std::ptr::read_unaligned(xt.add(32 + 4 * step).cast()));
                for p in 0..PP {
                    let v = vec_at(qb.add(p * qstride), LANES * t + step);
                    let mut vl = _mm256_and_si256(v, m4);
                    let mut vh = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
                    if T == Q5KP {
                        let h = vec_at(qb.add(p * qstride).sub(Q5K_QH_GAP), step);
                        vl = _mm256_or_si256(vl, fifth_bit(h, 2 * t, five));
                        vh = _mm256_or_si256(vh, fifth_bit(h, 2 * t + 1, five));
                    }
                    lo[p] = D::dpbusd(lo[p], vl, xl);
                    hi[p] = D::dpbusd(hi[p], vh, xh);
                }
            }
            for p in 0..PP {
                let pair = _mm256_loadu_si256(smb.add(p * sstride + t));
                let s_lo = _mm256_mullo_epi32(lo[p], _mm256_and_si256(pair, lo16));
                let s_hi = _mm256_mullo_epi32(hi[p], _mm256_srli_epi32::<16>(pair));
                isum[p][0] = _mm256_add_epi32(isum[p][0], _mm256_add_epi32(s_lo, s_hi));
            }
        }
    }
}

/// Q4_K's or Q5_K's (`T`) integer part of one block for the `PP x CC` tile: per sub-block `s`,
/// 8 `dpbusd` steps of levels (Q4_K's nibbles, Q5_K's bytes, or packed Q5_K's nibbles with
/// their fifth bits put back) times the rows' scales into `isum`; the mins against the
/// activation's `bsums` pairs into `imin`.
///
/// # Safety
/// As [`tile`]'s: `at` is in bounds ([`Block`]).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn k4_block<D: Dots, const T: u8, const PP: usize, const CC: usize>(
    at: Block<'_>,
    isum: &mut [[__m256i; CC]; PP],
    imin: &mut [[__m256i; CC]; PP],
) {
    // SAFETY: the caller's promise.
    unsafe {
        let Block {
            qb,
            qstride,
            smb,
            sstride,
            xq,
            k,
            b,
            acts,
            c0,
            nb,
        } = at;
        let lo16 = _mm256_set1_epi32(0xffff);
        // Decode and AVX2 without VNNI take their own loops; the sub-block loop below is the
        // dot instructions' for tiles.
        let sub_blocks = if (T == Q4K || T == Q5KP) && CC == 1 {
            k4_one_row::<D, T, PP, CC>(at, isum);
            0
        } else if !D::VNNI && T != IQ4XS {
            k4_sums16::<D, T, PP, CC>(at, isum);
            0
        } else {
            8
        };
        for s in 0..sub_blocks {
            let (t, high) = (s / 2, s % 2 == 1);
            let mut dot = [[_mm256_setzero_si256(); CC]; PP];
            for step in 0..LANES {
                let mut w = [_mm256_setzero_si256(); PP];
                for (p, w) in w.iter_mut().enumerate() {
                    *w = k4_levels::<T>(qb.add(p * qstride), s, step);
                }
                for c in 0..CC {
                    let at = xq.add(c * k + b * QK_K + 32 * s + 4 * step);
                    let x = _mm256_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()));
                    for p in 0..PP {
                        dot[p][c] = D::dpbusd(dot[p][c], w[p], x);
                    }
                }
            }
            for p in 0..PP {
                let pair = _mm256_loadu_si256(smb.add(p * sstride + t));
                // IQ4_XS's scales are signed (`ls - 32`), the others' unsigned.
                let sc = match (T == IQ4XS, high) {
                    (true, true) => _mm256_srai_epi32::<16>(pair),
                    (true, false) => _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair)),
                    (false, true) => _mm256_srli_epi32::<16>(pair),
                    (false, false) => _mm256_and_si256(pair, lo16),
                };
                for c in 0..CC {
                    isum[p][c] = _mm256_add_epi32(isum[p][c], _mm256_mullo_epi32(dot[p][c], sc));
                }
            }
        }
        // The mins: per row, sum over t of (m[2t], m[2t + 1]) . (bp[2t], bp[2t + 1]), where
        // bp[s] = bsums[2s] + bsums[2s + 1] (16 i16 of the activation block).
        for c in 0..CC {
            let bp = bsum_pairs(&acts.bsums[(c0 + c) * nb * 16 + b * 16..]);
            let bpw: [i32; 4] = std::mem::transmute(bp);
            for (t, &pair) in bpw.iter().enumerate() {
                let x = _mm256_set1_epi32(pair);
                for p in 0..PP {
                    let mins = _mm256_loadu_si256(smb.add(p * sstride + 4 + t));
                    imin[p][c] = _mm256_add_epi32(imin[p][c], _mm256_madd_epi16(mins, x));
                }
            }
        }
    }
}

/// Groups `g_lo..g_hi` of [`ROWS`] weight rows for every activation row of `job`.
///
/// # Safety
/// The CPU has `D`'s features; `job` is a Q4_K, Q5_K or Q6_K matmul ([`has_panels`]).
#[inline(always)]
pub(crate) unsafe fn groups<D: Dots>(
    job: &GroupJob<'_>,
    g_lo: usize,
    g_hi: usize,
    pn: &mut PanelsK,
) {
    let rb = job.ty.row_bytes(job.k);
    for g in g_lo..g_hi {
        let j0 = g * ROWS;
        let rows = &job.data[j0 * rb..(job.n.min(j0 + ROWS)) * rb];
        // SAFETY: the caller's promise.
        unsafe { group::<D>(job, rows, j0, pn) };
    }
}

/// The group of weight rows from `j0` (`rows`: their ggml bytes, [`ROWS`] or fewer at the end)
/// for every activation row of `job`: repacked into `pn`, then its [`tiles`].
///
/// # Safety
/// The CPU has `D`'s features; `job` is a Q4_K, Q5_K or Q6_K matmul ([`has_panels`]).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn group<D: Dots>(job: &GroupJob<'_>, rows: &[u8], j0: usize, pn: &mut PanelsK) {
    let n = rows.len() / job.ty.row_bytes(job.k);
    assert!(j0 + n <= job.n);
    // SAFETY: the caller runs on a CPU with `D`'s features.
    unsafe {
        match job.ty {
            WType::Q4K => repack::<D, Q4K>(rows, n, job.k, 0, pn),
            WType::Q5K => repack::<D, Q5K>(rows, n, job.k, 0, pn),
            _ => repack::<D, Q6K>(rows, n, job.k, 0, pn),
        }
    };
    // SAFETY: the caller's promise; `pn` holds the group.
    unsafe { tiles::<D>(job, n, j0, pn) };
}

/// The tiles of a group of `n` weight rows from `j0` repacked in `pn`, for every activation row
/// of `job`.
///
/// # Safety
/// The CPU has `D`'s features; `job` is a Q4_K, Q5_K or Q6_K matmul, or a packed IQ4_XS one on
/// a VNNI path (`x86::packed_dots`), and `pn` holds the group.
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn tiles<D: Dots>(job: &GroupJob<'_>, n: usize, j0: usize, pn: &PanelsK) {
    // The tile: `PP x CC` integer dots, sums and float accumulators, plus the weight vectors,
    // the broadcast and the scales, in the registers (32 with AVX-512, 16 otherwise).
    let full = if D::PANELS == 2 { 4 } else { 3 };
    let mut p0 = 0;
    while p0 < PANELS && p0 * LANES < n {
        let two = D::PANELS == 2 && LANES < n;
        if two && job.wide {
            // SAFETY: `wide` is set on the AVX-512 VNNI path only (`Backend::Avx512Zmm`), whose
            // CPU the caller promises; `pn` holds both panels of the group.
            unsafe { repacked_pair(job, pn, j0) };
            p0 += 2;
            continue;
        }
        let mut c0 = 0;
        while c0 < job.m {
            let cc = tile_cols(job.m - c0, full);
            // SAFETY: the caller runs on a CPU with `D`'s features.
            unsafe {
                match job.ty {
                    WType::Q4K => dispatch::<D, Q4K>(job, pn, j0, p0, c0, two, cc),
                    WType::Q5K => dispatch::<D, Q5K>(job, pn, j0, p0, c0, two, cc),
                    WType::IQ4XS => dispatch::<D, IQ4XS>(job, pn, j0, p0, c0, two, cc),
                    WType::Q3K => dispatch::<D, Q3K>(job, pn, j0, p0, c0, two, cc),
                    WType::Q2K => dispatch::<D, Q2K>(job, pn, j0, p0, c0, two, cc),
                    _ => dispatch::<D, Q6K>(job, pn, j0, p0, c0, two, cc),
                }
            }
            c0 += cc;
        }
        p0 += if two { 2 } else { 1 };
    }
}

/// [`tile`] for a run-time tile shape (two panels or one, `cc` activation rows).
#[inline(always)]
unsafe fn dispatch<D: Dots, const T: u8>(
    job: &GroupJob<'_>,
    pn: &PanelsK,
    j0: usize,
    p0: usize,
    c0: usize,
    two: bool,
    cc: usize,
) {
    // SAFETY: as the caller promises.
    unsafe {
        match (two, cc) {
            (true, 4) => tile::<D, T, 2, 4>(job, pn, j0, p0, c0),
            (true, 3) => tile::<D, T, 2, 3>(job, pn, j0, p0, c0),
            (true, 2) => tile::<D, T, 2, 2>(job, pn, j0, p0, c0),
            (true, _) => tile::<D, T, 2, 1>(job, pn, j0, p0, c0),
            (false, 4) => tile::<D, T, 1, 4>(job, pn, j0, p0, c0),
            (false, 3) => tile::<D, T, 1, 3>(job, pn, j0, p0, c0),
            (false, 2) => tile::<D, T, 1, 2>(job, pn, j0, p0, c0),
            (false, _) => tile::<D, T, 1, 1>(job, pn, j0, p0, c0),
        }
    }
}

/// Level vectors of one block of one panel of type `T` (Q4_K nibbles, or bytes).
const fn qvecs(t: u8) -> usize {
    if t == Q4K { QVECS_Q4K } else { QVECS_BYTES }
}

/// A group repacked into these panels, as `x86::wide`'s tiles read it.
#[derive(Clone, Copy)]
struct Repacked<'a> {
    pn: &'a PanelsK,
}

impl wide::Pair for Repacked<'_> {
    #[inline(always)]
    unsafe fn levels<const T: u8>(self, b: usize, v: usize, high: bool) -> __m512i {
        // SAFETY: the caller's promise.
        unsafe {
            let qv = qvecs(T);
            let q = self.pn.qs.as_ptr().add(b * PANELS * qv);
            let w = wide::join(*q.add(v), *q.add(qv + v));
            if T != Q4K {
                return w;
            }
            let w = if high { _mm512_srli_epi16::<4>(w) } else { w };
            _mm512_and_si512(w, _mm512_set1_epi8(0x0f))
        }
    }
    #[inline(always)]
    unsafe fn pairs(self, b: usize) -> [__m512i; 8] {
        // SAFETY: the caller's promise.
        unsafe {
            let s = self.pn.sm.as_ptr().add(b * PANELS * LANES);
            let mut v = [_mm512_setzero_si512(); 8];
            for (t, v) in v.iter_mut().enumerate() {
                *v = wide::join(*s.add(t), *s.add(LANES + t));
            }
            v
        }
    }
    #[inline(always)]
    unsafe fn floats(self, b: usize) -> (__m512, __m512) {
        // SAFETY: the caller's promise; both panels' rows are side by side.
        unsafe {
            (
                _mm512_loadu_ps(self.pn.d.as_ptr().add(b * ROWS)),
                _mm512_loadu_ps(self.pn.dmin.as_ptr().add(b * ROWS)),
            )
        }
    }
}

/// The group of 16 weight rows from `j0` repacked in `pn` (both panels: `n - j0 > 8`) by every
/// activation row of `job`, whose type (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS) `pn` holds.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `pn` holds the group, repacked for `job`'s type.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn repacked_pair(job: &GroupJob<'_>, pn: &PanelsK, j0: usize) {
    let nb = job.k / QK_K;
    let qv = if job.ty == WType::Q4K {
        QVECS_Q4K
    } else {
        QVECS_BYTES
    };
    assert!(j0 + LANES < job.n);
    assert!(pn.qs.len() >= nb * PANELS * qv && pn.sm.len() >= nb * PANELS * LANES);
    assert!(pn.d.len() >= nb * ROWS && pn.dmin.len() >= nb * ROWS);
    let src = Repacked { pn };
    let mut c0 = 0;
    while c0 < job.m {
        let cc = wide::cols(job.m - c0);
        // SAFETY: the caller's promise; `pn` holds both panels (checked above), c0 + cc <= m.
        unsafe {
            match job.ty {
                WType::Q4K => wide::dispatch::<Q4K>(job, src, j0, c0, cc),
                WType::Q5K => wide::dispatch::<Q5K>(job, src, j0, c0, cc),
                WType::IQ4XS => wide::dispatch::<IQ4XS>(job, src, j0, c0, cc),
                WType::Q3K => wide::dispatch::<Q3K>(job, src, j0, c0, cc),
                WType::Q2K => wide::dispatch::<Q2K>(job, src, j0, c0, cc),
                _ => wide::dispatch::<Q6K>(job, src, j0, c0, cc),
            }
        }
        c0 += cc;
    }
}

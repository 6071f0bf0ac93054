//! `x86::k16`: the K-quants of 16-element sub-blocks (Q6_K, Q3_K, Q2_K) on 8-row panels,
//! repacked or packed at load: their level vectors put together from a packed block's fields
//! ([`q6k_packed_levels`], [`q3k_packed_levels`], [`q2k_packed_levels`]), and one block's
//! integer part for a tile ([`k16_block`]; decode of a packed block takes [`k16_one_row`]'s
//! loop). Q6_K's and Q3_K's signed scales multiply unsigned levels whose offset (32, 4) comes off
//! through the activation's 16-element sums; Q2_K's mins go to `imin` the same way.

use std::arch::x86_64::*;

use crate::quant::QK_K;
use crate::x86::isa::Dots;
use crate::x86::kblock::{Block, Q2K, Q3K, Q3K_QS_GAP, Q6K, add_pairs16, add_scaled16, vec_at};
use crate::x86::panel32::LANES;

/// Q6_K's levels (0..63) of elements `32 c + 4 step..+4` of the 8 rows of a packed block at `p`
/// (`crate::packed`: per half `h` of the block, 16 vectors of low nibbles then 8 of high bits, 4
/// bytes a row per vector): `kquant::dot_q6k_rows`'s unpack, vector by vector.
///
/// # Safety
/// The packed block at `p` is readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn q6k_packed_levels(p: *const u8, c: usize, step: usize) -> __m256i {
    // SAFETY: the caller's promise; the vectors read are inside the block's ql and qh fields.
    unsafe {
        let (h, i) = (c / 4, c % 4);
        let l = vec_at(p, 24 * h + 8 * (i % 2) + step);
        let hb = vec_at(p, 24 * h + 16 + step);
        let m15 = _mm256_set1_epi8(15);
        match i {
            0 => _mm256_or_si256(
                _mm256_and_si256(l, m15),
                _mm256_slli_epi16::<4>(_mm256_and_si256(hb, _mm256_set1_epi8(3))),
            ),
            1 => _mm256_or_si256(
                _mm256_and_si256(l, m15),
                _mm256_slli_epi16::<2>(_mm256_and_si256(hb, _mm256_set1_epi8(12))),
            ),
            2 => _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l), m15),
                _mm256_and_si256(hb, _mm256_set1_epi8(48)),
            ),
            _ => _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l), m15),
                _mm256_srli_epi16::<2>(_mm256_and_si256(hb, _mm256_set1_epi8(-64))),
            ),
        }
    }
}

/// Q3_K's levels plus 4 (0..8: the two low bits, 4 where the high bit is set) of elements
/// `32 c + 4 step..+4` of the 8 rows of a packed block at `blk` (its high-bit field first,
/// `crate::packed`): `c = 4 n + j` is bits `2 j` of
/// the low-bit bytes `32 n + 4 step..` (vector `8 n + step`) and bit `c` of the high-bit bytes
/// `4 step..` (vector `step`), as `dequant::q3k_level` reads them.
///
/// # Safety
/// The packed block at `blk` is readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn q3k_packed_levels(blk: *const u8, c: usize, step: usize) -> __m256i {
    // SAFETY: the caller's promise; the vectors read are inside the block's two level fields.
    unsafe {
        let (n, j) = (c / 4, c % 4);
        let q = vec_at(blk.add(Q3K_QS_GAP), 8 * n + step);
        let low = _mm256_and_si256(
            _mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * j as i32)),
            _mm256_set1_epi8(3),
        );
        // Bit c of each byte to bit 2 (16-bit shifts by at most 5: no bit crosses a byte).
        let h = vec_at(blk, step);
        let h = if c >= 2 {
            _mm256_srl_epi16(h, _mm_cvtsi32_si128(c as i32 - 2))
        } else {
            _mm256_sll_epi16(h, _mm_cvtsi32_si128(2 - c as i32))
        };
        _mm256_or_si256(low, _mm256_and_si256(h, _mm256_set1_epi8(4)))
    }
}

/// Q2_K's levels (0..4) of elements `32 c + 4 step..+4` of the 8 rows of a packed block at `blk`
/// (its level field first, `crate::packed`): bits `2 j` of bytes `32 n + 4 step..` for
/// `c = 4 n + j` (vector `8 n + step`), as `dequant::k_low2` reads them.
///
/// # Safety
/// The packed block at `blk` is readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn q2k_packed_levels(blk: *const u8, c: usize, step: usize) -> __m256i {
    // SAFETY: the caller's promise; the vector read is inside the block's level field.
    unsafe {
        let q = vec_at(blk, 8 * (c / 4) + step);
        _mm256_and_si256(
            _mm256_srl_epi16(q, _mm_cvtsi32_si128(2 * (c % 4) as i32)),
            _mm256_set1_epi8(3),
        )
    }
}

/// The scale of sub-block `2 t + half` from its pair vector `t`: Q6_K's and Q3_K's signed i16,
/// Q2_K's low nibble of its raw byte.
///
/// # Safety
/// On an AVX2 CPU.
#[inline(always)]
unsafe fn k16_scale<const T: u8>(pair: __m256i, half: usize) -> __m256i {
    // SAFETY: on an AVX2 CPU (the caller's promise).
    unsafe {
        if T == Q2K {
            let m4 = _mm256_set1_epi32(15);
            return if half == 1 {
                _mm256_and_si256(_mm256_srli_epi32::<16>(pair), m4)
            } else {
                _mm256_and_si256(pair, m4)
            };
        }
        if half == 1 {
            _mm256_srai_epi32::<16>(pair)
        } else {
            _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair))
        }
    }
}

/// The levels of sub-blocks `4 n..4 n + 4` (32 elements each) at elements `4 step..+4` of the 8
/// rows of a packed Q6_K, Q3_K or Q2_K (`T`) block at `p` (Q6_K: its low-nibble field, Q3_K:
/// its high-bit field, Q2_K: its level field): [`q6k_packed_levels`], [`q3k_packed_levels`] and
/// [`q2k_packed_levels`] for `c = 4 n + j`, with
/// every vector loaded once for the four and every shift a constant.
///
/// # Safety
/// The packed block at `p` is readable, on an AVX2 CPU.
#[inline(always)]
unsafe fn levels4<const T: u8>(p: *const u8, n: usize, step: usize) -> [__m256i; 4] {
    // SAFETY: the caller's promise; the vectors read are inside the block's level fields.
    unsafe {
        if T == Q2K {
            let q = vec_at(p, 8 * n + step);
            let m3 = _mm256_set1_epi8(3);
            return [
                _mm256_and_si256(q, m3),
                _mm256_and_si256(_mm256_srli_epi16::<2>(q), m3),
                _mm256_and_si256(_mm256_srli_epi16::<4>(q), m3),
                _mm256_and_si256(_mm256_srli_epi16::<6>(q), m3),
            ];
        }
        if T == Q3K {
            let q = vec_at(p.add(Q3K_QS_GAP), 8 * n + step);
            // Bit 4 n + j of each byte at bit 2 - j (16-bit shifts: no bit crosses a byte).
            let h = vec_at(p, step);
            let h = if n == 0 {
                _mm256_slli_epi16::<2>(h)
            } else {
                _mm256_srli_epi16::<2>(h)
            };
            let (m3, m4) = (_mm256_set1_epi8(3), _mm256_set1_epi8(4));
            let lv = |q: __m256i, h: __m256i| {
                _mm256_or_si256(_mm256_and_si256(q, m3), _mm256_and_si256(h, m4))
            };
            return [
                lv(q, h),
                lv(_mm256_srli_epi16::<2>(q), _mm256_srli_epi16::<1>(h)),
                lv(_mm256_srli_epi16::<4>(q), _mm256_srli_epi16::<2>(h)),
                lv(_mm256_srli_epi16::<6>(q), _mm256_srli_epi16::<3>(h)),
            ];
        }
        let l0 = vec_at(p, 24 * n + step);
        let l1 = vec_at(p, 24 * n + 8 + step);
        let hb = vec_at(p, 24 * n + 16 + step);
        let m15 = _mm256_set1_epi8(15);
        [
            _mm256_or_si256(
                _mm256_and_si256(l0, m15),
                _mm256_slli_epi16::<4>(_mm256_and_si256(hb, _mm256_set1_epi8(3))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(l1, m15),
                _mm256_slli_epi16::<2>(_mm256_and_si256(hb, _mm256_set1_epi8(12))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l0), m15),
                _mm256_and_si256(hb, _mm256_set1_epi8(48)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(l1), m15),
                _mm256_srli_epi16::<2>(_mm256_and_si256(hb, _mm256_set1_epi8(-64))),
            ),
        ]
    }
}

/// [`k16_block`]'s dots for one activation row (decode) of a packed Q6_K, Q3_K or Q2_K block: per
/// half `n` of the block and half of each 32-element chunk, the four chunks' level vectors
/// ([`levels4`]) side by side in four dot chains, then each times its sub-block's scale into
/// `isum` (the level offset is [`k16_block`]'s).
///
/// # Safety
/// As [`k16_block`]'s, with one activation row.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn k16_one_row<D: Dots, const T: u8, const PP: usize, const CC: usize>(
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
        let xb = xq.add(b * QK_K);
        for n in 0..2 {
            for half in 0..2 {
                let mut dot = [[_mm256_setzero_si256(); 4]; PP];
                for st in 0..4 {
                    let step = 4 * half + st;
                    let x: [__m256i; 4] = std::array::from_fn(|j| {
                        let at = xb.add(32 * (4 * n + j) + 4 * step);
                        _mm256_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()))
                    });
                    for p in 0..PP {
                        let lv = levels4::<T>(qb.add(p * qstride), n, step);
                        for j in 0..4 {
                            dot[p][j] = D::dpbusd(dot[p][j], lv[j], x[j]);
                        }
                    }
                }
                for p in 0..PP {
                    for j in 0..4 {
                        // Sub-block 2 (4 n + j) + half: the pair vector 4 n + j.
                        let pair = _mm256_loadu_si256(smb.add(p * sstride + 4 * n + j));
                        let sc = k16_scale::<T>(pair, half);
                        isum[p][0] =
                            _mm256_add_epi32(isum[p][0], _mm256_mullo_epi32(dot[p][j], sc));
                    }
                }
            }
        }
    }
}

/// The levels of elements `32 c32 + 4 step..+4` of the 8 rows of a block at `q`: a packed
/// block's put together from its fields ([`q6k_packed_levels`], [`q3k_packed_levels`],
/// [`q2k_packed_levels`]) with `PACKED`, else the repacked panel's vector.
///
/// # Safety
/// The block at `q` is readable, on an AVX2 CPU.
#[inline(always)]
unsafe fn level_vec<const T: u8, const PACKED: bool>(
    q: *const u8,
    c32: usize,
    step: usize,
) -> __m256i {
    // SAFETY: the caller's promise.
    unsafe {
        if PACKED && T == Q2K {
            q2k_packed_levels(q, c32, step)
        } else if PACKED && T == Q3K {
            q3k_packed_levels(q, c32, step)
        } else if PACKED {
            q6k_packed_levels(q, c32, step)
        } else {
            vec_at(q, LANES * c32 + step)
        }
    }
}

/// [`k16_block`]'s sub-blocks on AVX2 without VNNI: the `vpmaddubsw` pairs of a run of
/// steps summed as i16, then one `vpmaddwd` with the sub-block's scale in both halves of each
/// row's lane (as `panel_k::k4_sums16`). The same integers: with activations in -127..=127, a
/// Q6_K pair is at most 2 * 63 * 127 = 16002, so runs of 2 steps stay inside i16 (Q3_K's and
/// Q2_K's levels, up to 7 and 3, take the sub-block's 4 steps in one run), and the scales are
/// signed bytes (Q2_K's a nibble).
///
/// # Safety
/// As [`k16_block`]'s, on an AVX2 CPU.
#[inline(always)]
unsafe fn k16_sums16<const T: u8, const PACKED: bool, const PP: usize, const CC: usize>(
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
        let run = if T == Q6K { 2 } else { 4 };
        for s in 0..16 {
            let (c32, half) = (s / 2, s % 2);
            let mut sc = [_mm256_setzero_si256(); PP];
            for (p, sc) in sc.iter_mut().enumerate() {
                let s32 = k16_scale::<T>(_mm256_loadu_si256(smb.add(p * sstride + c32)), half);
                // The i32 scale's low half (the i16 value) into the high half too.
                *sc = _mm256_blend_epi16::<0b1010_1010>(s32, _mm256_slli_epi32::<16>(s32));
            }
            for r0 in (0..4).step_by(run) {
                let mut dot = [[_mm256_setzero_si256(); CC]; PP];
                for st in r0..r0 + run {
                    let step = 4 * half + st;
                    let mut w = [_mm256_setzero_si256(); PP];
                    for (p, w) in w.iter_mut().enumerate() {
                        *w = level_vec::<T, PACKED>(qb.add(p * qstride), c32, step);
                    }
                    add_pairs16(&mut dot, &w, xq, k, b * QK_K + 32 * c32 + 4 * step);
                }
                add_scaled16(isum, &dot, &sc);
            }
        }
    }
}

/// Q6_K's or Q3_K's (`T`) integer part of one block for the `PP x CC` tile: per 16-element
/// sub-block `s`, 4 `dpbusd` steps of unsigned levels times the rows' signed scales into
/// `isum`, then the level offset (32 or 4), `offset * sum_s bsums[s] * sc[s]`, off by
/// `vpmaddwd` on the scale pairs. The levels are the repacked panels' bytes, or with `PACKED`
/// put together from a packed block's fields ([`q6k_packed_levels`], [`q3k_packed_levels`]).
///
/// # Safety
/// As [`tile`]'s: `at` is in bounds ([`Block`]).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn k16_block<
    D: Dots,
    const T: u8,
    const PACKED: bool,
    const PP: usize,
    const CC: usize,
>(
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
        // Decode of a packed block and AVX2 without VNNI take their own loops; the sub-block
        // loop below is the dot instructions' for tiles.
        let sub_blocks = if PACKED && CC == 1 {
            k16_one_row::<D, T, PP, CC>(at, isum);
            0
        } else if !D::VNNI {
            k16_sums16::<T, PACKED, PP, CC>(at, isum);
            0
        } else {
            16
        };
        for s in 0..sub_blocks {
            let (c32, half) = (s / 2, s % 2);
            let mut dot = [[_mm256_setzero_si256(); CC]; PP];
            for st in 0..4 {
                let step = 4 * half + st;
                // No closure: it would be compiled without the path's features.
                let mut w = [_mm256_setzero_si256(); PP];
                for (p, w) in w.iter_mut().enumerate() {
                    *w = level_vec::<T, PACKED>(qb.add(p * qstride), c32, step);
                }
                for c in 0..CC {
                    let at = xq.add(c * k + b * QK_K + 32 * c32 + 4 * step);
                    let x = _mm256_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()));
                    for p in 0..PP {
                        dot[p][c] = D::dpbusd(dot[p][c], w[p], x);
                    }
                }
            }
            for p in 0..PP {
                let pair = _mm256_loadu_si256(smb.add(p * sstride + s / 2));
                let sc = k16_scale::<T>(pair, half);
                for c in 0..CC {
                    isum[p][c] = _mm256_add_epi32(isum[p][c], _mm256_mullo_epi32(dot[p][c], sc));
                }
            }
        }
        for c in 0..CC {
            let bs: [i32; 8] = std::ptr::read_unaligned(
                acts.bsums.as_ptr().add((c0 + c) * nb * 16 + b * 16).cast(),
            );
            let mut corr = [_mm256_setzero_si256(); PP];
            for (t, &pair) in bs.iter().enumerate() {
                let x = _mm256_set1_epi32(pair);
                for p in 0..PP {
                    let pair = _mm256_loadu_si256(smb.add(p * sstride + t));
                    // Q2_K: the mins, the raw scale bytes' high nibbles.
                    let pair = if T == Q2K {
                        _mm256_and_si256(
                            _mm256_srli_epi32::<4>(pair),
                            _mm256_set1_epi32(0x000f_000f),
                        )
                    } else {
                        pair
                    };
                    corr[p] = _mm256_add_epi32(corr[p], _mm256_madd_epi16(pair, x));
                }
            }
            for p in 0..PP {
                if T == Q2K {
                    imin[p][c] = _mm256_add_epi32(imin[p][c], corr[p]);
                    continue;
                }
                let off = if T == Q3K {
                    _mm256_slli_epi32::<2>(corr[p])
                } else {
                    _mm256_slli_epi32::<5>(corr[p])
                };
                isum[p][c] = _mm256_sub_epi32(isum[p][c], off);
            }
        }
    }
}

//! In-place dots of the 32-element block types (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL; one
//! unpack, [`levels`]): up to [`DIRECT_ROWS`] activation rows, 4 weight rows x `Dots::COLS`
//! activation rows read from the ggml blocks in place (decode: the weights stream from memory
//! once); past it, the repacked panels of `x86::panel32`. Bit-identical to the portable formulas
//! in `quant`.
//!
//! Batch invariance: every output element goes through the same float operations whatever tile
//! or path it lands in (per block the exact integer dot, `acc = fma(d_w * d_x, dot, acc)`, then
//! `+ summs` for Q4_1 and Q5_1: `quant::dot_q32`); tiles only share loads, never arithmetic.

use std::arch::x86_64::*;

use crate::WType;
use crate::quant::QK8;
use crate::x86::isa::Dots;
use crate::x86::job::GroupJob;

/// Weight rows per tile.
pub(crate) const R: usize = 4;
/// Activation rows of the largest tile; each path uses `Dots::COLS` (at most this) of them.
pub(crate) const C: usize = 3;

/// [`tile_direct`] of type `T` for a run-time tile width `cc` (1, 2, or [`C`]).
#[inline(always)]
pub(crate) unsafe fn direct<D: Dots, const T: u8>(
    job: &GroupJob<'_>,
    j0: usize,
    c0: usize,
    cc: usize,
    fetch: bool,
) {
    // SAFETY: as the caller promises.
    unsafe {
        match cc {
            1 => tile_direct::<D, 1, T>(job, j0, c0, fetch),
            2 => tile_direct::<D, 2, T>(job, j0, c0, fetch),
            _ => tile_direct::<D, C, T>(job, j0, c0, fetch),
        }
    }
}

/// How many weight-row groups ahead of the current one the in-place tiles prefetch.
const PREFETCH_GROUPS: usize = 1;
/// Most activation rows the in-place tiles take (see `x86::groups`); past it, each group's
/// weights are repacked once into panels (`x86::panel32`). Measured with `step_rows`
/// (BENCHMARKS.md): in place is faster up to 9 rows, the two are even at 10-12.
pub(crate) const DIRECT_ROWS: usize = crate::IN_PLACE_MAX_ROWS;

// The 32-element block types with one f16 scale (Q4_1 and Q5_1 also an f16 min), as the
// tiles' and panels' const parameter.
pub(crate) const Q4_0: u8 = 0;
pub(crate) const Q4_1: u8 = 1;
pub(crate) const Q8_0: u8 = 2;
pub(crate) const Q5_0: u8 = 3;
pub(crate) const Q5_1: u8 = 4;
pub(crate) const IQ4NL: u8 = 5;

/// The tiles' code of a 32-element block type (`quant::dot_q32`'s types), if it is one.
pub(crate) fn block32(ty: WType) -> Option<u8> {
    Some(match ty {
        WType::Q4_0 => Q4_0,
        WType::Q4_1 => Q4_1,
        WType::Q8_0 => Q8_0,
        WType::Q5_0 => Q5_0,
        WType::Q5_1 => Q5_1,
        WType::IQ4NL => IQ4NL,
        _ => return None,
    })
}

/// The weight type of tiles' code `t` ([`block32`]'s inverse).
const fn wtype(t: u8) -> WType {
    match t {
        Q4_0 => WType::Q4_0,
        Q4_1 => WType::Q4_1,
        Q5_0 => WType::Q5_0,
        Q5_1 => WType::Q5_1,
        IQ4NL => WType::IQ4NL,
        _ => WType::Q8_0,
    }
}

/// Bytes per block of type `t`.
pub(crate) const fn block_bytes(t: u8) -> usize {
    wtype(t).type_size()
}

/// Whether type `t` has a min (Q4_1, Q5_1): its [`levels`] are unsigned and `sum m_w * s_x`
/// is added at the end.
pub(crate) const fn has_min(t: u8) -> bool {
    t == Q4_1 || t == Q5_1
}

/// Whether [`levels`] of type `t` are the signed weight values (Q8_0, IQ4_NL); the others'
/// are unsigned levels, [`level_offset`] above the values (or with a min).
pub(crate) const fn signed_levels(t: u8) -> bool {
    t == Q8_0 || t == IQ4NL
}

/// How far the unsigned levels of a type without a min sit above its values (Q4_0: 8, Q5_0:
/// 16; 0 for the others).
pub(crate) const fn level_offset(t: u8) -> i32 {
    match t {
        Q4_0 => 8,
        Q5_0 => 16,
        _ => 0,
    }
}

/// 16 bytes of nibbles at `p` as 32 bytes, the low nibbles first (ggml's
/// `bytes_from_nibbles_32`).
///
/// # Safety
/// 16 bytes at `p` are readable, on an AVX2 CPU.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    // SAFETY: as the caller promises.
    unsafe {
        let v = _mm_loadu_si128(p.cast());
        _mm256_and_si256(
            _mm256_set_m128i(_mm_srli_epi16::<4>(v), v),
            _mm256_set1_epi8(0x0f),
        )
    }
}

/// The little-endian u32 at `p`.
///
/// # Safety
/// 4 bytes at `p` are readable.
#[inline(always)]
unsafe fn read_u32(p: *const u8) -> u32 {
    // SAFETY: as the caller promises.
    u32::from_le(unsafe { std::ptr::read_unaligned(p.cast::<u32>()) })
}

/// The 32 bytes a block of type `t` at `p` dots with, in element order: Q8_0's and IQ4_NL's
/// signed values, the others' unsigned levels (Q4_0 and Q5_0 [`level_offset`] above their
/// values; Q4_1 and Q5_1 with their min apart). One unpack for the in-place tiles and the
/// panels' repack; with `t` a constant, the match folds away.
///
/// # Safety
/// The block's bytes at `p` are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn levels<D: Dots>(t: u8, p: *const u8) -> __m256i {
    // SAFETY: as the caller promises; every offset below is inside the block.
    unsafe {
        match t {
            Q4_0 => nibbles(p.add(2)),
            Q4_1 => nibbles(p.add(4)),
            // The fifth bits, 0x10 in place. (No closure: it would not be inlined into the
            // path's feature-enabled copy.)
            Q5_0 => _mm256_or_si256(nibbles(p.add(6)), D::bit_bytes(read_u32(p.add(2)), 0x10)),
            Q5_1 => _mm256_or_si256(nibbles(p.add(8)), D::bit_bytes(read_u32(p.add(4)), 0x10)),
            IQ4NL => {
                let grid = _mm_loadu_si128(crate::dequant::KVALUES_IQ4NL.as_ptr().cast());
                _mm256_shuffle_epi8(_mm256_set_m128i(grid, grid), nibbles(p.add(2)))
            }
            _ => _mm256_loadu_si256(p.add(2).cast()),
        }
    }
}

/// The two f16 at byte `at` of each of the `R` rows (a block's `d` and, for Q4_1, `m`), as 4
/// floats each: one 32-bit load per row, one shuffle to put the `d`s before the `m`s, one
/// conversion (exact, so the same values as converting each alone). A function, not a closure:
/// a closure inside the feature-less generic kernels would not be inlined into the path's
/// feature-enabled copy, and would call the conversion out of line.
///
/// # Safety
/// Bytes `at..at + 4` of every row are readable, on an AVX2 + F16C CPU.
#[inline(always)]
unsafe fn f16x4x2(rows: &[*const u8; R], at: usize) -> (__m128, __m128) {
    // SAFETY: as the caller promises.
    unsafe {
        let word = |r: usize| std::ptr::read_unaligned(rows[r].add(at).cast::<i32>());
        let v = _mm_setr_epi32(word(0), word(1), word(2), word(3));
        let apart = _mm_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15);
        let f = _mm256_cvtph_ps(_mm_shuffle_epi8(v, apart));
        (_mm256_castps256_ps128(f), _mm256_extractf128_ps::<1>(f))
    }
}

/// The 4 x CC tile reading weight blocks in place (`T` a 32-element block type: [`block32`]),
/// for activation rows `c0..c0 + CC`. Same per-element float operations as `quant::dot_q32`. With
/// `fetch`, asks for the weight bytes [`PREFETCH_GROUPS`] groups ahead (the first tile of a
/// group; the others find its bytes in L1).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile_direct<D: Dots, const CC: usize, const T: u8>(
    job: &GroupJob<'_>,
    j0: usize,
    c0: usize,
    fetch: bool,
) {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        let (k, n) = (job.k, job.n);
        let nb = k / QK8;
        let ts = block_bytes(T);
        let rb = nb * ts;
        let acts = job.acts;
        let end = c0 + CC;
        assert!(job.data.len() >= n * rb && acts.qs.len() >= end * k && acts.d.len() >= end * nb);
        assert!(!has_min(T) || acts.s.len() >= end * nb);
        assert!(c0 + CC <= job.m);
        // A thread's groups are contiguous: the bytes PREFETCH_GROUPS groups on.
        let ahead = PREFETCH_GROUPS * R * rb;
        // Rows past `n` re-read row j0 (results dropped) so every load stays in bounds.
        let rows: [*const u8; R] = std::array::from_fn(|r| {
            let j = if j0 + r < n { j0 + r } else { j0 };
            // SAFETY: j < n, so the row is inside `data` (checked above).
            unsafe { job.data.as_ptr().add(j * rb) }
        });
        let offset = _mm256_set1_epi8(level_offset(T) as i8);
        // Per activation row, the 4 weight rows' sums as the lanes of one vector.
        let mut acc = [_mm_setzero_ps(); CC];
        let mut summs = [_mm_setzero_ps(); CC];
        let (xp, xd, xs) = (
            acts.qs.as_ptr().add(c0 * k),
            acts.d.as_ptr().add(c0 * nb),
            acts.s.as_ptr().wrapping_add(c0 * nb),
        );
        for b in 0..nb {
            // SAFETY: block b of each row and of each activation row is in bounds (checked above).
            unsafe {
                // Every block type has at least 4 bytes: d, then m (Q4_1) or the first quants.
                let (dw, mw) = f16x4x2(&rows, b * ts);
                let mut dot = [[_mm256_setzero_si256(); CC]; R];
                for (r, dot_r) in dot.iter_mut().enumerate() {
                    let p = rows[r].add(b * ts);
                    if fetch {
                        // Weights stream from DRAM: ask for the next groups' bytes now.
                        _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(ahead).cast());
                    }
                    let w = levels::<D>(T, p);
                    // The signed values (levels less their offset), or a min type's levels.
                    let w = if level_offset(T) != 0 {
                        _mm256_sub_epi8(w, offset)
                    } else {
                        w
                    };
                    let signed = !has_min(T);
                    let aw = if signed { _mm256_sign_epi8(w, w) } else { w };
                    for (c, d) in dot_r.iter_mut().enumerate() {
                        let x = _mm256_loadu_si256(xp.add(c * k + b * QK8).cast());
                        let x = if signed { _mm256_sign_epi8(x, w) } else { x };
                        *d = D::dpbusd(_mm256_setzero_si256(), aw, x);
                    }
                }
                for c in 0..CC {
                    // The 4 rows' 8 lanes each to one exact sum per row.
                    let h = _mm256_hadd_epi32(
                        _mm256_hadd_epi32(dot[0][c], dot[1][c]),
                        _mm256_hadd_epi32(dot[2][c], dot[3][c]),
                    );
                    let isum =
                        _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256::<1>(h));
                    let dd = _mm_mul_ps(dw, _mm_set1_ps(*xd.add(c * nb + b)));
                    acc[c] = _mm_fmadd_ps(dd, _mm_cvtepi32_ps(isum), acc[c]);
                    if has_min(T) {
                        summs[c] = _mm_fmadd_ps(mw, _mm_set1_ps(*xs.add(c * nb + b)), summs[c]);
                    }
                }
            }
        }
        for c in 0..CC {
            let v = if has_min(T) {
                _mm_add_ps(acc[c], summs[c])
            } else {
                acc[c]
            };
            let mut o = [0f32; R];
            // SAFETY: `o` is 4 floats.
            unsafe { _mm_storeu_ps(o.as_mut_ptr(), v) };
            for (r, &e) in o.iter().enumerate().take(n.saturating_sub(j0)) {
                // SAFETY: (c0 + c, j0 + r) is inside `y` and only this thread's group writes
                // that column.
                unsafe { *job.y.get().add((c0 + c) * n + j0 + r) = e };
            }
        }
    }
}

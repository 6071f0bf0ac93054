//! `x86::kblock`: what the K-quant kernels (`x86::panel_k`, `x86::k16`, `x86::packed_dots`)
//! share: the type each kernel is compiled for (a const parameter), where one block of a tile
//! is ([`Block`]), a 32-byte vector of a panel ([`vec_at`]), and AVX2's i16 runs of steps
//! ([`add_pairs16`], [`add_scaled16`]).

use std::arch::x86_64::*;

/// The K-quant types with panels, as the const parameter of the kernels.
pub(crate) const Q4K: u8 = 0;
pub(crate) const Q5K: u8 = 1;
pub(crate) const Q6K: u8 = 2;
/// IQ4_XS, packed matrices only (`x86::packed_dots`): no min, its grid values' offset is taken off
/// in the block's integers.
pub(crate) const IQ4XS: u8 = 3;
/// Q5_K packed (`x86::packed_dots`): Q4_K's nibbles in place with the fifth bits from the packed
/// `qh` field, [`Q5K_QH_GAP`] bytes before the nibbles.
pub(crate) const Q5KP: u8 = 4;
/// Q3_K, packed matrices only (`x86::packed_dots`): 16-element sub-blocks as Q6_K's, levels
/// 0..8 offset by 4.
pub(crate) const Q3K: u8 = 5;
/// Q2_K, packed matrices only: 16-element sub-blocks of levels 0..4 with 4-bit scales and mins
/// (the scale pair vectors hold the raw scale bytes, scale in the low nibble, min in the high).
pub(crate) const Q2K: u8 = 6;
/// How far a packed Q3_K block's low bits start after its high bits (`crate::packed` owns the
/// layout).
pub(crate) const Q3K_QS_GAP: usize = crate::packed::field_at(&crate::packed::Q3K, 32)
    - crate::packed::field_at(&crate::packed::Q3K, 0);
/// How far a packed Q5_K block's `qh` field starts before its nibbles (`crate::packed` owns the
/// layout).
pub(crate) const Q5K_QH_GAP: usize = crate::packed::field_at(&crate::packed::Q5K, 48)
    - crate::packed::field_at(&crate::packed::Q5K, 16);

/// Where one block of a tile is: the level bytes (`qb`) and scale pair vectors (`smb`) of block
/// `b` of the tile's first panel, the next panel's `qstride` bytes and `sstride` vectors on, the
/// quantized activations (`xq`) of its first activation row `c0` (rows `k` apart, `nb` blocks
/// each), and the activations' other fields (`acts`). The levels are the repacked panels'
/// vectors, or with `PACKED` a packed matrix's own bytes (`crate::packed`).
#[derive(Clone, Copy)]
pub(crate) struct Block<'a> {
    pub qb: *const u8,
    pub qstride: usize,
    pub smb: *const __m256i,
    pub sstride: usize,
    pub xq: *const i8,
    pub k: usize,
    pub b: usize,
    pub acts: &'a crate::quant::QActs,
    pub c0: usize,
    pub nb: usize,
}

/// The 32 bytes `v` vectors on from `p`.
///
/// # Safety
/// They are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn vec_at(p: *const u8, v: usize) -> __m256i {
    // SAFETY: the caller's promise.
    unsafe { _mm256_loadu_si256(p.add(32 * v).cast()) }
}

/// A step of AVX2's i16 runs (`panel_k::k4_sums16`, `k16::k16_sums16`): for each activation row
/// `c` of the tile, its 4 bytes at `xq + c * k + at` broadcast, and each panel's `vpmaddubsw`
/// pairs of `w[p]` with them added as i16 to `dot[p][c]`.
///
/// # Safety
/// 4 bytes are readable at each row's `at`, on an AVX2 CPU.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn add_pairs16<const PP: usize, const CC: usize>(
    dot: &mut [[__m256i; CC]; PP],
    w: &[__m256i; PP],
    xq: *const i8,
    k: usize,
    at: usize,
) {
    // SAFETY: the caller's promise.
    unsafe {
        for c in 0..CC {
            let x = _mm256_set1_epi32(std::ptr::read_unaligned(xq.add(c * k + at).cast::<i32>()));
            for p in 0..PP {
                dot[p][c] = _mm256_add_epi16(dot[p][c], _mm256_maddubs_epi16(w[p], x));
            }
        }
    }
}

/// The end of an i16 run: each lane's two i16 sums of `dot[p][c]` times the scale `sc[p]` holds
/// in both its halves (one `vpmaddwd`), added to `isum[p][c]`.
///
/// # Safety
/// On an AVX2 CPU.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn add_scaled16<const PP: usize, const CC: usize>(
    isum: &mut [[__m256i; CC]; PP],
    dot: &[[__m256i; CC]; PP],
    sc: &[__m256i; PP],
) {
    // SAFETY: on an AVX2 CPU (the caller's promise).
    unsafe {
        for p in 0..PP {
            for c in 0..CC {
                isum[p][c] = _mm256_add_epi32(isum[p][c], _mm256_madd_epi16(dot[p][c], sc[p]));
            }
        }
    }
}

//! `x86::wide`: the K-quants' batched tiles on 512-bit vectors, for the AVX-512 cores that run a
//! zmm `vpdpbusd` at the rate of a ymm one (Intel Xeons with two 512-bit multiply-add units:
//! twice the int8 multiply-adds a cycle; Zen 4 splits a zmm instruction in two, so it gains
//! nothing there). [`zmm_pays`] measures which kind of core this is; `Backend::Avx512Zmm` runs
//! them.
//!
//! Two 8-row panels are one zmm's 16 lanes: each level vector is the two panels' 32-byte
//! vectors joined, each scale pair vector and `d` / `dmin` the two panels' joined, and a
//! `dpbusd` with the activation's 4 bytes broadcast adds to 16 rows at once. A tile is those 16
//! rows by up to [`COLS`] activation rows, run by [`dispatch`] over a [`Pair`] of panels: a
//! packed Q4_K matrix's, read in place (`x86::packed_dots`), or a group repacked by
//! `x86::panel_k` (Q4_K, Q5_K, Q6_K, Q3_K, Q2_K, IQ4_XS). The integer work per
//! block and its float work are the ymm tiles' (`panel_k::k4_block`, `k16::k16_block`,
//! `panel_k::block_floats`) lane by lane, so every row has the bits of the ymm tiles, the
//! in-place dots and the portable formulas.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::quant::QK_K;
use crate::x86::isa::X86;
use crate::x86::job::GroupJob;
use crate::x86::kblock::{IQ4XS, Q2K, Q3K, Q4K, Q5K, Q6K};
use crate::x86::kquant::bsum_pairs;
use crate::x86::panel32::{LANES, store_lanes, tile_cols};

/// Activation rows per tile: 3 x `COLS` accumulators (the block's dots, its integer sum and the
/// float sums) and the loop's operands fill the 32 registers.
pub(crate) const COLS: usize = 8;

/// Whether this CPU runs the wide tiles faster than the ymm ones: AVX-512 VNNI, and 16 chains
/// of zmm `vpdpbusd` give at least 1.3 times the multiply-adds a second of 16 chains on ymm
/// (best of 5 short runs each; measured once per process, about a millisecond).
pub(crate) fn zmm_pays() -> bool {
    static PAYS: OnceLock<bool> = OnceLock::new();
    *PAYS.get_or_init(|| {
        if !X86::Avx512Vnni.available() {
            return false;
        }
        let (mut ymm, mut zmm) = (f64::MAX, f64::MAX);
        for _ in 0..5 {
            // SAFETY: the CPU has AVX-512 F/BW/VL/VNNI (checked above).
            let (y, z) = unsafe { probe(20_000) };
            ymm = ymm.min(y);
            zmm = zmm.min(z);
        }
        // Seconds per instruction; a zmm one does twice the multiply-adds.
        2.0 * ymm / zmm >= 1.3
    })
}

/// Seconds `iters` rounds of 16 independent `vpdpbusd` chains take on ymm, then on zmm.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn probe(iters: u32) -> (f64, f64) {
    const CHAINS: usize = 16;
    let t = std::time::Instant::now();
    let (a, b) = (_mm256_set1_epi8(3), _mm256_set1_epi8(-2));
    let mut acc = [_mm256_setzero_si256(); CHAINS];
    for _ in 0..iters {
        // The inputs look changed each round, so the loop is not folded.
        let (a, b) = std::hint::black_box((a, b));
        for c in &mut acc {
            *c = _mm256_dpbusd_epi32(*c, a, b);
        }
    }
    std::hint::black_box(acc);
    let ymm = t.elapsed().as_secs_f64();
    let t = std::time::Instant::now();
    let (a, b) = (_mm512_set1_epi8(3), _mm512_set1_epi8(-2));
    let mut acc = [_mm512_setzero_si512(); CHAINS];
    for _ in 0..iters {
        let (a, b) = std::hint::black_box((a, b));
        for c in &mut acc {
            *c = _mm512_dpbusd_epi32(*c, a, b);
        }
    }
    std::hint::black_box(acc);
    (ymm, t.elapsed().as_secs_f64())
}

/// `dpbusd_at!(acc, w, x)`: `acc` plus, per i32 lane, the four products of `w`'s bytes with
/// the 4 activation bytes at `x` (`vpdpbusd` with the activation word broadcast from memory in
/// the instruction: the compiler otherwise broadcasts a whole tile's words ahead into registers
/// it then spills to the stack). In an unsafe block of a function compiled with AVX-512
/// F/VNNI, with 4 bytes readable at `x`.
macro_rules! dpbusd_at {
    ($acc:expr, $w:expr, $x:expr) => {{
        let mut acc: __m512i = $acc;
        let w: __m512i = $w;
        let x: *const i8 = $x;
        // The instruction reads 4 bytes at `x` and writes `acc` only.
        std::arch::asm!(
            "vpdpbusd {acc}, {w}, dword ptr [{x}]{{1to16}}",
            acc = inout(zmm_reg) acc,
            w = in(zmm_reg) w,
            x = in(reg) x,
            options(pure, readonly, nostack, preserves_flags),
        );
        acc
    }};
}
pub(crate) use dpbusd_at;

/// A tile's 16 lanes `v` as columns `row0..row0 + 16` (those below `n`) of output row `row`.
///
/// # Safety
/// AVX-512 F; `row < job.m`, `row0 < job.n`, and no other thread writes these columns.
#[inline(always)]
pub(crate) unsafe fn store16(job: &GroupJob<'_>, row: usize, row0: usize, v: __m512) {
    // SAFETY: the caller's promise.
    unsafe {
        store_lanes(job, row, row0, _mm512_castps512_ps256(v));
        if row0 + LANES < job.n {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
            store_lanes(job, row, row0 + LANES, hi);
        }
    }
}

/// Two ymm vectors as one zmm, `a` in the low lanes.
#[inline(always)]
pub(crate) unsafe fn join(a: __m256i, b: __m256i) -> __m512i {
    // SAFETY: the caller runs with AVX-512 F.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b) }
}

/// Two ymm float vectors as one zmm, `a` in the low lanes.
#[inline(always)]
pub(crate) unsafe fn join_ps(a: __m256, b: __m256) -> __m512 {
    // SAFETY: the caller runs with AVX-512 F.
    unsafe { _mm512_insertf32x8::<1>(_mm512_castps256_ps512(a), b) }
}

/// The 8 rows' f16 field at `a` and the next panel's at `b`, widened to 16 floats.
#[inline(always)]
pub(crate) unsafe fn halves(a: *const u8, b: *const u8) -> __m512 {
    // SAFETY: the caller's promise: 16 bytes readable at each, AVX-512 F.
    unsafe {
        let (lo, hi) = (_mm_loadu_si128(a.cast()), _mm_loadu_si128(b.cast()));
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
    }
}

/// Two 8-row panels of K-quant blocks as a tile reads them (the panels' owners implement it).
pub(crate) trait Pair: Copy {
    /// The 16 rows' level bytes of block `b` at vector `v` of type `T`'s panel layout (Q4_K: its
    /// nibble vector, the high nibbles with `high`).
    ///
    /// # Safety
    /// Block `b` is inside both panels; AVX-512 F/BW.
    unsafe fn levels<const T: u8>(self, b: usize, v: usize, high: bool) -> __m512i;
    /// The 8 scale pair vectors of block `b` (`x86::panel_k`'s layout), the two panels joined.
    ///
    /// # Safety
    /// As [`Pair::levels`].
    unsafe fn pairs(self, b: usize) -> [__m512i; 8];
    /// The 16 rows' `d` and `dmin` of block `b`.
    ///
    /// # Safety
    /// As [`Pair::levels`].
    unsafe fn floats(self, b: usize) -> (__m512, __m512);
}
/// Activation rows of the next tile when `rest` are left.
pub(crate) fn cols(rest: usize) -> usize {
    match rest {
        r if r >= COLS => COLS,
        r if r >= 4 => 4,
        r => tile_cols(r, 2),
    }
}
/// [`tile`] for a run-time number of activation rows.
#[inline(always)]
pub(crate) unsafe fn dispatch<const T: u8>(
    job: &GroupJob<'_>,
    src: impl Pair,
    j0: usize,
    c0: usize,
    cc: usize,
) {
    // SAFETY: the caller's promise.
    unsafe {
        match cc {
            COLS => tile::<T, COLS>(job, src, j0, c0),
            4 => tile::<T, 4>(job, src, j0, c0),
            2 => tile::<T, 2>(job, src, j0, c0),
            _ => tile::<T, 1>(job, src, j0, c0),
        }
    }
}

/// The scale of sub-block `s` (32 elements: Q4_K, Q5_K unsigned, IQ4_XS signed; 16 elements:
/// `k16::k16_scale`'s, Q6_K and Q3_K signed, Q2_K the low nibble of its byte) from the block's
/// scale pair vectors: pair `s / 2`, its high half for odd `s`.
#[inline(always)]
unsafe fn scale<const T: u8>(pairs: &[__m512i; 8], s: usize) -> __m512i {
    // SAFETY: AVX-512 F (the caller's promise).
    unsafe {
        let (pair, high) = (pairs[s / 2], s % 2 == 1);
        match (T, high) {
            (Q4K | Q5K, true) => _mm512_srli_epi32::<16>(pair),
            (Q4K | Q5K, false) => _mm512_and_si512(pair, _mm512_set1_epi32(0xffff)),
            (Q2K, true) => _mm512_and_si512(_mm512_srli_epi32::<16>(pair), _mm512_set1_epi32(15)),
            (Q2K, false) => _mm512_and_si512(pair, _mm512_set1_epi32(15)),
            (_, true) => _mm512_srai_epi32::<16>(pair),
            (_, false) => _mm512_srai_epi32::<16>(_mm512_slli_epi32::<16>(pair)),
        }
    }
}

/// Elements per sub-block of type `T`.
const fn sub_len(t: u8) -> usize {
    match t {
        Q6K | Q3K | Q2K => 16,
        _ => 32,
    }
}

/// The 16 rows of `src` (from weight row `j0`) by activation rows `c0..c0 + CC`, type `T`.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `src` holds the blocks of `job`'s matrix.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile<const T: u8, const CC: usize>(
    job: &GroupJob<'_>,
    src: impl Pair,
    j0: usize,
    c0: usize,
) {
    // SAFETY: the caller runs with AVX-512 F/BW/VL/VNNI; `src` holds the blocks.
    unsafe {
        let k = job.k;
        let nb = k / QK_K;
        let acts = job.acts;
        assert!(c0 + CC <= job.m);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(acts.bsums.len() >= (c0 + CC) * nb * 16);
        let xq = acts.qs.as_ptr().add(c0 * k);
        let sub = sub_len(T);
        let mut acc = [_mm512_setzero_ps(); CC];
        for b in 0..nb {
            // SAFETY: block b of the panels and of each activation row is in bounds (above).
            unsafe {
                let pairs = src.pairs(b);
                let mut isum = [_mm512_setzero_si512(); CC];
                for s in 0..QK_K / sub {
                    let mut dot = [_mm512_setzero_si512(); CC];
                    for st in 0..sub / 4 {
                        // The level vector and the activation's elements of step st of
                        // sub-block s, in the panels' layout (`x86::panel_k`).
                        let (v, high, x_at) = match (sub, T) {
                            (32, Q4K) => (LANES * (s / 2) + st, s % 2 == 1, 32 * s + 4 * st),
                            (32, _) => (LANES * s + st, false, 32 * s + 4 * st),
                            _ => {
                                let step = 4 * (s % 2) + st;
                                (LANES * (s / 2) + step, false, 32 * (s / 2) + 4 * step)
                            }
                        };
                        let w = src.levels::<T>(b, v, high);
                        for c in 0..CC {
                            dot[c] = dpbusd_at!(dot[c], w, xq.add(c * k + b * QK_K + x_at));
                        }
                    }
                    let sc = scale::<T>(&pairs, s);
                    for c in 0..CC {
                        isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(dot[c], sc));
                    }
                }
                // The mins, offsets and flips against the activation's bsums (`k4_block`'s and
                // `k16_block`'s), then `block_floats`'s FMAs.
                let (dw, mw) = src.floats(b);
                for c in 0..CC {
                    let dx = _mm512_set1_ps(*acts.d.as_ptr().add((c0 + c) * nb + b));
                    let bsums = &acts.bsums[(c0 + c) * nb * 16 + b * 16..];
                    let mut imin = _mm512_setzero_si512();
                    if sub == 32 {
                        // bp[t] = bsums[4t] + .. + bsums[4t + 3] as an i16 pair per t.
                        let bp: [i32; 4] = std::mem::transmute(bsum_pairs(bsums));
                        for (t, &x) in bp.iter().enumerate() {
                            let x = _mm512_set1_epi32(x);
                            imin = _mm512_add_epi32(imin, _mm512_madd_epi16(pairs[4 + t], x));
                        }
                    } else {
                        let bs: [i32; 8] = std::ptr::read_unaligned(bsums.as_ptr().cast());
                        for (t, &x) in bs.iter().enumerate() {
                            let pair = if T == Q2K {
                                let m = _mm512_set1_epi32(0x000f_000f);
                                _mm512_and_si512(_mm512_srli_epi32::<4>(pairs[t]), m)
                            } else {
                                pairs[t]
                            };
                            let x = _mm512_set1_epi32(x);
                            imin = _mm512_add_epi32(imin, _mm512_madd_epi16(pair, x));
                        }
                    }
                    isum[c] = match T {
                        IQ4XS => _mm512_sub_epi32(isum[c], _mm512_slli_epi32::<7>(imin)),
                        Q6K => _mm512_sub_epi32(isum[c], _mm512_slli_epi32::<5>(imin)),
                        Q3K => _mm512_sub_epi32(isum[c], _mm512_slli_epi32::<2>(imin)),
                        _ => isum[c],
                    };
                    acc[c] =
                        _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[c]), acc[c]);
                    if T == Q4K || T == Q5K || T == Q2K {
                        acc[c] = _mm512_fnmadd_ps(
                            _mm512_mul_ps(mw, dx),
                            _mm512_cvtepi32_ps(imin),
                            acc[c],
                        );
                    }
                }
            }
        }
        for c in 0..CC {
            // SAFETY: only this thread's group writes these columns.
            unsafe { store16(job, c0 + c, j0, acc[c]) };
        }
    }
}

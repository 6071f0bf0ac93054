//! `x86::wide`: the batched Q4_K tile on 512-bit vectors, for the AVX-512 cores that run a zmm
//! `vpdpbusd` at the rate of a ymm one (Intel Xeons with two 512-bit multiply-add units: twice
//! the int8 multiply-adds a cycle; Zen 4 splits a zmm instruction in two, so it gains nothing
//! there). [`zmm_pays`] measures which kind of core this is; `Backend::Avx512Zmm` runs it.
//!
//! Two 8-row panels of a packed Q4_K matrix (`crate::packed`) are one zmm's 16 lanes: each
//! nibble vector is the two panels' 32-byte vectors joined, each scale pair vector and `d` /
//! `dmin` the two panels' joined, and a `dpbusd` with the activation's 4 bytes broadcast adds
//! to 16 rows at once. A tile is those 16 rows by up to [`COLS`] activation rows. The integer
//! work per block and its float work are `x86::panel_k`'s (`k4_block`, `block_floats`) lane by
//! lane, so every row has the bits of the ymm tiles, the in-place dots and the portable formula.

use std::arch::x86_64::*;
use std::sync::OnceLock;

use crate::WType;
use crate::packed::PANEL_ROWS;
use crate::quant::QK_K;
use crate::x86::isa::X86;
use crate::x86::job::GroupJob;
use crate::x86::kblock::vec_at;
use crate::x86::kquant::bsum_pairs;
use crate::x86::packed_fields::{Scales, at, q4k_scales};
use crate::x86::panel32::{LANES, store_lanes, tile_cols};

/// Activation rows per tile: 3 x `COLS` accumulators (the block's dots, its integer sum and the
/// float sums) and the loop's operands fill the 32 registers.
const COLS: usize = 8;

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

/// Two ymm vectors as one zmm, `a` in the low lanes.
#[inline(always)]
unsafe fn join(a: __m256i, b: __m256i) -> __m512i {
    // SAFETY: the caller runs with AVX-512 F.
    unsafe { _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b) }
}

/// The 8 rows' f16 field at `a` and the next panel's at `b`, widened to 16 floats.
#[inline(always)]
unsafe fn halves(a: *const u8, b: *const u8) -> __m512 {
    // SAFETY: the caller's promise: 16 bytes readable at each, AVX-512 F.
    unsafe {
        let (lo, hi) = (_mm_loadu_si128(a.cast()), _mm_loadu_si128(b.cast()));
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(_mm256_castsi128_si256(lo), hi))
    }
}

/// Panels `p` and `p + 1` of a packed Q4_K matrix by every activation row of `job`, a tile of
/// up to [`COLS`] rows at a time; `pre`, when given, holds the group's scale pairs.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `job` is a packed Q4_K matmul with a panel `p + 1`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q4k_pair(job: &GroupJob<'_>, p: usize, pre: Option<Scales>) {
    let mut c0 = 0;
    while c0 < job.m {
        let cc = match job.m - c0 {
            r if r >= COLS => COLS,
            r if r >= 4 => 4,
            r => tile_cols(r, 2),
        };
        // SAFETY: the caller's promise; c0 + cc <= m.
        unsafe {
            match cc {
                COLS => tile::<COLS>(job, p, c0, pre),
                4 => tile::<4>(job, p, c0, pre),
                2 => tile::<2>(job, p, c0, pre),
                _ => tile::<1>(job, p, c0, pre),
            }
        }
        c0 += cc;
    }
}

/// Panels `p` and `p + 1` (16 weight rows) by activation rows `c0..c0 + CC`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile<const CC: usize>(job: &GroupJob<'_>, p: usize, c0: usize, pre: Option<Scales>) {
    // SAFETY: the caller runs with AVX-512 F/BW/VL/VNNI.
    unsafe {
        let (k, n) = (job.k, job.n);
        let nb = k / QK_K;
        let pb = PANEL_ROWS * WType::Q4K.type_size();
        let panel = nb * pb;
        let acts = job.acts;
        let panels = n.div_ceil(PANEL_ROWS);
        assert!(job.ty == WType::Q4K && job.layout == crate::Layout::Rows8);
        assert!(p + 2 <= panels && job.data.len() >= panels * panel && c0 + CC <= job.m);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(acts.bsums.len() >= (c0 + CC) * nb * 16);
        let base = job.data.as_ptr().add(p * panel);
        let xq = acts.qs.as_ptr().add(c0 * k);
        let m4 = _mm512_set1_epi8(0x0f);
        let lo16 = _mm512_set1_epi32(0xffff);
        let mut acc = [_mm512_setzero_ps(); CC];
        for b in 0..nb {
            // SAFETY: block b of both panels and of each activation row is in bounds (above).
            unsafe {
                let (blk0, blk1) = (base.add(b * pb), base.add(panel + b * pb));
                let (s0, s1) = match pre {
                    Some(pre) => (
                        std::ptr::read(pre.at(p, b).cast::<[__m256i; 8]>()),
                        std::ptr::read(pre.at(p + 1, b).cast::<[__m256i; 8]>()),
                    ),
                    None => (q4k_scales(blk0), q4k_scales(blk1)),
                };
                // Vector t: the scale pairs (sc[2t], sc[2t + 1]) of the 16 rows; 4 + t the mins'.
                let sm: [__m512i; 8] = std::array::from_fn(|t| join(s0[t], s1[t]));
                let (q0, q1) = (blk0.add(at::Q4K_QS), blk1.add(at::Q4K_QS));
                let mut isum = [_mm512_setzero_si512(); CC];
                for s in 0..8 {
                    let (t, high) = (s / 2, s % 2 == 1);
                    let mut dot = [_mm512_setzero_si512(); CC];
                    for step in 0..LANES {
                        let v = join(vec_at(q0, LANES * t + step), vec_at(q1, LANES * t + step));
                        let v = if high { _mm512_srli_epi16::<4>(v) } else { v };
                        let w = _mm512_and_si512(v, m4);
                        for c in 0..CC {
                            let x = xq.add(c * k + b * QK_K + 32 * s + 4 * step);
                            let x = _mm512_set1_epi32(std::ptr::read_unaligned(x.cast::<i32>()));
                            dot[c] = _mm512_dpbusd_epi32(dot[c], w, x);
                        }
                    }
                    let sc = if high {
                        _mm512_srli_epi32::<16>(sm[t])
                    } else {
                        _mm512_and_si512(sm[t], lo16)
                    };
                    for c in 0..CC {
                        isum[c] = _mm512_add_epi32(isum[c], _mm512_mullo_epi32(dot[c], sc));
                    }
                }
                // `panel_k::block_floats`'s two FMAs, after `k4_block`'s mins against the
                // activation's bsum pairs.
                let dw = halves(blk0.add(at::Q4K_D), blk1.add(at::Q4K_D));
                let mw = halves(blk0.add(at::Q4K_DMIN), blk1.add(at::Q4K_DMIN));
                for c in 0..CC {
                    let dx = _mm512_set1_ps(*acts.d.as_ptr().add((c0 + c) * nb + b));
                    acc[c] =
                        _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum[c]), acc[c]);
                    let bp = bsum_pairs(&acts.bsums[(c0 + c) * nb * 16 + b * 16..]);
                    let bpw: [i32; 4] = std::mem::transmute(bp);
                    let mut imin = _mm512_setzero_si512();
                    for (t, &pair) in bpw.iter().enumerate() {
                        imin = _mm512_add_epi32(
                            imin,
                            _mm512_madd_epi16(sm[4 + t], _mm512_set1_epi32(pair)),
                        );
                    }
                    acc[c] = _mm512_fnmadd_ps(
                        _mm512_mul_ps(mw, dx),
                        _mm512_cvtepi32_ps(imin),
                        acc[c],
                    );
                }
            }
        }
        for c in 0..CC {
            for half in 0..2 {
                let row0 = (p + half) * PANEL_ROWS;
                if row0 < n {
                    let v = if half == 0 {
                        _mm512_castps512_ps256(acc[c])
                    } else {
                        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[c])))
                    };
                    // SAFETY: only this thread's group writes these columns.
                    unsafe { store_lanes(job, c0 + c, row0, v) };
                }
            }
        }
    }
}

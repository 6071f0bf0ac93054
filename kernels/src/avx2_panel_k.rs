//! `avx2_panel_k`: the Q4_K matmul for batches past the in-place dots (prefill, and decode of
//! many sequences), on repacked 8-row panels as `avx2_panel` does for Q4_0 / Q4_1 / Q8_0.
//!
//! Each group of [`ROWS`] weight rows is repacked once per call ([`repack`]) into panels of 8
//! rows. Per block (256 weights) and panel:
//! - the 128 nibble bytes as 4 x 8 vectors: vector `(t, j)` holds bytes `32t + 4j..32t + 4j + 4`
//!   of the 8 rows, so its low nibbles are elements `32s + 4j..+4` of sub-block `s = 2t` and
//!   its high nibbles those of sub-block `2t + 1`;
//! - the 6-bit scales and mins as 8 vectors of i16 pairs (`ggml`'s `utmp` unpack per row, then
//!   the same word transpose): vector `t` holds `(sc[2t], sc[2t + 1])` of the 8 rows, vector
//!   `4 + t` their `(m[2t], m[2t + 1])`;
//! - `d` and `dmin` widened to f32, 8 rows side by side.
//!
//! A `dpbusd` of a nibble vector with the activation's 4 bytes broadcast adds 4 products to
//! each row's lane; 8 of them give sub-block `s`'s integer dot of 8 rows, times the rows'
//! scales (`vpmulld`) into `isum`. The mins meet the activation's `bsums` pairs through
//! `vpmaddwd` into `imin`. Both are the exact integers of `quant::dot_q4k`, and the two FMAs
//! per block are its float operations, lane by lane, so every row has the bits of the in-place
//! dot (`avx2_kquant::dot_q4k`) and of the portable formula.

use std::arch::x86_64::*;

use crate::avx2::GroupJob;
use crate::avx2_kquant::mins_and_scales;
use crate::avx2_panel::{LANES, ROWS, transpose8x8_words};
use crate::isa::Dots;
use crate::quant::QK_K;

/// Bytes of one Q4_K block.
const BLOCK: usize = 144;
const PANELS: usize = ROWS / LANES;
/// Nibble vectors of one block of one panel (4 pairs of sub-blocks x 8 steps).
const QVECS: usize = 32;

/// A repacked group of Q4_K weight rows (reused across calls).
#[derive(Default)]
pub(crate) struct PanelsK {
    /// `nb x PANELS x QVECS` nibble vectors, as the module doc says.
    qs: Vec<__m256i>,
    /// `nb x PANELS x 8` scale and min pair vectors.
    sm: Vec<__m256i>,
    /// `nb x ROWS` weight `d` and `dmin` (0 for rows past `n`).
    d: Vec<f32>,
    dmin: Vec<f32>,
}

/// Repacks weight rows `j0..j0 + ROWS` (rows past `n` become zeros) into `pn`.
///
/// # Safety
/// The CPU has `D`'s features (AVX2 and F16C at least); called from their compiled copies.
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn repack<D: Dots>(data: &[u8], n: usize, k: usize, j0: usize, pn: &mut PanelsK) {
    let nb = k / QK_K;
    let rb = nb * BLOCK;
    assert!(data.len() >= n * rb);
    // SAFETY: the CPU has AVX2 and F16C (the caller's promise). Reads stay inside rows j < n of
    // `data` (checked above); writes inside `pn`'s buffers as sized here.
    unsafe {
        pn.qs.resize(nb * PANELS * QVECS, _mm256_setzero_si256());
        pn.sm.resize(nb * PANELS * LANES, _mm256_setzero_si256());
        pn.d.resize(nb * ROWS, 0.0);
        pn.dmin.resize(nb * ROWS, 0.0);
        for b in 0..nb {
            for p in 0..PANELS {
                // No closures here: they would be compiled without the path's features and
                // call every intrinsic out of line.
                let mut sm = [_mm256_setzero_si256(); LANES];
                let mut qs = [[_mm256_setzero_si256(); LANES]; 4];
                for l in 0..LANES {
                    let r = p * LANES + l;
                    let j = j0 + r;
                    if j >= n {
                        pn.d[b * ROWS + r] = 0.0;
                        pn.dmin[b * ROWS + r] = 0.0;
                        continue;
                    }
                    let blk = data.as_ptr().add(j * rb + b * BLOCK);
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                        blk.cast::<i32>(),
                    )));
                    pn.d[b * ROWS + r] = _mm_cvtss_f32(dm);
                    pn.dmin[b * ROWS + r] = _mm_cvtss_f32(_mm_movehdup_ps(dm));
                    sm[l] = mins_and_scales(std::slice::from_raw_parts(blk.add(4), 12));
                    for (t, q) in qs.iter_mut().enumerate() {
                        q[l] = _mm256_loadu_si256(blk.add(16 + 32 * t).cast());
                    }
                }
                let at = (b * PANELS + p) * QVECS;
                for (t, q) in qs.into_iter().enumerate() {
                    for (s, v) in transpose8x8_words(q).into_iter().enumerate() {
                        *pn.qs.as_mut_ptr().add(at + LANES * t + s) = v;
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

/// The `PP` panels from `p0` by activation rows `c0..c0 + CC`.
#[inline(always)]
// The register tile is indexed [panel][column] from loops in the order the loads want.
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile<D: Dots, const PP: usize, const CC: usize>(
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
        assert!(pn.qs.len() >= nb * PANELS * QVECS && pn.sm.len() >= nb * PANELS * LANES);
        assert!(pn.d.len() >= nb * ROWS && pn.dmin.len() >= nb * ROWS);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(acts.bsums.len() >= (c0 + CC) * nb * 16);
        let m4 = _mm256_set1_epi8(0x0f);
        let lo16 = _mm256_set1_epi32(0xffff);
        let xq = acts.qs.as_ptr().add(c0 * k);
        let mut acc = [[_mm256_setzero_ps(); CC]; PP];
        for b in 0..nb {
            // SAFETY: block b of the panels and of each activation row is in bounds (above).
            unsafe {
                let qb = pn.qs.as_ptr().add((b * PANELS + p0) * QVECS);
                let smb = pn.sm.as_ptr().add((b * PANELS + p0) * LANES);
                let mut isum = [[_mm256_setzero_si256(); CC]; PP];
                for s in 0..8 {
                    let (t, high) = (s / 2, s % 2 == 1);
                    let mut dot = [[_mm256_setzero_si256(); CC]; PP];
                    for step in 0..LANES {
                        let w: [__m256i; PP] = std::array::from_fn(|p| {
                            let v = *qb.add(p * QVECS + LANES * t + step);
                            let v = if high { _mm256_srli_epi16::<4>(v) } else { v };
                            _mm256_and_si256(v, m4)
                        });
                        for c in 0..CC {
                            let at = xq.add(c * k + b * QK_K + 32 * s + 4 * step);
                            let x = _mm256_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()));
                            for p in 0..PP {
                                dot[p][c] = D::dpbusd(dot[p][c], w[p], x);
                            }
                        }
                    }
                    for p in 0..PP {
                        let pair = *smb.add(p * LANES + t);
                        let sc = if high {
                            _mm256_srli_epi32::<16>(pair)
                        } else {
                            _mm256_and_si256(pair, lo16)
                        };
                        for c in 0..CC {
                            isum[p][c] =
                                _mm256_add_epi32(isum[p][c], _mm256_mullo_epi32(dot[p][c], sc));
                        }
                    }
                }
                // The mins: per row, sum over t of (m[2t], m[2t + 1]) . (bp[2t], bp[2t + 1]),
                // where bp[s] = bsums[2s] + bsums[2s + 1] (16 i16 of the activation block).
                let mut imin = [[_mm256_setzero_si256(); CC]; PP];
                for c in 0..CC {
                    let bs = _mm256_loadu_si256(
                        acts.bsums.as_ptr().add((c0 + c) * nb * 16 + b * 16).cast(),
                    );
                    let bp = _mm_hadd_epi16(
                        _mm256_castsi256_si128(bs),
                        _mm256_extracti128_si256::<1>(bs),
                    );
                    let bpw: [i32; 4] = std::mem::transmute(bp);
                    for t in 0..4 {
                        let x = _mm256_set1_epi32(bpw[t]);
                        for p in 0..PP {
                            let mins = *smb.add(p * LANES + 4 + t);
                            imin[p][c] = _mm256_add_epi32(imin[p][c], _mm256_madd_epi16(mins, x));
                        }
                    }
                }
                let dw: [__m256; PP] = std::array::from_fn(|p| {
                    _mm256_loadu_ps(pn.d.as_ptr().add(b * ROWS + (p0 + p) * LANES))
                });
                let mw: [__m256; PP] = std::array::from_fn(|p| {
                    _mm256_loadu_ps(pn.dmin.as_ptr().add(b * ROWS + (p0 + p) * LANES))
                });
                for c in 0..CC {
                    let dx = _mm256_set1_ps(*acts.d.as_ptr().add((c0 + c) * nb + b));
                    for p in 0..PP {
                        acc[p][c] = _mm256_fmadd_ps(
                            _mm256_mul_ps(dw[p], dx),
                            _mm256_cvtepi32_ps(isum[p][c]),
                            acc[p][c],
                        );
                        acc[p][c] = _mm256_fnmadd_ps(
                            _mm256_mul_ps(mw[p], dx),
                            _mm256_cvtepi32_ps(imin[p][c]),
                            acc[p][c],
                        );
                    }
                }
            }
        }
        for c in 0..CC {
            for (p, acc_p) in acc.iter().enumerate() {
                let row0 = j0 + (p0 + p) * LANES;
                if row0 >= n {
                    continue;
                }
                // SAFETY: row (c0 + c) of `y` has columns row0..n, and only this thread's group
                // writes them.
                unsafe {
                    let dst = job.y.get().add((c0 + c) * n + row0);
                    if row0 + LANES <= n {
                        _mm256_storeu_ps(dst, acc_p[c]);
                    } else {
                        let mut t = [0f32; LANES];
                        _mm256_storeu_ps(t.as_mut_ptr(), acc_p[c]);
                        for (l, &e) in t.iter().enumerate().take(n - row0) {
                            *dst.add(l) = e;
                        }
                    }
                }
            }
        }
    }
}

/// Groups `g_lo..g_hi` of [`ROWS`] weight rows for every activation row of `job` (Q4_K).
///
/// # Safety
/// The CPU has `D`'s features; `job` is a Q4_K matmul (`k` a multiple of 256).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn groups<D: Dots>(
    job: &GroupJob<'_>,
    g_lo: usize,
    g_hi: usize,
    pn: &mut PanelsK,
) {
    // The tile: `PP x CC` integer dots, sums and float accumulators, plus the weight vectors,
    // the broadcast and the scales, in the registers (32 with AVX-512, 16 otherwise).
    let full = if D::PANELS == 2 { 4 } else { 3 };
    for g in g_lo..g_hi {
        let j0 = g * ROWS;
        // SAFETY: the caller runs on a CPU with `D`'s features.
        unsafe { repack::<D>(job.data, job.n, job.k, j0, pn) };
        let mut p0 = 0;
        while p0 < PANELS && j0 + p0 * LANES < job.n {
            let two = D::PANELS == 2 && j0 + LANES < job.n;
            let mut c0 = 0;
            while c0 < job.m {
                let rest = job.m - c0;
                let cc = if rest >= full {
                    full
                } else if rest >= 2 {
                    2
                } else {
                    1
                };
                // SAFETY: the caller runs on a CPU with `D`'s features.
                unsafe {
                    match (two, cc) {
                        (true, 4) => tile::<D, 2, 4>(job, pn, j0, p0, c0),
                        (true, 3) => tile::<D, 2, 3>(job, pn, j0, p0, c0),
                        (true, 2) => tile::<D, 2, 2>(job, pn, j0, p0, c0),
                        (true, _) => tile::<D, 2, 1>(job, pn, j0, p0, c0),
                        (false, 4) => tile::<D, 1, 4>(job, pn, j0, p0, c0),
                        (false, 3) => tile::<D, 1, 3>(job, pn, j0, p0, c0),
                        (false, 2) => tile::<D, 1, 2>(job, pn, j0, p0, c0),
                        (false, _) => tile::<D, 1, 1>(job, pn, j0, p0, c0),
                    }
                }
                c0 += cc;
            }
            p0 += if two { 2 } else { 1 };
        }
    }
}

//! `avx2_panel`: the Q4_0 / Q4_1 / Q8_0 matmul for batches past the in-place tiles (prefill,
//! and decode of many sequences), where every weight row meets many activation rows.
//!
//! Each group of [`ROWS`] weight rows is repacked once ([`repack`]) into panels of 8 rows: for
//! each block and each 4-element step `j` of it, one 32-byte vector holds bytes `4j..4j+4` of
//! the 8 rows. A `dpbusd` of that vector with activation bytes `4j..4j+4` broadcast to every
//! lane then adds 4 products to each row's own lane, so 8 steps leave the block's exact integer
//! dot of 8 weight rows with one activation row in one register: no horizontal sums, and per
//! block and 8 rows only one conversion, one multiply and one FMA of float work beside the 8
//! integer instructions. The register tile is `Dots::PANELS` panels by `Dots::PANEL_COLS`
//! activation rows.
//!
//! Weight bytes as the dot takes them: Q4_1 nibbles as they are; Q4_0 nibbles as they are, the
//! block's `-8 * sum(x)` subtracted after (exact integers); Q8_0 with `vpdpbusd` offset by 128
//! (`w ^ 0x80`), `-128 * sum(x)` after; Q8_0 on AVX2 signed, with ggml's sign trick (its
//! `vpmaddubsw` would saturate an offset byte). Every way gives the block's exact integer dot,
//! and the float operations are those of `quant::dot_q32`, so results are the same bits as the
//! portable formula and the in-place tiles.

use std::arch::x86_64::*;

use crate::WType;
use crate::avx2::GroupJob;
use crate::isa::Dots;
use crate::quant::QK8;

/// Weight rows per repacked group (two 8-row panels).
pub(crate) const ROWS: usize = 16;
/// Weight rows per panel: the i32 lanes of a 256-bit vector.
const LANES: usize = 8;
const PANELS: usize = ROWS / LANES;
/// Bytes of one block of one panel.
const PANEL_BYTES: usize = LANES * QK8;

/// A repacked group and the activation rows' integer corrections (reused across calls).
#[derive(Default)]
pub(crate) struct Panels {
    /// `nb x PANELS x 8 steps x 32` bytes, as the module doc says.
    w: Vec<u8>,
    /// `nb x ROWS` weight scales (0 for rows past `n`).
    dw: Vec<f32>,
    /// `nb x ROWS` weight mins (Q4_1).
    mw: Vec<f32>,
}

/// The f16 at byte `at` of `b` (F16C, inside the path's feature-enabled copy: exact, so the
/// same value as `dequant::f16_at`).
#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    let bits = u16::from_le_bytes([b[at], b[at + 1]]);
    // SAFETY: every path has F16C (`isa`); this is inlined into their feature-enabled copies.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))) }
}

/// Repacks weight rows `j0..j0 + ROWS` (rows past `n` become zeros) into `pn`.
#[inline(always)]
fn repack<D: Dots>(ty: WType, data: &[u8], n: usize, k: usize, j0: usize, pn: &mut Panels) {
    let nb = k / QK8;
    let ts = ty.type_size();
    let rb = nb * ts;
    pn.w.resize(nb * PANELS * PANEL_BYTES, 0);
    pn.dw.resize(nb * ROWS, 0.0);
    pn.mw.resize(nb * ROWS, 0.0);
    let flip = if ty == WType::Q8_0 && D::VNNI {
        0x80
    } else {
        0
    };
    for r in 0..ROWS {
        let j = j0 + r;
        let (p, lane) = (r / LANES, r % LANES);
        for b in 0..nb {
            let mut v = [0u8; QK8];
            let (mut d, mut m) = (0.0, 0.0);
            if j < n {
                let blk = &data[j * rb + b * ts..j * rb + (b + 1) * ts];
                d = f16_at(blk, 0);
                match ty {
                    WType::Q4_0 | WType::Q4_1 => {
                        let off = if ty == WType::Q4_1 { 4 } else { 2 };
                        if ty == WType::Q4_1 {
                            m = f16_at(blk, 2);
                        }
                        for (i, &q) in blk[off..off + 16].iter().enumerate() {
                            v[i] = q & 0x0f;
                            v[16 + i] = q >> 4;
                        }
                    }
                    _ => {
                        for (o, &q) in v.iter_mut().zip(&blk[2..34]) {
                            *o = q ^ flip;
                        }
                    }
                }
            }
            pn.dw[b * ROWS + r] = d;
            pn.mw[b * ROWS + r] = m;
            let base = (b * PANELS + p) * PANEL_BYTES + lane * 4;
            for (step, word) in v.chunks_exact(4).enumerate() {
                pn.w[base + step * 32..base + step * 32 + 4].copy_from_slice(word);
            }
        }
    }
}

/// The `PP` panels from `p0` by activation rows `c0..c0 + CC` (`T` as in `avx2`).
#[inline(always)]
// The register tile is indexed [panel][column] from loops in the order the loads want.
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile<D: Dots, const PP: usize, const CC: usize, const T: u8>(
    job: &GroupJob<'_>,
    pn: &Panels,
    j0: usize,
    p0: usize,
    c0: usize,
) {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        let (k, n) = (job.k, job.n);
        let nb = k / QK8;
        let acts = job.acts;
        let sign = T == crate::avx2::Q8_0 && !D::VNNI;
        let corr = T == crate::avx2::Q4_0 || (T == crate::avx2::Q8_0 && D::VNNI);
        let mins = T == crate::avx2::Q4_1;
        assert!(p0 + PP <= PANELS && c0 + CC <= job.m);
        assert!(pn.w.len() >= nb * PANELS * PANEL_BYTES && pn.dw.len() >= nb * ROWS);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(!corr || acts.sums.len() >= (c0 + CC) * nb);
        // How far the dotted bytes sit above the weights' values: Q4_0's nibbles 8, Q8_0's
        // flipped bytes 128.
        let lift = if T == crate::avx2::Q4_0 { 8 } else { 128 };
        assert!(!mins || (acts.s.len() >= (c0 + CC) * nb && pn.mw.len() >= nb * ROWS));
        let xq = acts.qs.as_ptr().add(c0 * k);
        let mut acc = [[_mm256_setzero_ps(); CC]; PP];
        for b in 0..nb {
            // SAFETY: block b of the panels and of each activation row is in bounds (above).
            unsafe {
                let wb = pn.w.as_ptr().add((b * PANELS + p0) * PANEL_BYTES);
                let mut dot = [[_mm256_setzero_si256(); CC]; PP];
                for step in 0..LANES {
                    let w: [__m256i; PP] = std::array::from_fn(|p| {
                        _mm256_loadu_si256(wb.add(p * PANEL_BYTES + step * 32).cast())
                    });
                    let aw = if sign {
                        w.map(|v| _mm256_sign_epi8(v, v))
                    } else {
                        w
                    };
                    for c in 0..CC {
                        let at = xq.add(c * k + b * QK8 + 4 * step);
                        let x = _mm256_set1_epi32(std::ptr::read_unaligned(at.cast::<i32>()));
                        for p in 0..PP {
                            let xs = if sign { _mm256_sign_epi8(x, w[p]) } else { x };
                            dot[p][c] = D::dpbusd(dot[p][c], aw[p], xs);
                        }
                    }
                }
                let dw: [__m256; PP] = std::array::from_fn(|p| {
                    _mm256_loadu_ps(pn.dw.as_ptr().add(b * ROWS + (p0 + p) * LANES))
                });
                for c in 0..CC {
                    let dx = _mm256_set1_ps(*acts.d.as_ptr().add((c0 + c) * nb + b));
                    let off = _mm256_set1_epi32(if corr {
                        lift * *acts.sums.as_ptr().add((c0 + c) * nb + b)
                    } else {
                        0
                    });
                    for p in 0..PP {
                        let isum = if corr {
                            _mm256_sub_epi32(dot[p][c], off)
                        } else {
                            dot[p][c]
                        };
                        acc[p][c] = _mm256_fmadd_ps(
                            _mm256_mul_ps(dw[p], dx),
                            _mm256_cvtepi32_ps(isum),
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
                let mut v = acc_p[c];
                if mins {
                    // Q4_1's `sum_b m_w * s_x`, one fma chain per row, then added once.
                    let mut s = _mm256_setzero_ps();
                    for b in 0..nb {
                        // SAFETY: in bounds (checked above).
                        let (mv, sx) = unsafe {
                            (
                                _mm256_loadu_ps(pn.mw.as_ptr().add(b * ROWS + (p0 + p) * LANES)),
                                *acts.s.as_ptr().add((c0 + c) * nb + b),
                            )
                        };
                        s = _mm256_fmadd_ps(mv, _mm256_set1_ps(sx), s);
                    }
                    v = _mm256_add_ps(v, s);
                }
                // SAFETY: row (c0 + c) of `y` has columns row0..n, and only this thread's group
                // writes them.
                unsafe {
                    let dst = job.y.get().add((c0 + c) * n + row0);
                    if row0 + LANES <= n {
                        _mm256_storeu_ps(dst, v);
                    } else {
                        let mut t = [0f32; LANES];
                        _mm256_storeu_ps(t.as_mut_ptr(), v);
                        for (l, &e) in t.iter().enumerate().take(n - row0) {
                            *dst.add(l) = e;
                        }
                    }
                }
            }
        }
    }
}

/// Groups `g_lo..g_hi` of [`ROWS`] weight rows for every activation row of `job`.
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn groups<D: Dots>(
    job: &GroupJob<'_>,
    g_lo: usize,
    g_hi: usize,
    pn: &mut Panels,
) {
    let full = D::PANEL_COLS;
    for g in g_lo..g_hi {
        let j0 = g * ROWS;
        repack::<D>(job.ty, job.data, job.n, job.k, j0, pn);
        let mut p0 = 0;
        while p0 < PANELS && j0 + p0 * LANES < job.n {
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
                unsafe { dispatch::<D>(job, pn, j0, p0, c0, cc) };
                c0 += cc;
            }
            p0 += D::PANELS;
        }
    }
}

/// [`tile`] for a run-time tile width `cc` (the path's full width, 4, 2 or 1).
#[inline(always)]
unsafe fn dispatch<D: Dots>(
    job: &GroupJob<'_>,
    pn: &Panels,
    j0: usize,
    p0: usize,
    c0: usize,
    cc: usize,
) {
    use crate::avx2::{Q4_0, Q4_1, Q8_0};
    macro_rules! go {
        ($pp:literal) => {
            // SAFETY: as the caller promises.
            unsafe {
                match (cc, job.ty) {
                    (6, WType::Q4_1) => tile::<D, $pp, 6, Q4_1>(job, pn, j0, p0, c0),
                    (6, WType::Q4_0) => tile::<D, $pp, 6, Q4_0>(job, pn, j0, p0, c0),
                    (6, _) => tile::<D, $pp, 6, Q8_0>(job, pn, j0, p0, c0),
                    (4, WType::Q4_1) => tile::<D, $pp, 4, Q4_1>(job, pn, j0, p0, c0),
                    (4, WType::Q4_0) => tile::<D, $pp, 4, Q4_0>(job, pn, j0, p0, c0),
                    (4, _) => tile::<D, $pp, 4, Q8_0>(job, pn, j0, p0, c0),
                    (2, WType::Q4_1) => tile::<D, $pp, 2, Q4_1>(job, pn, j0, p0, c0),
                    (2, WType::Q4_0) => tile::<D, $pp, 2, Q4_0>(job, pn, j0, p0, c0),
                    (2, _) => tile::<D, $pp, 2, Q8_0>(job, pn, j0, p0, c0),
                    (_, WType::Q4_1) => tile::<D, $pp, 1, Q4_1>(job, pn, j0, p0, c0),
                    (_, WType::Q4_0) => tile::<D, $pp, 1, Q4_0>(job, pn, j0, p0, c0),
                    (_, _) => tile::<D, $pp, 1, Q8_0>(job, pn, j0, p0, c0),
                }
            }
        };
    }
    if D::PANELS == 2 && p0 + 2 <= PANELS && j0 + LANES < job.n {
        go!(2)
    } else {
        go!(1)
    }
}

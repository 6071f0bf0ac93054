//! `x86::packed_dots`: the matmul of matrices packed at load ([`crate::packed`]), for any number of
//! activation rows: decode reads each panel's bytes once, straight from memory, and a vector's
//! lanes are its 8 rows, so no row needs a horizontal sum.
//!
//! The packed block holds the ggml fields interleaved; per block and panel this unpacks only
//! what the batched panels' repack (`x86::panel_k`) would have stored: the scale pairs (Q4_K's
//! and Q5_K's 6-bit scales and mins, Q6_K's, Q3_K's and IQ4_XS's signed scales) as i16 pairs
//! per row lane (`x86::packed_fields`) and `d` / `dmin` as floats. The nibble vectors of Q4_K
//! are read in place, Q5_K's get their fifth bits from the `qh` vectors, Q6_K's and Q3_K's
//! levels are put together from their low bits and high bits, IQ4_XS's looked up in its grid,
//! vector by vector. The integer work and the float work per block are `x86::panel_k`'s
//! (`k4_block`, `block_floats`), `x86::k16`'s (`k16_block`) or
//! [`iq4xs_block`], so every row has the bits of the in-place dots and of the portable
//! formulas, whatever the layout and the batch. Past [`REPACK_ABOVE`] activation rows, Q5_K,
//! Q6_K, Q3_K and (VNNI) IQ4_XS groups are repacked from the packed panels into `x86::panel_k`'s
//! ([`repack`]); the 32-element types go through `x86::panel32`'s tile ([`Packed32`]).

use std::arch::x86_64::*;

use crate::WType;
use crate::packed::PANEL_ROWS;
use crate::quant::QK_K;
use crate::x86::dots32::{IQ4NL, Q4_1, Q5_0, Q5_1, Q8_0, block32, has_min, signed_levels};
use crate::x86::isa::Dots;
use crate::x86::job::{GroupJob, prefetch_ahead};
use crate::x86::k16::{k16_block, q2k_packed_levels, q3k_packed_levels, q6k_packed_levels};
use crate::x86::kblock::{Block, IQ4XS, Q2K, Q3K, Q4K, Q5KP, Q6K, vec_at};
use crate::x86::kquant::bsum_pairs;
use crate::x86::packed_fields::{
    Scales, at, block_scales, iq4xs_scales, q2k_scales, q3k_scales, q4k_scales, q6k_scales,
};
use crate::x86::panel_k::{PANELS, PanelsK, QVECS_BYTES, block_floats, fifth_bit, k4_block};
use crate::x86::panel32::{LANES, ROWS, Source, store_lanes, tile_cols};
use crate::x86::wide;

/// IQ4_XS's integer part of one block for the `PP x CC` tile: per 32-element sub-block `s`, its
/// 4 nibble vectors looked up in the grid (low nibbles elements `4 step..+4`, high ones
/// `16 + 4 step..+4`), 8 `dpbusd` steps times the rows' signed scales into `isum`: the exact
/// integer of `dots::dot_iq4xs`. The grid values are signed: the VNNI paths flip them by 128
/// and take `128 * sum_s ls_s * xsum_s` off through `vpmaddwd` on the scale pairs and the
/// activation's `bsums`; AVX2 moves the signs onto the activations (`vpsignb`, as the in-place
/// dot does).
///
/// # Safety
/// As [`tile`]'s: `at` is in bounds ([`Block`]).
#[inline(always)]
#[allow(clippy::needless_range_loop)]
unsafe fn iq4xs_block<D: Dots, const PP: usize, const CC: usize>(
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
            acts,
            c0,
            nb,
        } = at;
        let m4 = _mm256_set1_epi8(0x0f);
        let grid = _mm_loadu_si128(crate::dequant::KVALUES_IQ4NL.as_ptr().cast());
        // The VNNI paths look the values up already flipped.
        let grid = if D::VNNI {
            _mm_xor_si128(grid, _mm_set1_epi8(-128))
        } else {
            grid
        };
        let grid = _mm256_set_m128i(grid, grid);
        for s in 0..8 {
            let mut dot = [[_mm256_setzero_si256(); CC]; PP];
            for step in 0..4 {
                let mut lo = [_mm256_setzero_si256(); PP];
                let mut hi = [_mm256_setzero_si256(); PP];
                for p in 0..PP {
                    let v = vec_at(qb.add(p * qstride), 4 * s + step);
                    lo[p] = _mm256_shuffle_epi8(grid, _mm256_and_si256(v, m4));
                    hi[p] =
                        _mm256_shuffle_epi8(grid, _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4));
                }
                for c in 0..CC {
                    let x = xq.add(c * k + b * QK_K + 32 * s + 4 * step);
                    let xl = _mm256_set1_epi32(std::ptr::read_unaligned(x.cast::<i32>()));
                    let xh = _mm256_set1_epi32(std::ptr::read_unaligned(x.add(16).cast::<i32>()));
                    for p in 0..PP {
                        if D::VNNI {
                            let d = D::dpbusd(dot[p][c], lo[p], xl);
                            dot[p][c] = D::dpbusd(d, hi[p], xh);
                        } else {
                            let d = D::dpbusd(
                                dot[p][c],
                                _mm256_sign_epi8(lo[p], lo[p]),
                                _mm256_sign_epi8(xl, lo[p]),
                            );
                            dot[p][c] = D::dpbusd(
                                d,
                                _mm256_sign_epi8(hi[p], hi[p]),
                                _mm256_sign_epi8(xh, hi[p]),
                            );
                        }
                    }
                }
            }
            for p in 0..PP {
                let pair = _mm256_loadu_si256(smb.add(p * sstride + s / 2));
                let sc = if s % 2 == 1 {
                    _mm256_srai_epi32::<16>(pair)
                } else {
                    _mm256_srai_epi32::<16>(_mm256_slli_epi32::<16>(pair))
                };
                for c in 0..CC {
                    isum[p][c] = _mm256_add_epi32(isum[p][c], _mm256_mullo_epi32(dot[p][c], sc));
                }
            }
        }
        if D::VNNI {
            // The flip: per row, 128 * sum over t of (ls[2t], ls[2t + 1]) . (bp[2t], bp[2t + 1]),
            // bp[s] = bsums[2s] + bsums[2s + 1].
            for c in 0..CC {
                let bp = bsum_pairs(&acts.bsums[(c0 + c) * nb * 16 + b * 16..]);
                let bpw: [i32; 4] = std::mem::transmute(bp);
                let mut corr = [_mm256_setzero_si256(); PP];
                for (t, &pair) in bpw.iter().enumerate() {
                    let x = _mm256_set1_epi32(pair);
                    for p in 0..PP {
                        let sc = _mm256_loadu_si256(smb.add(p * sstride + t));
                        corr[p] = _mm256_add_epi32(corr[p], _mm256_madd_epi16(sc, x));
                    }
                }
                for p in 0..PP {
                    isum[p][c] = _mm256_sub_epi32(isum[p][c], _mm256_slli_epi32::<7>(corr[p]));
                }
            }
        }
    }
}

/// The `PP` panels from row `j0` (a multiple of 8) by activation rows `c0..c0 + CC`.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile<D: Dots, const T: u8, const PP: usize, const CC: usize>(
    job: &GroupJob<'_>,
    j0: usize,
    c0: usize,
    pre: Option<Scales>,
) {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        let (k, n) = (job.k, job.n);
        let nb = k / QK_K;
        let pb = PANEL_ROWS * job.ty.type_size();
        let panel = nb * pb;
        let acts = job.acts;
        let panels = n.div_ceil(PANEL_ROWS);
        assert!(j0.is_multiple_of(PANEL_ROWS) && j0 / PANEL_ROWS + PP <= panels);
        assert!(job.data.len() >= panels * panel && c0 + CC <= job.m);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(acts.bsums.len() >= (c0 + CC) * nb * 16);
        let base = job.data.as_ptr().add(j0 / PANEL_ROWS * panel);
        let xq = acts.qs.as_ptr().add(c0 * k);
        let mut acc = [[_mm256_setzero_ps(); CC]; PP];
        for b in 0..nb {
            // SAFETY: block b of the PP panels and of each activation row is in bounds (above).
            unsafe {
                if c0 == 0 {
                    // The first column tile streams the panels from memory.
                    for p in 0..PP {
                        prefetch_ahead(base.add(p * panel + b * pb), pb);
                    }
                }
                // No closures: they would be compiled without the path's features.
                let (d_at, qs_at) = match T {
                    Q4K => (at::Q4K_D, at::Q4K_QS),
                    Q5KP => (at::Q5K_D, at::Q5K_QS),
                    Q6K => (at::Q6K_D, at::Q6K_QL),
                    Q3K => (at::Q3K_D, at::Q3K_HMASK),
                    Q2K => (at::Q2K_D, at::Q2K_QS),
                    _ => (at::IQ4XS_D, at::IQ4XS_QS),
                };
                let mut blk = [base; PP];
                let mut sm = [[_mm256_setzero_si256(); 8]; PP];
                let mut dw = [_mm256_setzero_ps(); PP];
                let mut mw = [_mm256_setzero_ps(); PP];
                for p in 0..PP {
                    blk[p] = base.add(p * panel + b * pb);
                    if pre.is_none() {
                        sm[p] = block_scales::<T>(blk[p]);
                    }
                    dw[p] = _mm256_cvtph_ps(_mm_loadu_si128(blk[p].add(d_at).cast()));
                    if T == Q4K || T == Q5KP {
                        mw[p] = _mm256_cvtph_ps(_mm_loadu_si128(blk[p].add(at::Q4K_DMIN).cast()));
                    }
                    if T == Q2K {
                        mw[p] = _mm256_cvtph_ps(_mm_loadu_si128(blk[p].add(at::Q2K_DMIN).cast()));
                    }
                }
                let (smb, sstride) = match pre {
                    // The group's scales, unpacked once for all its column tiles.
                    Some(pre) => (pre.at(j0 / PANEL_ROWS, b), pre.stride()),
                    None => (sm.as_ptr().cast(), 8),
                };
                let at = Block {
                    qb: blk[0].add(qs_at),
                    qstride: panel,
                    smb,
                    sstride,
                    xq,
                    k,
                    b,
                    acts,
                    c0,
                    nb,
                };
                let mut isum = [[_mm256_setzero_si256(); CC]; PP];
                let mut imin = [[_mm256_setzero_si256(); CC]; PP];
                match T {
                    Q4K => k4_block::<D, Q4K, PP, CC>(at, &mut isum, &mut imin),
                    Q5KP => k4_block::<D, Q5KP, PP, CC>(at, &mut isum, &mut imin),
                    Q6K => k16_block::<D, Q6K, true, PP, CC>(at, &mut isum, &mut imin),
                    Q3K => k16_block::<D, Q3K, true, PP, CC>(at, &mut isum, &mut imin),
                    Q2K => k16_block::<D, Q2K, true, PP, CC>(at, &mut isum, &mut imin),
                    _ => iq4xs_block::<D, PP, CC>(at, &mut isum),
                }
                block_floats::<T, PP, CC>(&mut acc, &isum, &imin, &dw, &mw, at);
            }
        }
        for c in 0..CC {
            for (p, acc_p) in acc.iter().enumerate() {
                let row0 = j0 + p * LANES;
                if row0 < n {
                    // SAFETY: only this thread's group writes these columns.
                    unsafe { store_lanes(job, c0 + c, row0, acc_p[c]) };
                }
            }
        }
    }
}

/// [`tile`] for a run-time tile shape (two panels or one, `cc` activation rows).
#[inline(always)]
unsafe fn dispatch<D: Dots, const T: u8>(
    job: &GroupJob<'_>,
    j0: usize,
    c0: usize,
    two: bool,
    cc: usize,
    pre: Option<Scales>,
) {
    // SAFETY: as the caller promises.
    unsafe {
        match (two, cc) {
            (true, 4) => tile::<D, T, 2, 4>(job, j0, c0, pre),
            (true, 3) => tile::<D, T, 2, 3>(job, j0, c0, pre),
            (true, 2) => tile::<D, T, 2, 2>(job, j0, c0, pre),
            (true, _) => tile::<D, T, 2, 1>(job, j0, c0, pre),
            (false, 4) => tile::<D, T, 1, 4>(job, j0, c0, pre),
            (false, 3) => tile::<D, T, 1, 3>(job, j0, c0, pre),
            (false, 2) => tile::<D, T, 1, 2>(job, j0, c0, pre),
            (false, _) => tile::<D, T, 1, 1>(job, j0, c0, pre),
        }
    }
}

/// A packed matrix of a 32-element type as `x86::panel32`'s tiles read it: the panels from `base`,
/// `panel` bytes apart, blocks `pb` bytes apart in each. Per panel block: the 8 rows' `d` (16
/// bytes), Q4_1's and Q5_1's `m` (16), the fifth bits of Q5_0 and Q5_1 (one word a row), then
/// the values (Q8_0) or nibbles (IQ4_NL's looked up in its grid).
#[derive(Clone, Copy)]
struct Packed32 {
    base: *const u8,
    panel: usize,
    pb: usize,
}

impl Source for Packed32 {
    #[inline(always)]
    fn fetch(self, p: usize, b: usize) {
        prefetch_ahead(
            self.base.wrapping_add(p * self.panel + b * self.pb),
            self.pb,
        );
    }
    #[inline(always)]
    unsafe fn levels<D: Dots, const T: u8>(self, p: usize, b: usize, step: usize) -> __m256i {
        // SAFETY: the caller's promise: panel `p`, block `b` are inside the matrix.
        unsafe {
            let blk = self.base.add(p * self.panel + b * self.pb);
            // As `panel32::repack`: signed values offset by 128 for `vpdpbusd`.
            let flip = if signed_levels(T) && D::VNNI {
                _mm256_set1_epi8(-128)
            } else {
                _mm256_setzero_si256()
            };
            if T == Q8_0 {
                let v = _mm256_loadu_si256(blk.add(at::Q8_0_QS + 32 * step).cast());
                return _mm256_xor_si256(v, flip);
            }
            // The fields after the 8 rows' `d` (and `m`): [fifth bits,] nibbles.
            let (qh, qs) = match T {
                Q5_0 => (at::Q5_0_QH, at::Q5_0_QS),
                Q4_1 => (0, at::Q4_1_QS),
                Q5_1 => (at::Q5_1_QH, at::Q5_1_QS),
                _ => (0, at::Q4_0_QS),
            };
            let v = _mm256_loadu_si256(blk.add(qs + 32 * (step % 4)).cast());
            let v = if step >= 4 {
                _mm256_srli_epi16::<4>(v)
            } else {
                v
            };
            let nib = _mm256_and_si256(v, _mm256_set1_epi8(0x0f));
            if T == IQ4NL {
                let grid = _mm_loadu_si128(crate::dequant::KVALUES_IQ4NL.as_ptr().cast());
                let vals = _mm256_shuffle_epi8(_mm256_set_m128i(grid, grid), nib);
                return _mm256_xor_si256(vals, flip);
            }
            if T != Q5_0 && T != Q5_1 {
                return nib;
            }
            // Bits 4 step..4 step + 4 of each row's word to 0x10 in its 4 bytes.
            let qh = _mm256_loadu_si256(blk.add(qh).cast());
            let bits = _mm256_srl_epi32(qh, _mm_cvtsi32_si128(4 * step as i32));
            // Each lane's low byte to its 4 bytes (indices within each 128-bit half).
            let (lo, hi) = (0x0404_0404_0000_0000, 0x0c0c_0c0c_0808_0808);
            let spread = _mm256_shuffle_epi8(bits, _mm256_set_epi64x(hi, lo, hi, lo));
            let mask = _mm256_set1_epi32(0x0804_0201);
            let on = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
            _mm256_or_si256(nib, _mm256_and_si256(on, _mm256_set1_epi8(0x10)))
        }
    }
    #[inline(always)]
    unsafe fn dw<const T: u8>(self, p: usize, b: usize) -> __m256 {
        // SAFETY: the caller's promise.
        unsafe {
            let blk = self.base.add(p * self.panel + b * self.pb);
            _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::D).cast()))
        }
    }
    #[inline(always)]
    unsafe fn mw<const T: u8>(self, p: usize, b: usize) -> __m256 {
        // SAFETY: the caller's promise; Q4_1's and Q5_1's `m` follow the 8 rows' `d`.
        unsafe {
            if !has_min(T) {
                return _mm256_setzero_ps();
            }
            let blk = self.base.add(p * self.panel + b * self.pb);
            _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::M).cast()))
        }
    }
}

/// Groups `g_lo..g_hi` of [`ROWS`] weight rows of a packed 32-element type matrix.
///
/// # Safety
/// The CPU has `D`'s features; `job` is a packed matmul of a 32-element type.
#[inline(always)]
unsafe fn groups32<D: Dots>(job: &GroupJob<'_>, g_lo: usize, g_hi: usize) {
    let full = D::PANEL_COLS;
    let panels = job.n.div_ceil(PANEL_ROWS);
    let pb = PANEL_ROWS * job.ty.type_size();
    let panel = job.k / job.ty.block_size() * pb;
    assert!(job.data.len() >= panels * panel);
    assert!(crate::packed::fields(job.ty).is_some());
    for g in g_lo..g_hi {
        let mut p = g * ROWS / PANEL_ROWS;
        let end = ((g + 1) * ROWS / PANEL_ROWS).min(panels);
        while p < end {
            // As for the K-quants: decode reads one panel at a time.
            let two = D::PANELS == 2 && p + 1 < end && job.m > 1;
            let src = Packed32 {
                // SAFETY: panel p < panels is inside `data` (checked above).
                base: unsafe { job.data.as_ptr().add(p * panel) },
                panel,
                pb,
            };
            if two && job.wide {
                // SAFETY: `wide` is set on the AVX-512 VNNI path only (`Backend::Avx512Zmm`),
                // whose CPU the caller promises; panel p + 1 is inside the matrix.
                unsafe { crate::x86::wide32::pair(job, src, p * PANEL_ROWS) };
                p += 2;
                continue;
            }
            let mut c0 = 0;
            while c0 < job.m {
                let cc = tile_cols(job.m - c0, full);
                // SAFETY: the caller's promise; the source holds the tile's panels.
                unsafe {
                    crate::x86::panel32::dispatch::<D>(job, src, p * PANEL_ROWS, 0, c0, cc, two)
                };
                c0 += cc;
            }
            p += if two { 2 } else { 1 };
        }
    }
}

/// The group of [`ROWS`] packed Q5_K, Q6_K or IQ4_XS rows from `j0` as `x86::panel_k`'s
/// repacked panels: each level vector is the one the packed tiles compute ([`fifth_bit`] on
/// Q4_K's nibbles, [`q6k_packed_levels`], IQ4_XS's grid values flipped by 128), the scale pairs
/// the packed ones, `d` and `dmin` widened (the padding rows of a packed matrix are zeros, so
/// they come out as zeros).
///
/// # Safety
/// The CPU has `D`'s features; `job` is a packed Q5_K (`T` = `Q5KP`), Q6_K or IQ4_XS matmul
/// (this last on a VNNI path: its flipped levels would saturate AVX2's `vpmaddubsw`).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn repack<D: Dots, const T: u8>(job: &GroupJob<'_>, j0: usize, pn: &mut PanelsK) {
    let nb = job.k / QK_K;
    let pb = PANEL_ROWS * job.ty.type_size();
    let panel = nb * pb;
    let panels = job.n.div_ceil(PANEL_ROWS);
    assert!(job.data.len() >= panels * panel && j0.is_multiple_of(PANEL_ROWS));
    // SAFETY: the CPU has `D`'s features; reads stay inside the group's panels (those below
    // `panels`, checked above), writes inside `pn` as sized here.
    unsafe {
        pn.qs
            .resize(nb * PANELS * QVECS_BYTES, _mm256_setzero_si256());
        pn.sm.resize(nb * PANELS * LANES, _mm256_setzero_si256());
        pn.d.resize(nb * ROWS, 0.0);
        pn.dmin.resize(nb * ROWS, 0.0);
        let (m4, five) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(0x10));
        // IQ4_XS's grid flipped by 128, as the VNNI tiles take it.
        let grid = _mm_xor_si128(
            _mm_loadu_si128(crate::dequant::KVALUES_IQ4NL.as_ptr().cast()),
            _mm_set1_epi8(-128),
        );
        let grid = _mm256_set_m128i(grid, grid);
        for b in 0..nb {
            for p in 0..PANELS {
                let at = (b * PANELS + p) * QVECS_BYTES;
                let panel_no = j0 / PANEL_ROWS + p;
                if panel_no >= panels {
                    // Past the matrix: `panel_k::tiles` reads no panel past the group's rows.
                    continue;
                }
                let blk = job.data.as_ptr().add(panel_no * panel + b * pb);
                let (sm, d, dmin) = if T == Q5KP {
                    (
                        q4k_scales(blk),
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::Q5K_D).cast())),
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::Q5K_DMIN).cast())),
                    )
                } else if T == IQ4XS {
                    // The signed scale pairs twice: as scales and as the "mins" that take the
                    // flip off (`panel_k::tile`).
                    let mut sm = iq4xs_scales(blk);
                    for t in 0..4 {
                        sm[4 + t] = sm[t];
                    }
                    (
                        sm,
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::IQ4XS_D).cast())),
                        _mm256_setzero_ps(),
                    )
                } else if T == Q2K {
                    (
                        q2k_scales(blk),
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::Q2K_D).cast())),
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::Q2K_DMIN).cast())),
                    )
                } else if T == Q3K {
                    (
                        q3k_scales(blk),
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::Q3K_D).cast())),
                        _mm256_setzero_ps(),
                    )
                } else {
                    (
                        q6k_scales(blk),
                        _mm256_cvtph_ps(_mm_loadu_si128(blk.add(at::Q6K_D).cast())),
                        _mm256_setzero_ps(),
                    )
                };
                for (t, v) in sm.into_iter().enumerate() {
                    *pn.sm.as_mut_ptr().add((b * PANELS + p) * LANES + t) = v;
                }
                _mm256_storeu_ps(pn.d.as_mut_ptr().add(b * ROWS + p * LANES), d);
                _mm256_storeu_ps(pn.dmin.as_mut_ptr().add(b * ROWS + p * LANES), dmin);
                for c in 0..8 {
                    for step in 0..LANES {
                        let v = if T == Q5KP {
                            let (t, high) = (c / 2, c % 2 == 1);
                            let q = vec_at(blk.add(at::Q5K_QS), LANES * t + step);
                            let q = if high { _mm256_srli_epi16::<4>(q) } else { q };
                            let h = vec_at(blk.add(at::Q5K_QH), step);
                            _mm256_or_si256(_mm256_and_si256(q, m4), fifth_bit(h, c, five))
                        } else if T == IQ4XS {
                            // Elements 4 step..+4 of sub-block c: the low nibbles of its vector
                            // `step` for the first 16, the high ones of `step - 4` after.
                            let q = vec_at(blk.add(at::IQ4XS_QS), 4 * c + step % 4);
                            let q = if step >= 4 {
                                _mm256_srli_epi16::<4>(q)
                            } else {
                                q
                            };
                            _mm256_shuffle_epi8(grid, _mm256_and_si256(q, m4))
                        } else if T == Q3K {
                            q3k_packed_levels(blk.add(at::Q3K_HMASK), c, step)
                        } else if T == Q2K {
                            q2k_packed_levels(blk.add(at::Q2K_QS), c, step)
                        } else {
                            q6k_packed_levels(blk.add(at::Q6K_QL), c, step)
                        };
                        *pn.qs.as_mut_ptr().add(at + LANES * c + step) = v;
                    }
                }
            }
        }
    }
}

/// Past this many activation rows, a packed Q5_K, Q6_K or (VNNI) IQ4_XS group is repacked
/// ([`repack`]) into
/// `x86::panel_k`'s panels, whose levels are put together once for the whole batch (the packed
/// tiles put them together again for every 4 activation rows). `type_rates` (Zen 4, 2
/// threads): Q5_K at 16 rows 181 GMAC/s in the packed tiles, at 33 rows 215 repacked; Q6_K at
/// 128 rows 92 in the packed tiles, 202 repacked.
const REPACK_ABOVE: usize = 32;

/// Most activation rows for which each column tile of a packed K-quant or IQ4_XS matrix unpacks
/// its blocks' scales itself; past it, a group's scales are unpacked once for all its tiles
/// ([`Scales`]). Q4_K, `type_rates`, 2 threads (Zen 4), three interleaved rounds: 512 rows 260
/// -> 271 GMAC/s, 128 rows even, 16 rows 225 -> 192 (a first pass over the group's block
/// headers breaks the stream from memory that small batches still wait on).
const SCALES_ONCE_ABOVE: usize = 64;

/// Groups `g_lo..g_hi` of [`ROWS`] weight rows of a packed matrix for every activation row.
///
/// # Safety
/// The CPU has `D`'s features; `job` is a packed matmul.
#[inline(always)]
pub(crate) unsafe fn groups<D: Dots>(
    job: &GroupJob<'_>,
    g_lo: usize,
    g_hi: usize,
    panels_k: &mut crate::x86::panel_k::PanelsK,
) {
    if block32(job.ty).is_some() {
        // SAFETY: the caller's promise.
        unsafe { groups32::<D>(job, g_lo, g_hi) };
        return;
    }
    let panels = matches!(job.ty, WType::Q5K | WType::Q6K | WType::Q3K | WType::Q2K)
        || (job.ty == WType::IQ4XS && D::VNNI);
    if panels && job.m > REPACK_ABOVE {
        for g in g_lo..g_hi {
            let j0 = g * ROWS;
            let rows = (job.n - j0).min(ROWS);
            // SAFETY: the caller's promise; the panels hold the group.
            unsafe {
                match job.ty {
                    WType::Q5K => repack::<D, Q5KP>(job, j0, panels_k),
                    WType::IQ4XS => repack::<D, IQ4XS>(job, j0, panels_k),
                    WType::Q3K => repack::<D, Q3K>(job, j0, panels_k),
                    WType::Q2K => repack::<D, Q2K>(job, j0, panels_k),
                    _ => repack::<D, Q6K>(job, j0, panels_k),
                }
                crate::x86::panel_k::tiles::<D>(job, rows, j0, panels_k);
            }
        }
        return;
    }
    // As `panel_k::groups`: a tile's accumulators and operands fill the registers.
    let full = if D::PANELS == 2 { 4 } else { 3 };
    let panels = job.n.div_ceil(PANEL_ROWS);
    for g in g_lo..g_hi {
        let mut p = g * ROWS / PANEL_ROWS;
        let end = ((g + 1) * ROWS / PANEL_ROWS).min(panels);
        // More than one column tile: unpack the group's scales once, not once a tile.
        // SAFETY: the caller's promise; the panels `p..end` are inside the matrix.
        // No closure: it would be compiled without the path's features.
        let pre = if job.m > SCALES_ONCE_ABOVE {
            Some(unsafe { Scales::unpack::<D>(job, p, end, panels_k) })
        } else {
            None
        };
        while p < end {
            // Two panels a tile where the batch makes the tile compute-bound; decode reads one
            // panel at a time: two streams a thread ran at 28 instead of 46 GMAC/s (one thread,
            // Q4_K, `type_rates`).
            let two = D::PANELS == 2 && p + 1 < end && job.m > 1;
            if two && job.wide && job.ty == WType::Q4K {
                // SAFETY: `wide` is set on the AVX-512 VNNI path only (`Backend::Avx512Zmm`),
                // whose CPU the caller promises; panel p + 1 is inside the matrix.
                unsafe { q4k_pair(job, p, pre) };
                p += 2;
                continue;
            }
            let mut c0 = 0;
            while c0 < job.m {
                let cc = tile_cols(job.m - c0, full);
                // SAFETY: the caller's promise.
                unsafe {
                    match job.ty {
                        WType::Q4K => dispatch::<D, Q4K>(job, p * PANEL_ROWS, c0, two, cc, pre),
                        WType::Q5K => dispatch::<D, Q5KP>(job, p * PANEL_ROWS, c0, two, cc, pre),
                        WType::IQ4XS => dispatch::<D, IQ4XS>(job, p * PANEL_ROWS, c0, two, cc, pre),
                        WType::Q3K => dispatch::<D, Q3K>(job, p * PANEL_ROWS, c0, two, cc, pre),
                        WType::Q2K => dispatch::<D, Q2K>(job, p * PANEL_ROWS, c0, two, cc, pre),
                        _ => dispatch::<D, Q6K>(job, p * PANEL_ROWS, c0, two, cc, pre),
                    }
                }
                c0 += cc;
            }
            p += if two { 2 } else { 1 };
        }
    }
}

/// Panels `p` and `p + 1` of a packed Q4_K matrix, read in place: blocks `pb` bytes apart from
/// `base`, the second panel `panel` bytes on; `pre`, when given, the group's scale pairs.
#[derive(Clone, Copy)]
struct Packed4 {
    base: *const u8,
    panel: usize,
    pb: usize,
    p: usize,
    pre: Option<Scales>,
}

impl wide::Pair for Packed4 {
    #[inline(always)]
    unsafe fn levels<const T: u8>(self, b: usize, v: usize, high: bool) -> __m512i {
        // SAFETY: the caller's promise.
        unsafe {
            let q0 = self.base.add(b * self.pb + at::Q4K_QS);
            let v = wide::join(vec_at(q0, v), vec_at(q0.add(self.panel), v));
            let v = if high { _mm512_srli_epi16::<4>(v) } else { v };
            _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
        }
    }
    #[inline(always)]
    unsafe fn pairs(self, b: usize) -> [__m512i; 8] {
        // SAFETY: the caller's promise.
        unsafe {
            let blk = self.base.add(b * self.pb);
            let (s0, s1) = match self.pre {
                Some(pre) => (
                    std::ptr::read(pre.at(self.p, b).cast::<[__m256i; 8]>()),
                    std::ptr::read(pre.at(self.p + 1, b).cast::<[__m256i; 8]>()),
                ),
                None => (q4k_scales(blk), q4k_scales(blk.add(self.panel))),
            };
            // No closures here: they would be compiled without the path's features and call
            // every intrinsic out of line.
            let mut v = [_mm512_setzero_si512(); 8];
            for (v, (a, b)) in v.iter_mut().zip(s0.into_iter().zip(s1)) {
                *v = wide::join(a, b);
            }
            v
        }
    }
    #[inline(always)]
    unsafe fn floats(self, b: usize) -> (__m512, __m512) {
        // SAFETY: the caller's promise.
        unsafe {
            let blk = self.base.add(b * self.pb);
            let (d, dmin) = (at::Q4K_D, at::Q4K_DMIN);
            (
                wide::halves(blk.add(d), blk.add(self.panel + d)),
                wide::halves(blk.add(dmin), blk.add(self.panel + dmin)),
            )
        }
    }
}

/// Panels `p` and `p + 1` of a packed Q4_K matrix by every activation row of `job`, a tile of
/// up to `wide::COLS` rows at a time; `pre`, when given, holds the group's scale pairs.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `job` is a packed Q4_K matmul with a panel `p + 1`.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn q4k_pair(job: &GroupJob<'_>, p: usize, pre: Option<Scales>) {
    let nb = job.k / QK_K;
    let pb = PANEL_ROWS * WType::Q4K.type_size();
    let panels = job.n.div_ceil(PANEL_ROWS);
    assert!(job.ty == WType::Q4K && job.layout == crate::Layout::Rows8);
    assert!(p + 2 <= panels && job.data.len() >= panels * nb * pb);
    let src = Packed4 {
        // SAFETY: panel p is inside the matrix (checked above).
        base: unsafe { job.data.as_ptr().add(p * nb * pb) },
        panel: nb * pb,
        pb,
        p,
        pre,
    };
    let mut c0 = 0;
    while c0 < job.m {
        let cc = wide::cols(job.m - c0);
        // SAFETY: the caller's promise; the source holds both panels, c0 + cc <= m.
        unsafe { wide::dispatch::<Q4K>(job, src, p * PANEL_ROWS, c0, cc) };
        c0 += cc;
    }
}

//! `x86::panel32`: the matmul of the 32-element block types (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1,
//! IQ4_NL) for batches past the in-place tiles (prefill, and decode of many sequences), where
//! every weight row meets many activation rows.
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
//! Weight bytes as the dot takes them (`dots32::levels`, the in-place tiles' unpack): Q4_1's and
//! Q5_1's levels as they are (their min apart); Q4_0's and Q5_0's levels as they are, the
//! block's `-8 * sum(x)` (`-16 * sum(x)`) subtracted after (exact integers); Q8_0's and IQ4_NL's
//! signed values with `vpdpbusd` offset by 128 (`w ^ 0x80`), `-128 * sum(x)` after, or on AVX2
//! signed, with ggml's sign trick (its `vpmaddubsw` would saturate an offset byte). Every way gives the block's exact integer dot,
//! and the float operations are those of `quant::dot_q32`, so results are the same bits as the
//! portable formula and the in-place tiles.

use std::arch::x86_64::*;

use crate::WType;
use crate::quant::QK8;
use crate::x86::dots32::{Q5_0, Q5_1, block32, has_min, level_offset, levels, signed_levels};
use crate::x86::isa::Dots;
use crate::x86::job::GroupJob;

/// Weight rows per repacked group (two 8-row panels).
pub(crate) const ROWS: usize = 16;
/// Weight rows per panel: the i32 lanes of a 256-bit vector.
pub(crate) const LANES: usize = 8;
const PANELS: usize = ROWS / LANES;
/// Bytes of one block of one panel.
const PANEL_BYTES: usize = LANES * QK8;

/// A repacked group of weight rows (reused across calls).
#[derive(Default)]
pub(crate) struct Panels {
    /// `nb x PANELS x 8 steps x 32` bytes, as the module doc says.
    w: Vec<u8>,
    /// `nb x ROWS` weight scales (0 for rows past `n`).
    dw: Vec<f32>,
    /// `nb x ROWS` weight mins (Q4_1).
    mw: Vec<f32>,
}

/// Repacks weight rows `j0..j0 + ROWS` (rows past `n` become zeros) into `pn`: per block and
/// panel, the 8 rows' 32 dotted bytes (8 words each) as an 8 x 8 word transpose.
///
/// # Safety
/// The CPU has `D`'s features (AVX2 and F16C at least); called from their compiled copies.
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn repack<D: Dots>(ty: WType, data: &[u8], n: usize, k: usize, j0: usize, pn: &mut Panels) {
    let nb = k / QK8;
    let ts = ty.type_size();
    let rb = nb * ts;
    assert!(data.len() >= n * rb);
    pn.w.resize(nb * PANELS * PANEL_BYTES, 0);
    pn.dw.resize(nb * ROWS, 0.0);
    pn.mw.resize(nb * ROWS, 0.0);
    let t = block32(ty).expect("a 32-element block type");
    // Signed values go through `vpdpbusd` offset by 128 (`w ^ 0x80`); AVX2 keeps them signed.
    let flip = signed_levels(t) && D::VNNI;
    // SAFETY: the CPU has AVX2 and F16C (the caller's promise). Reads stay inside rows j < n of
    // `data` (checked above); writes inside `pn`'s buffers as sized above.
    unsafe {
        let flip = _mm256_set1_epi8(if flip { -128 } else { 0 });
        for b in 0..nb {
            for p in 0..PANELS {
                // No closures here: they would be compiled without the path's features and
                // call every intrinsic out of line.
                let mut rows = [_mm256_setzero_si256(); LANES];
                for (l, row) in rows.iter_mut().enumerate() {
                    let r = p * LANES + l;
                    let j = j0 + r;
                    if j >= n {
                        pn.dw[b * ROWS + r] = 0.0;
                        pn.mw[b * ROWS + r] = 0.0;
                        continue;
                    }
                    let blk = data.as_ptr().add(j * rb + b * ts);
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                        blk.cast::<i32>(),
                    )));
                    pn.dw[b * ROWS + r] = _mm_cvtss_f32(dm);
                    pn.mw[b * ROWS + r] = if has_min(t) {
                        _mm_cvtss_f32(_mm_movehdup_ps(dm))
                    } else {
                        0.0
                    };
                    *row = _mm256_xor_si256(levels::<D>(t, blk), flip);
                }
                let dst = pn.w.as_mut_ptr().add((b * PANELS + p) * PANEL_BYTES);
                for (s, v) in transpose8x8_words(rows).into_iter().enumerate() {
                    _mm256_storeu_si256(dst.add(s * 32).cast(), v);
                }
            }
        }
    }
}

/// The 8 x 8 transpose of 32-bit words: word `s` of `rows[l]` goes to lane `l` of vector `s`
/// (how a panel lays 8 weight rows side by side).
///
/// # Safety
/// The CPU has AVX2; called from functions compiled with it.
#[inline(always)]
pub(crate) unsafe fn transpose8x8_words(rows: [__m256i; LANES]) -> [__m256i; LANES] {
    // SAFETY: the caller's promise.
    unsafe {
        let mut t = [_mm256_setzero_si256(); LANES];
        for i in 0..LANES / 2 {
            t[2 * i] = _mm256_unpacklo_epi32(rows[2 * i], rows[2 * i + 1]);
            t[2 * i + 1] = _mm256_unpackhi_epi32(rows[2 * i], rows[2 * i + 1]);
        }
        // u[h][s]: rows 4h..4h+4, words s (lanes 0..4) and s + 4 (lanes 4..8).
        let mut u = [[_mm256_setzero_si256(); 4]; 2];
        for (h, uh) in u.iter_mut().enumerate() {
            uh[0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
            uh[1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
            uh[2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
            uh[3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
        }
        let mut out = [_mm256_setzero_si256(); LANES];
        for (s, (&lo, &hi)) in u[0].iter().zip(&u[1]).enumerate() {
            out[s] = _mm256_permute2x128_si256::<0x20>(lo, hi);
            out[s + 4] = _mm256_permute2x128_si256::<0x31>(lo, hi);
        }
        out
    }
}

/// Where a tile's weights come from: per panel `p` of the tile, block `b` and step, the 8 rows'
/// dotted bytes (as [`repack`] stores them: Q8_0's and IQ4_NL's flipped by 128 on the VNNI
/// paths), and per block the rows' `d` and min as floats.
pub(crate) trait Source: Copy {
    /// # Safety
    /// Panel `p`, block `b` are inside the source, on a CPU with `D`'s features.
    unsafe fn levels<D: Dots, const T: u8>(self, p: usize, b: usize, step: usize) -> __m256i;
    /// # Safety
    /// As [`Source::levels`].
    unsafe fn dw<const T: u8>(self, p: usize, b: usize) -> __m256;
    /// # Safety
    /// As [`Source::levels`].
    unsafe fn mw<const T: u8>(self, p: usize, b: usize) -> __m256;
    /// Asks for the bytes ahead of panel `p`'s block `b` where they stream from memory (a
    /// packed matrix: [`crate::x86::job::prefetch_ahead`]); nothing for the repacked panels,
    /// which were just written.
    fn fetch(self, _p: usize, _b: usize) {}
}

/// A repacked group's panels from `p0` on.
#[derive(Clone, Copy)]
struct Repacked<'a> {
    pn: &'a Panels,
    p0: usize,
}

impl Source for Repacked<'_> {
    #[inline(always)]
    unsafe fn levels<D: Dots, const T: u8>(self, p: usize, b: usize, step: usize) -> __m256i {
        // SAFETY: the caller's promise.
        unsafe {
            let at = (b * PANELS + self.p0 + p) * PANEL_BYTES + step * 32;
            _mm256_loadu_si256(self.pn.w.as_ptr().add(at).cast())
        }
    }
    #[inline(always)]
    unsafe fn dw<const T: u8>(self, p: usize, b: usize) -> __m256 {
        // SAFETY: the caller's promise.
        unsafe { _mm256_loadu_ps(self.pn.dw.as_ptr().add(b * ROWS + (self.p0 + p) * LANES)) }
    }
    #[inline(always)]
    unsafe fn mw<const T: u8>(self, p: usize, b: usize) -> __m256 {
        // SAFETY: the caller's promise.
        unsafe { _mm256_loadu_ps(self.pn.mw.as_ptr().add(b * ROWS + (self.p0 + p) * LANES)) }
    }
}

/// Adds each i16 pair sum of `d16` to its i32 lane of `dot` and clears `d16`: on AVX2 without
/// VNNI, [`tile`] sums the `vpmaddubsw` pairs of a run of steps as i16 and widens them once
/// (`vpmaddwd` by ones) instead of every step. The same integers: with activations in
/// -127..=127 a pair is at most 2 * 15 * 127 = 3810 (4-bit levels, a run of all 8 steps) or
/// 2 * 31 * 127 = 7874 (5 bits, runs of 4).
///
/// # Safety
/// On an AVX2 CPU.
#[inline(always)]
unsafe fn widen<const PP: usize, const CC: usize>(
    dot: &mut [[__m256i; CC]; PP],
    d16: &mut [[__m256i; CC]; PP],
) {
    // SAFETY: on an AVX2 CPU (the caller's promise).
    unsafe {
        for (dot, d16) in dot.iter_mut().zip(d16.iter_mut()) {
            for (dot, d16) in dot.iter_mut().zip(d16.iter_mut()) {
                *dot = _mm256_add_epi32(*dot, _mm256_madd_epi16(*d16, _mm256_set1_epi16(1)));
                *d16 = _mm256_setzero_si256();
            }
        }
    }
}

/// The `PP` panels from `p0` by activation rows `c0..c0 + CC` (`T` as in `dots32`).
#[inline(always)]
// The register tile is indexed [panel][column] from loops in the order the loads want.
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
pub(crate) unsafe fn tile<D: Dots, const PP: usize, const CC: usize, const T: u8>(
    job: &GroupJob<'_>,
    src: impl Source,
    j0: usize,
    p0: usize,
    c0: usize,
) {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        let (k, n) = (job.k, job.n);
        let nb = k / QK8;
        let acts = job.acts;
        let sign = signed_levels(T) && !D::VNNI;
        let corr = level_offset(T) != 0 || (signed_levels(T) && D::VNNI);
        let mins = has_min(T);
        assert!(c0 + CC <= job.m);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(!corr || acts.sums.len() >= (c0 + CC) * nb);
        // How far the dotted bytes sit above the weights' values: Q4_0's nibbles 8, Q5_0's
        // levels 16, flipped signed bytes 128.
        let lift = if signed_levels(T) {
            128
        } else {
            level_offset(T)
        };
        assert!(!mins || acts.s.len() >= (c0 + CC) * nb);
        let xq = acts.qs.as_ptr().add(c0 * k);
        // AVX2 without VNNI, unsigned 4- or 5-bit levels: pairs summed as i16 ([`widen`]).
        let narrow = !D::VNNI && !signed_levels(T);
        let run = if T == Q5_0 || T == Q5_1 { 4 } else { LANES };
        let mut acc = [[_mm256_setzero_ps(); CC]; PP];
        for b in 0..nb {
            // The first column tile streams the panels.
            (0..PP).filter(|_| c0 == 0).for_each(|p| src.fetch(p, b));
            // SAFETY: block b of the panels and of each activation row is in bounds (above).
            unsafe {
                let mut dot = [[_mm256_setzero_si256(); CC]; PP];
                let mut d16 = [[_mm256_setzero_si256(); CC]; PP];
                for step in 0..LANES {
                    // No closure: it would be compiled without the path's features.
                    let mut w = [_mm256_setzero_si256(); PP];
                    for (p, w) in w.iter_mut().enumerate() {
                        *w = src.levels::<D, T>(p, b, step);
                    }
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
                            if narrow {
                                let d = _mm256_maddubs_epi16(aw[p], xs);
                                d16[p][c] = _mm256_add_epi16(d16[p][c], d);
                            } else {
                                dot[p][c] = D::dpbusd(dot[p][c], aw[p], xs);
                            }
                        }
                    }
                    if narrow && (step + 1) % run == 0 {
                        widen(&mut dot, &mut d16);
                    }
                }
                let mut dw = [_mm256_setzero_ps(); PP];
                for (p, dw) in dw.iter_mut().enumerate() {
                    *dw = src.dw::<T>(p, b);
                }
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
                // (`p0` counts the tile's panels from `j0`; the source knows where they lie.)
                if mins {
                    // Q4_1's `sum_b m_w * s_x`, one fma chain per row, then added once.
                    let mut s = _mm256_setzero_ps();
                    for b in 0..nb {
                        // SAFETY: in bounds (checked above).
                        let (mv, sx) =
                            unsafe { (src.mw::<T>(p, b), *acts.s.as_ptr().add((c0 + c) * nb + b)) };
                        s = _mm256_fmadd_ps(mv, _mm256_set1_ps(sx), s);
                    }
                    v = _mm256_add_ps(v, s);
                }
                // SAFETY: only this thread's group writes these columns.
                unsafe { store_lanes(job, c0 + c, row0, v) };
            }
        }
    }
}

/// A panel's 8 lanes `v` as columns `row0..row0 + 8` (those below `n`) of output row `row`.
///
/// # Safety
/// The CPU has AVX2; `row < job.m`, `row0 < job.n`, and no other thread writes these columns.
#[inline(always)]
pub(crate) unsafe fn store_lanes(job: &GroupJob<'_>, row: usize, row0: usize, v: __m256) {
    // SAFETY: the caller's promise: row `row` of `y` has columns row0..n.
    unsafe {
        let dst = job.y.get().add(row * job.n + row0);
        if row0 + LANES <= job.n {
            _mm256_storeu_ps(dst, v);
        } else {
            let mut t = [0f32; LANES];
            _mm256_storeu_ps(t.as_mut_ptr(), v);
            for (l, &e) in t.iter().enumerate().take(job.n - row0) {
                *dst.add(l) = e;
            }
        }
    }
}

/// Activation rows of the next tile when `rest` are left: the path's `full` width, else 2 or 1.
pub(crate) fn tile_cols(rest: usize, full: usize) -> usize {
    if rest >= full {
        full
    } else if rest >= 2 {
        2
    } else {
        1
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
        // SAFETY: the caller runs on a CPU with `D`'s features.
        unsafe { repack::<D>(job.ty, job.data, job.n, job.k, j0, pn) };
        let mut p0 = 0;
        while p0 < PANELS && j0 + p0 * LANES < job.n {
            let mut c0 = 0;
            while c0 < job.m {
                let cc = tile_cols(job.m - c0, full);
                // SAFETY: the caller runs on a CPU with `D`'s features.
                let two = D::PANELS == 2 && p0 + 2 <= PANELS && j0 + LANES < job.n;
                let src = Repacked { pn, p0 };
                unsafe { dispatch::<D>(job, src, j0, p0, c0, cc, two) };
                c0 += cc;
            }
            p0 += D::PANELS;
        }
    }
}

/// [`tile`] for a run-time tile: two panels or one, `cc` activation rows (the path's full
/// width, 4, 2 or 1).
#[inline(always)]
pub(crate) unsafe fn dispatch<D: Dots>(
    job: &GroupJob<'_>,
    src: impl Source,
    j0: usize,
    p0: usize,
    c0: usize,
    cc: usize,
    two: bool,
) {
    use crate::x86::dots32::{IQ4NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0};
    macro_rules! by_cc {
        ($pp:literal, $t:ident) => {
            // SAFETY: as the caller promises.
            unsafe {
                match cc {
                    6 => tile::<D, $pp, 6, $t>(job, src, j0, p0, c0),
                    4 => tile::<D, $pp, 4, $t>(job, src, j0, p0, c0),
                    2 => tile::<D, $pp, 2, $t>(job, src, j0, p0, c0),
                    _ => tile::<D, $pp, 1, $t>(job, src, j0, p0, c0),
                }
            }
        };
    }
    macro_rules! go {
        ($pp:literal) => {
            match block32(job.ty) {
                Some(Q4_0) => by_cc!($pp, Q4_0),
                Some(Q4_1) => by_cc!($pp, Q4_1),
                Some(Q5_0) => by_cc!($pp, Q5_0),
                Some(Q5_1) => by_cc!($pp, Q5_1),
                Some(IQ4NL) => by_cc!($pp, IQ4NL),
                _ => by_cc!($pp, Q8_0),
            }
        };
    }
    if two { go!(2) } else { go!(1) }
}

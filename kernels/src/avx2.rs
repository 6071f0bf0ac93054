//! AVX2/FMA kernels: activation quantization (Q8_0/Q8_1) and the integer matmul of the
//! 32-element block types (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL; one unpack, [`levels`]): up to [`DIRECT_ROWS`] activation rows, 4 weight rows x `Dots::COLS` activation rows
//! read from the ggml blocks in place (decode: the weights stream from memory once); past it,
//! the repacked panels of `avx2_panel`. Bit-identical to the portable formulas in `quant`; the
//! integer dots and the entry points ([`run_groups`], [`dot_row`]) exist once per x86 path
//! (`isa`).
//!
//! Batch invariance: every output element goes through the same float operations whatever tile
//! or path it lands in (per block the exact integer dot, `acc = fma(d_w * d_x, dot, acc)`, then
//! `+ summs` for Q4_1 and Q5_1: `quant::dot_q32`); tiles only share loads, never arithmetic.

use std::arch::x86_64::*;

use crate::WType;
use crate::isa::{Dots, isa_entry};
use crate::quant::{self, ActRow, ActType, QActsRows, QK8};

/// Weight rows per tile.
pub(crate) const R: usize = 4;
/// Activation rows of the largest tile; each path uses `Dots::COLS` (at most this) of them.
pub(crate) const C: usize = 3;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f32_to_f16_to_f32(x: f32) -> f32 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x));
    _mm_cvtss_f32(_mm_cvtph_ps(h))
}

/// Quantizes rows (Q8_0 / Q8_1) as ggml's AVX2 `quantize_row_q8_0/1`; Q8_K has no x86 SIMD
/// version in ggml either, so it takes the portable formula, compiled here with AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_rows(x: &[f32], out: &mut QActsRows<'_>) {
    if !matches!(out.ty, ActType::Q8_0 | ActType::Q8_1) {
        quant::quantize_rows_portable(x, out);
        return;
    }
    let nb_total = x.len() / QK8;
    assert!(out.qs.len() >= nb_total * QK8 && out.d.len() >= nb_total);
    assert!(out.ty != ActType::Q8_1 || out.s.len() >= nb_total);
    assert!(out.sums.len() >= nb_total);
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for blk in 0..nb_total {
        // SAFETY: block `blk` lies inside `x` (32 floats) and `out.qs` (32 bytes), checked above.
        let (v, q) = unsafe {
            let p = x.as_ptr().add(blk * QK8);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            (v, out.qs.as_mut_ptr().add(blk * QK8))
        };
        let mut amax = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, *vi));
        }
        let mut m4 = _mm_max_ps(
            _mm256_extractf128_ps::<1>(amax),
            _mm256_castps256_ps128(amax),
        );
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let max = _mm_cvtss_f32(m4);
        let d = max / 127.0;
        let id = _mm256_set1_ps(if max != 0.0 { 127.0 / max } else { 0.0 });
        let i: [__m256i; 4] = std::array::from_fn(|j| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[j], id)))
        });
        out.d[blk] = f32_to_f16_to_f32(d);
        let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let s = _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)));
        out.sums[blk] = sum;
        if out.ty == ActType::Q8_1 {
            out.s[blk] = f32_to_f16_to_f32(d * sum as f32);
        }
        let p01 = _mm256_packs_epi32(i[0], i[1]);
        let p23 = _mm256_packs_epi32(i[2], i[3]);
        let packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        // SAFETY: `q` points at 32 writable bytes (checked above).
        unsafe { _mm256_storeu_si256(q.cast(), packed) };
    }
}

/// Per-thread buffers, reused across calls: the batched path's repacked group.
#[derive(Default)]
pub(crate) struct Scratch {
    panels: crate::avx2_panel::Panels,
    pub(crate) panels_k: crate::avx2_panel_k::PanelsK,
}

/// Weight rows per group of a matmul of `m` activation rows: the in-place tiles' `R` up to
/// [`DIRECT_ROWS`], the repacked panels' past it.
pub(crate) fn group_rows(m: usize) -> usize {
    if m <= DIRECT_ROWS {
        R
    } else {
        crate::avx2_panel::ROWS
    }
}

/// What one thread needs to run its weight-row groups.
pub(crate) struct GroupJob<'a> {
    pub ty: WType,
    pub data: &'a [u8],
    pub layout: crate::Layout,
    pub n: usize,
    pub k: usize,
    pub m: usize,
    pub acts: &'a quant::QActs,
    /// `y`, `m x n`; rows of different threads' groups are disjoint columns.
    pub y: crate::SendPtr<f32>,
}

/// Computes output columns of weight-row groups `g_lo..g_hi` for every activation row.
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn groups<D: Dots>(job: &GroupJob<'_>, g_lo: usize, g_hi: usize, s: &mut Scratch) {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        if job.layout == crate::Layout::Rows8 {
            crate::avx2_rows8::groups::<D>(job, g_lo, g_hi, s);
            return;
        }
        if crate::avx2_panel_k::has_panels(job.ty) {
            crate::avx2_panel_k::groups::<D>(job, g_lo, g_hi, &mut s.panels_k);
            return;
        }
        let cols = D::COLS.min(C);
        // Up to DIRECT_ROWS activation rows, read the ggml blocks in place, a tile of `cols`
        // rows at a time: the group's weight bytes come from DRAM for the first tile and from
        // L1 for the others, cheaper than unpacking them (decode, and small batches).
        if job.m <= DIRECT_ROWS {
            for g in g_lo..g_hi {
                // Tiles as even as `cols` allows (4 rows: 2 + 2, not 3 + 1): a one-row tile
                // pays a whole tile's block overhead for a third of the work.
                let mut tiles = job.m.div_ceil(cols);
                let mut c0 = 0;
                while c0 < job.m {
                    let cc = (job.m - c0).div_ceil(tiles);
                    tiles -= 1;
                    let fetch = c0 == 0;
                    match block32(job.ty) {
                        Some(Q4_0) => direct::<D, Q4_0>(job, g * R, c0, cc, fetch),
                        Some(Q4_1) => direct::<D, Q4_1>(job, g * R, c0, cc, fetch),
                        Some(Q5_0) => direct::<D, Q5_0>(job, g * R, c0, cc, fetch),
                        Some(Q5_1) => direct::<D, Q5_1>(job, g * R, c0, cc, fetch),
                        Some(IQ4NL) => direct::<D, IQ4NL>(job, g * R, c0, cc, fetch),
                        _ => direct::<D, Q8_0>(job, g * R, c0, cc, fetch),
                    }
                    c0 += cc;
                }
            }
            return;
        }
        crate::avx2_panel::groups::<D>(job, g_lo, g_hi, &mut s.panels);
    }
}

/// [`tile_direct`] of type `T` for a run-time tile width `cc` (1, 2, or [`C`]).
#[inline(always)]
unsafe fn direct<D: Dots, const T: u8>(
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

/// Dot of one weight row with one activation row: the kernels of `avx2_kquant` and
/// `avx2_lowbit`, the portable formula compiled for the path's features for the 32-element
/// types (whose matmuls take the tiled kernels here).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn row_dot<D: Dots>(ty: WType, w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        match ty {
            WType::Q4K => crate::avx2_kquant::dot_q4k::<D>(w, x),
            WType::Q5K => crate::avx2_kquant::dot_q5k::<D>(w, x),
            WType::Q6K => crate::avx2_kquant::dot_q6k::<D>(w, x),
            WType::Q2K => crate::avx2_lowbit::dot_q2k::<D>(w, x),
            WType::Q3K => crate::avx2_lowbit::dot_q3k::<D>(w, x),
            WType::MXFP4 => crate::avx2_lowbit::dot_grid4::<D>(&crate::dots::MXFP4_GRID, w, x),
            WType::IQ4XS => crate::avx2_lowbit::dot_iq4xs::<D>(w, x),
            _ => quant::dot_q32(ty, w, x),
        }
    }
}

/// Dots of one weight row with 4 activation rows, each bit-identical to [`row_dot`]'s: each
/// weight block is unpacked once for the 4 (the `*_rows` kernels of `avx2_kquant` and
/// `avx2_lowbit`); `None` for the 32-element types, whose batches take the tiles and panels.
#[inline(always)]
unsafe fn rows_dot4<D: Dots>(ty: WType, w: &[u8], xs: [ActRow<'_>; 4]) -> Option<[f32; 4]> {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        match ty {
            WType::Q4K => Some(crate::avx2_kquant::dot_q4k_rows::<D, 4>(w, xs)),
            WType::Q5K => Some(crate::avx2_kquant::dot_q5k_rows::<D, 4>(w, xs)),
            WType::Q6K => Some(crate::avx2_kquant::dot_q6k_rows::<D, 4>(w, xs)),
            WType::Q2K => Some(crate::avx2_lowbit::dot_q2k_rows::<D, 4>(w, xs)),
            WType::Q3K => Some(crate::avx2_lowbit::dot_q3k_rows::<D, 4>(w, xs)),
            WType::MXFP4 => Some(crate::avx2_lowbit::dot_grid4_rows::<D, 4>(
                &crate::dots::MXFP4_GRID,
                w,
                xs,
            )),
            WType::IQ4XS => Some(crate::avx2_lowbit::dot_iq4xs_rows::<D, 4>(w, xs)),
            _ => None,
        }
    }
}

isa_entry!(
    /// [`rows_dot4`] on the x86 path `path`.
    pub(crate) fn dot_rows4(ty: WType, w: &[u8], xs: [ActRow<'_>; 4]) -> Option<[f32; 4]> => rows_dot4
);

isa_entry!(
    /// [`row_dot`] on the x86 path `path`.
    pub(crate) fn dot_row(ty: WType, w: &[u8], x: ActRow<'_>) -> f32 => row_dot
);

isa_entry!(
    /// Computes output columns of weight-row groups `g_lo..g_hi` for every activation row, on
    /// the x86 path `path`.
    pub(crate) fn run_groups(job: &GroupJob<'_>, g_lo: usize, g_hi: usize, s: &mut Scratch) => groups
);

/// One row of float weights (`F32`, `F16` or `BF16` bytes) widened to f32 in `out`: the same
/// exact values [`crate::dequantize_row`] gives, eight at a time (F16C for f16).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn widen_row(ty: WType, w: &[u8], out: &mut [f32]) {
    let k = out.len();
    let main = k / 8 * 8;
    match ty {
        WType::F16 | WType::BF16 => {
            assert!(w.len() >= 2 * k);
            for i in (0..main).step_by(8) {
                // SAFETY: bytes 2i..2i+16 of `w` and floats i..i+8 of `out` are in bounds.
                unsafe {
                    let h = _mm_loadu_si128(w.as_ptr().add(2 * i).cast());
                    let f = if ty == WType::F16 {
                        _mm256_cvtph_ps(h)
                    } else {
                        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                    };
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), f);
                }
            }
            crate::dequantize_row(ty, &w[2 * main..2 * k], &mut out[main..]);
        }
        WType::F32 => {
            assert!(w.len() >= 4 * k);
            for i in (0..main).step_by(8) {
                // SAFETY: bytes 4i..4i+32 of `w` and floats i..i+8 of `out` are in bounds.
                unsafe {
                    let f = _mm256_loadu_ps(w.as_ptr().add(4 * i).cast());
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), f);
                }
            }
            crate::dequantize_row(ty, &w[4 * main..4 * k], &mut out[main..]);
        }
        _ => crate::dequantize_row(ty, w, out),
    }
}

/// Plain f32 dot, the portable formula compiled for AVX2/FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    quant::dot_f32(x, w)
}

/// The dots of `RA` activation rows with 4 weight rows, each bit for bit [`quant::dot_f32`]'s
/// (the same 8-lane FMA chain, the same reduction and tail): one chain waits for its FMA's
/// latency every step, so a lone dot runs at a fraction of the FMA units' rate; `4 * RA` chains
/// side by side keep them busy, and each weight vector is loaded once for `RA` rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f32_tile<const RA: usize>(xs: [&[f32]; RA], ws: [&[f32]; 4]) -> [[f32; 4]; RA] {
    let k = ws[0].len();
    assert!(ws.iter().all(|w| w.len() == k) && xs.iter().all(|x| x.len() == k));
    let main = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); 4]; RA];
    let mut c = 0;
    while c < main {
        // SAFETY: c + 8 <= main <= k, the length of every row (asserted above).
        unsafe {
            let wv = [
                _mm256_loadu_ps(ws[0].as_ptr().add(c)),
                _mm256_loadu_ps(ws[1].as_ptr().add(c)),
                _mm256_loadu_ps(ws[2].as_ptr().add(c)),
                _mm256_loadu_ps(ws[3].as_ptr().add(c)),
            ];
            for a in 0..RA {
                let xv = _mm256_loadu_ps(xs[a].as_ptr().add(c));
                for r in 0..4 {
                    acc[a][r] = _mm256_fmadd_ps(xv, wv[r], acc[a][r]);
                }
            }
        }
        c += 8;
    }
    let mut out = [[0f32; 4]; RA];
    for a in 0..RA {
        for r in 0..4 {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[a][r]) };
            let mut s = quant::hsum8(lanes);
            for t in main..k {
                s = xs[a][t].mul_add(ws[r][t], s);
            }
            out[a][r] = s;
        }
    }
    out
}

/// How many weight-row groups ahead of the current one the in-place tiles prefetch.
const PREFETCH_GROUPS: usize = 1;
/// Most activation rows the in-place tiles take (see [`groups`]); past it, each group's
/// weights are repacked once into panels (`avx2_panel`). Measured with `step_rows`
/// (BENCHMARKS.md): in place is faster up to 9 rows, the two are even at 10-12.
const DIRECT_ROWS: usize = crate::IN_PLACE_MAX_ROWS;

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

/// Bytes per block of type `t`.
pub(crate) const fn block_bytes(t: u8) -> usize {
    match t {
        Q4_0 | IQ4NL => 18,
        Q4_1 => 20,
        Q5_0 => 22,
        Q5_1 => 24,
        _ => 34,
    }
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

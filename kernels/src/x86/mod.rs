//! The x86 kernels: every weight type's matmul and dots on AVX2, AVX-VNNI and AVX-512 VNNI,
//! compiled once per path from code generic over the integer dot ([`isa::Dots`]) and chosen at
//! run time. Each is bit-identical to the portable formulas (`quant`, `dots`, `dequant`).
//!
//! Modules, by what they compute:
//! - (this file) the dispatch: a thread's weight-row groups to the kernel of their type, layout
//!   and batch ([`run_groups`]), one row's dots ([`dot_row`], [`dot_rows4`]), and the per-thread
//!   [`Scratch`].
//! - `isa`: the integer-dot paths (AVX2, AVX-VNNI, AVX-512 VNNI) and `isa_entry!`, which
//!   compiles an entry point once per path.
//! - `job`: [`GroupJob`], one matmul as the kernels take it.
//! - `act`: the activation quantizers (Q8_0, Q8_1).
//! - `floats`: F32, F16 and BF16 weights: rows widened, f32 dots and tiles.
//! - `dots32`: in-place dots of the 32-element block types (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1,
//!   IQ4_NL), for decode and small batches; the one unpack of their levels.
//! - `panel32`: the same types for batches, on weight rows repacked into 8-row panels.
//! - `kquant`: in-place dots of the K-quants (Q4_K, Q5_K, Q6_K) with Q8_K activations.
//! - `kblock`: what the K-quant kernels share: the type a kernel is compiled for, where a
//!   tile's block is, a panel's vector.
//! - `panel_k`: the K-quants for batches, on repacked 8-row panels.
//! - `k16`: the K-quants of 16-element sub-blocks (Q6_K, Q3_K, Q2_K): their packed levels and
//!   one block's integer part for a tile.
//! - `lowbit`: in-place dots of Q2_K, Q3_K, IQ4_XS and MXFP4.
//! - `packed_fields`: where each field of a packed block lies, and its scales unpacked into the
//!   tiles' pair vectors (per tile, or once per group for large batches).
//! - `packed_dots`: the matmul of matrices packed 8 rows at a time at load (`crate::packed`),
//!   decode and batches.
//! - `wide`: the K-quants' batched tiles on 512-bit vectors, two panels a vector, and the probe
//!   that says whether this CPU runs them faster than ymm (`Backend::Avx512Zmm`).
//! - `wide32`: the same for the 32-element types.
//!
//! Imports run one way: the dispatch over every kernel; `packed_dots` over `wide32`, `wide`,
//! `packed_fields` and the panels; `panel_k` over `wide`; `wide32` over `wide` and `panel32`;
//! `wide` over `kquant`, `kblock` and `panel32`; `packed_fields` over `kblock`; `panel_k` over
//! `k16`, and both over `kblock`; the panels over `dots32`, `kquant` and `job`; nothing back
//! up.

use crate::WType;
use crate::quant::{self, ActRow};

pub(crate) mod act;
pub(crate) mod dots32;
pub(crate) mod floats;
pub(crate) mod isa;
pub(crate) mod job;
pub(crate) mod k16;
pub(crate) mod kblock;
pub(crate) mod kquant;
pub(crate) mod lowbit;
pub(crate) mod packed_dots;
pub(crate) mod packed_fields;
pub(crate) mod panel32;
pub(crate) mod panel_k;
pub(crate) mod wide;
pub(crate) mod wide32;

use dots32::{C, DIRECT_ROWS, IQ4NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, R, block32, direct};
use isa::{Dots, isa_entry};
use job::GroupJob;

/// Per-thread buffers, reused across calls: the batched path's repacked group.
#[derive(Default)]
pub(crate) struct Scratch {
    panels: panel32::Panels,
    pub(crate) panels_k: panel_k::PanelsK,
}

/// Weight rows per group of a matmul of `m` activation rows: the in-place tiles' `R` up to
/// [`DIRECT_ROWS`], the repacked panels' past it.
pub(crate) fn group_rows(m: usize) -> usize {
    if m <= DIRECT_ROWS { R } else { panel32::ROWS }
}

/// Computes output columns of weight-row groups `g_lo..g_hi` for every activation row.
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn groups<D: Dots>(job: &GroupJob<'_>, g_lo: usize, g_hi: usize, s: &mut Scratch) {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        if job.layout == crate::Layout::Rows8 {
            packed_dots::groups::<D>(job, g_lo, g_hi, &mut s.panels_k);
            return;
        }
        if panel_k::has_panels(job.ty) {
            panel_k::groups::<D>(job, g_lo, g_hi, &mut s.panels_k);
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
        panel32::groups::<D>(job, g_lo, g_hi, &mut s.panels);
    }
}

/// Dot of one weight row with one activation row: the kernels of `x86::kquant` and
/// `x86::lowbit`, the portable formula compiled for the path's features for the 32-element
/// types (whose matmuls take the tiled kernels here).
#[inline(always)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn row_dot<D: Dots>(ty: WType, w: &[u8], x: ActRow<'_>) -> f32 {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        match ty {
            WType::Q4K => kquant::dot_q4k::<D>(w, x),
            WType::Q5K => kquant::dot_q5k::<D>(w, x),
            WType::Q6K => kquant::dot_q6k::<D>(w, x),
            WType::Q2K => lowbit::dot_q2k::<D>(w, x),
            WType::Q3K => lowbit::dot_q3k::<D>(w, x),
            WType::MXFP4 => lowbit::dot_grid4::<D>(&crate::dots::MXFP4_GRID, w, x),
            WType::IQ4XS => lowbit::dot_iq4xs::<D>(w, x),
            _ => quant::dot_q32(ty, w, x),
        }
    }
}

/// Dots of one weight row with 4 activation rows, each bit-identical to [`row_dot`]'s: each
/// weight block is unpacked once for the 4 (the `*_rows` kernels of `x86::kquant` and
/// `x86::lowbit`); `None` for the 32-element types, whose batches take the tiles and panels.
#[inline(always)]
unsafe fn rows_dot4<D: Dots>(ty: WType, w: &[u8], xs: [ActRow<'_>; 4]) -> Option<[f32; 4]> {
    // SAFETY: the caller runs on a CPU with `D`'s features (see `isa`).
    unsafe {
        match ty {
            WType::Q4K => Some(kquant::dot_q4k_rows::<D, 4>(w, xs)),
            WType::Q5K => Some(kquant::dot_q5k_rows::<D, 4>(w, xs)),
            WType::Q6K => Some(kquant::dot_q6k_rows::<D, 4>(w, xs)),
            WType::Q2K => Some(lowbit::dot_q2k_rows::<D, 4>(w, xs)),
            WType::Q3K => Some(lowbit::dot_q3k_rows::<D, 4>(w, xs)),
            WType::MXFP4 => Some(lowbit::dot_grid4_rows::<D, 4>(
                &crate::dots::MXFP4_GRID,
                w,
                xs,
            )),
            WType::IQ4XS => Some(lowbit::dot_iq4xs_rows::<D, 4>(w, xs)),
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

//! [`GroupJob`]: one matmul as the x86 kernels take it, split over threads by groups of weight
//! rows.

use crate::WType;
use crate::quant;

/// What one thread needs to run its weight-row groups.
pub(crate) struct GroupJob<'a> {
    pub ty: WType,
    pub data: &'a [u8],
    pub layout: crate::Layout,
    pub n: usize,
    pub k: usize,
    pub m: usize,
    pub acts: &'a quant::QActs,
    /// Run the 512-bit tiles where a type has them (`x86::wide`; `Backend::Avx512Zmm`, on the
    /// AVX-512 VNNI path only).
    pub wide: bool,
    /// `y`, `m x n`; rows of different threads' groups are disjoint columns.
    pub y: crate::SendPtr<f32>,
}

/// How far ahead of the block being dotted a decode tile asks for weight bytes: 4 KiB, past
/// what the hardware prefetchers keep in flight. Measured with `type_rates` at one row, 16
/// layers (past the cache), on an Intel Xeon (AVX-512 VNNI): the share of the read bandwidth
/// went from 75% to 101% (Q4_K), 50% to 99% (Q6_K), 71% to 96% (Q5_K) and 68% to 99% (IQ4_XS)
/// with two threads, alike with one; 2-16 KiB ahead were within noise of each other.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Asks for the `len` bytes [`PREFETCH_AHEAD`] past `p` (one request a 64-byte line). Only an
/// address is formed: a prefetch past the end of the weights never faults.
#[inline(always)]
pub(crate) fn prefetch_ahead(p: *const u8, len: usize) {
    let p = p.wrapping_add(PREFETCH_AHEAD);
    let mut o = 0;
    while o < len {
        // SAFETY: `prefetch` reads nothing architecturally and never faults; SSE is part of
        // every x86-64 CPU.
        unsafe {
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                p.wrapping_add(o).cast(),
            )
        };
        o += 64;
    }
}

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

//! TPS Lab compute kernels: the hot loops of the model forward, kept apart from the engine so
//! each can be tested against a plain reference implementation.
//!
//! Modules:
//! - (this file) the public API: [`QMatrix`], [`matmul`], [`dequantize_row`].
//! - `wtype`: the weight types ([`WType`]): ggml's block sizes, and the one table of their names
//!   (`Display`, `FromStr`).
//! - `dequant`: weight blocks (ggml layouts) back to f32, the plain reference for every type.
//! - `quantize`: weight quantization, f32 rows to ggml block bytes, byte-exact with ggml's
//!   reference quantizers (`quantize_row_*_ref`, the K-quants' scale searches included).
//! - `quantize_lowbit`: the Q3_K, IQ4_NL and IQ4_XS quantizers (ggml's scale searches), and
//!   MXFP4's.
//! - `quant`: activation quantization (Q8_0, Q8_1, Q8_K) and the per-element dot formulas,
//!   portable: ggml's AVX2 float operations for the K-quants, one FMA per block for the
//!   32-element types (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL).
//! - `dots`: the portable dot formulas of Q2_K, Q3_K, IQ4_XS and MXFP4.
//! - `x86`: every weight type's matmul and dots on AVX2, AVX-VNNI and AVX-512 VNNI, generic over
//!   the integer dot and compiled once per path, chosen at run time ([`Backend::detect`]): the
//!   in-place dots of decode, the repacked panels of batches, the packed matrices' matmul
//!   (`x86/mod.rs` names its files).
//! - `matmul`: backend choice, tiling, the split over threads and scratch memory.
//! - `glu`: gated linear units over rows (SwiGLU, GeGLU) split over the pool.
//! - `moe`: mixture-of-experts routing and the expert FFN grouped by expert (each expert's
//!   weights read once per step).
//! - `pool`: a persistent thread pool for splitting one operation over the cores.
//! - `membw`: the machine's memory read bandwidth, measured (what decode is stated against).
//! - `attn`: paged attention over K/V caches of f16, or of BF16 / Q8_0 / Q4_0 blocks
//!   (AVX2/FMA/F16C with a portable fallback), with sliding windows, soft-capping and per-head
//!   sinks.
//! - `cuda` (feature `cuda`, on by default): the GPU kernels (`kernels/cuda/*.cu`, embedded as the
//!   PTX in `kernels/ptx/`) behind safe wrappers on cudarc; libcuda is loaded at run time.

pub mod attn;
#[cfg(feature = "cuda")]
pub mod cuda;
mod dequant;
mod dots;
pub mod glu;
mod matmul;
pub mod membw;
pub mod moe;
pub mod packed;
pub mod pool;
pub mod quant;
pub mod quantize;
mod quantize_lowbit;
mod wtype;
#[cfg(target_arch = "x86_64")]
mod x86;

pub use dequant::dequantize_row;
pub use matmul::{Backend, matmul, matmul_with, quantize_activations, reference_matmul};
pub use packed::Layout;
pub use pool::ThreadPool;
pub use quantize::quantize_row;
pub use wtype::{UnknownWType, WType};

/// Most activation rows a Q4_0/Q4_1/Q8_0 matmul reads its weight blocks in place for (decode,
/// small batches); past it, the x86 kernels repack each weight group into panels first. The
/// capacity planner's CPU calibration names the same switch (`batched_above_tokens`).
pub const IN_PLACE_MAX_ROWS: usize = 9;

/// A weight matrix of `n` rows (output features) by `k` columns (input features), each row
/// `k / block_size` blocks, laid out as `layout` says (row after row, or packed).
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: WType,
    pub n: usize,
    pub k: usize,
    pub data: &'a [u8],
    pub layout: Layout,
}

impl<'a> QMatrix<'a> {
    /// A matrix of ggml rows, as a GGUF file holds them.
    pub fn rows(ty: WType, n: usize, k: usize, data: &'a [u8]) -> Self {
        Self {
            ty,
            n,
            k,
            data,
            layout: Layout::Ggml,
        }
    }
}

/// A raw pointer that may cross to pool threads; users guarantee disjoint writes.
#[derive(Clone, Copy)]
pub struct SendPtr<T>(pub *mut T);
// SAFETY: only used for disjoint writes coordinated by the pool's join.
unsafe impl<T> Send for SendPtr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for SendPtr<T> {}
impl<T> SendPtr<T> {
    pub fn get(self) -> *mut T {
        self.0
    }
}

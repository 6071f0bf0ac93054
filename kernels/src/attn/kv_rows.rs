//! One layer's K or V cache as attention reads it ([`KvRows`]): f16 values (the default, which
//! the AVX2 path converts in place), or rows of another element type in ggml's block layout
//! (BF16, Q8_0, Q4_0: llama.cpp's `--cache-type-k/-v`), dequantized to f32 a head at a time.

use half::f16;
use half::slice::HalfFloatSliceExt;

use crate::{WType, dequantize_row};

/// A cache of `len()` elements: slot `s` holds `kv_dim` elements from element `s * kv_dim`.
#[derive(Debug, Clone, Copy)]
pub enum KvRows<'a> {
    /// f16 values, one per element.
    F16(&'a [f16]),
    /// ggml blocks of `ty` (whole blocks per head: the head size is a multiple of the block).
    Blocks { ty: WType, data: &'a [u8] },
}

impl KvRows<'_> {
    /// The element type.
    pub fn ty(&self) -> WType {
        match self {
            Self::F16(_) => WType::F16,
            Self::Blocks { ty, .. } => *ty,
        }
    }

    /// Elements in the cache.
    pub fn len(&self) -> usize {
        match self {
            Self::F16(x) => x.len(),
            Self::Blocks { ty, data } => data.len() / ty.type_size() * ty.block_size(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Elements `off..off + out.len()` as f32 (both multiples of the type's block).
    ///
    /// # Panics
    /// If the range is outside the cache or does not start and end on a block boundary.
    pub fn to_f32(&self, off: usize, out: &mut [f32]) {
        match self {
            Self::F16(x) => x[off..off + out.len()].convert_to_f32_slice(out),
            Self::Blocks { ty, data } => {
                let bs = ty.block_size();
                assert!(
                    off.is_multiple_of(bs) && out.len().is_multiple_of(bs),
                    "KV rows of {ty} are read in whole blocks of {bs}"
                );
                let start = off / bs * ty.type_size();
                dequantize_row(*ty, &data[start..start + ty.row_bytes(out.len())], out);
            }
        }
    }
}

//! Shared test helpers: ggml-layout weights built with candle's reference quantizers, random
//! data, and the f64 reference matmul.
#![allow(dead_code, clippy::unwrap_used)]

pub mod sim;

use candle_core::quantized::k_quants::{
    BlockQ2K, BlockQ3K, BlockQ4_0, BlockQ4_1, BlockQ4K, BlockQ5_0, BlockQ5_1, BlockQ5K, BlockQ6K,
    BlockQ8_0, GgmlType,
};
use rand::{Rng, SeedableRng, rngs::StdRng};
use tpslab_kernels::{QMatrix, WType};

pub const ALL_TYPES: [WType; 16] = WType::ALL;

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Roughly normal values (sum of uniforms), with an occasional outlier like real activations.
pub fn random_vec(rng: &mut StdRng, len: usize, scale: f32) -> Vec<f32> {
    (0..len)
        .map(|_| {
            let v: f32 = (0..4).map(|_| rng.random_range(-1.0f32..1.0)).sum::<f32>() * scale;
            if rng.random_range(0..50) == 0 {
                v * 8.0
            } else {
                v
            }
        })
        .collect()
}

/// The raw bytes of a slice of `#[repr(C)]` blocks (candle's block structs mirror ggml's).
pub fn bytes_of<T>(blocks: &[T]) -> Vec<u8> {
    // SAFETY: candle's block types are #[repr(C)] plain data with no padding (their sizes are
    // asserted equal to ggml's); reading their bytes is fine.
    unsafe {
        std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks))
    }
    .to_vec()
}

/// Blocks of type `T` from ggml-layout bytes.
pub fn blocks_from<T: GgmlType>(bytes: &[u8]) -> Vec<T> {
    let n = bytes.len() / std::mem::size_of::<T>();
    assert_eq!(n * std::mem::size_of::<T>(), bytes.len());
    let mut v = vec![T::zeros(); n];
    // SAFETY: as in `bytes_of`; every bit pattern of these plain-data structs is valid.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), v.as_mut_ptr().cast::<u8>(), bytes.len())
    };
    v
}

fn quantize_with<T: GgmlType>(x: &[f32]) -> Vec<u8> {
    let mut blocks = vec![T::zeros(); x.len() / T::BLCK_SIZE];
    T::from_float(x, &mut blocks);
    bytes_of(&blocks)
}

/// `x` (rows of `k`) in weight type `ty`, ggml layout, quantized by candle's reference code
/// (IQ4_NL, IQ4_XS and MXFP4, which candle lacks, by ours).
pub fn to_weight_bytes(ty: WType, x: &[f32]) -> Vec<u8> {
    match ty {
        WType::F32 => x.iter().flat_map(|v| v.to_le_bytes()).collect(),
        WType::F16 => x
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        WType::BF16 => x
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        WType::Q4_0 => quantize_with::<BlockQ4_0>(x),
        WType::Q4_1 => quantize_with::<BlockQ4_1>(x),
        WType::Q8_0 => quantize_with::<BlockQ8_0>(x),
        WType::Q4K => quantize_with::<BlockQ4K>(x),
        WType::Q5K => quantize_with::<BlockQ5K>(x),
        WType::Q6K => quantize_with::<BlockQ6K>(x),
        WType::Q5_0 => quantize_with::<BlockQ5_0>(x),
        WType::Q5_1 => quantize_with::<BlockQ5_1>(x),
        WType::Q2K => quantize_with::<BlockQ2K>(x),
        WType::Q3K => quantize_with::<BlockQ3K>(x),
        WType::IQ4NL | WType::IQ4XS | WType::MXFP4 => tpslab_kernels::quantize::quantize(ty, x),
    }
}

/// Random `n x k` weights of type `ty`.
pub fn random_weights(rng: &mut StdRng, ty: WType, n: usize, k: usize) -> Vec<u8> {
    to_weight_bytes(ty, &random_vec(rng, n * k, 0.05))
}

/// Dequantized weights, `n x k`.
pub fn dequantized(w: &QMatrix<'_>) -> Vec<f32> {
    let rb = w.ty.row_bytes(w.k);
    let mut out = vec![0f32; w.n * w.k];
    for j in 0..w.n {
        tpslab_kernels::dequantize_row(
            w.ty,
            &w.data[j * rb..(j + 1) * rb],
            &mut out[j * w.k..(j + 1) * w.k],
        );
    }
    out
}

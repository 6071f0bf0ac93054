//! TPS Lab compute kernels: the hot loops of the model forward, kept apart from the engine so
//! each can be tested against a plain reference implementation.
//!
//! Modules:
//! - (this file) the public API: weight types, [`QMatrix`], [`matmul`], [`dequantize_row`].
//! - `pool`: a persistent thread pool for splitting one operation over the cores.

pub mod pool;

pub use pool::ThreadPool;

/// Weight element types, with ggml's block layouts (so GGUF tensor bytes are used as they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q8_0,
}

impl WType {
    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q4_0 | Self::Q4_1 | Self::Q8_0 => 32,
        }
    }
    /// Bytes per block.
    pub fn type_size(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q8_0 => 34,
        }
    }
    /// Bytes of one row of `k` elements.
    pub fn row_bytes(self, k: usize) -> usize {
        k / self.block_size() * self.type_size()
    }
}

/// A weight matrix of `n` rows (output features) by `k` columns (input features), row-major,
/// each row stored as `k / block_size` blocks.
#[derive(Debug, Clone, Copy)]
pub struct QMatrix<'a> {
    pub ty: WType,
    pub n: usize,
    pub k: usize,
    pub data: &'a [u8],
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Dequantizes one row (`out.len()` elements) of type `ty` from `data`.
pub fn dequantize_row(ty: WType, data: &[u8], out: &mut [f32]) {
    let bs = ty.block_size();
    let ts = ty.type_size();
    for (b, chunk) in out.chunks_mut(bs).enumerate() {
        let blk = &data[b * ts..(b + 1) * ts];
        match ty {
            WType::F32 => chunk[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            WType::F16 => chunk[0] = f16_at(blk, 0),
            WType::BF16 => chunk[0] = half::bf16::from_le_bytes([blk[0], blk[1]]).to_f32(),
            WType::Q4_0 => {
                let d = f16_at(blk, 0);
                for j in 0..16 {
                    chunk[j] = d * ((blk[2 + j] & 0x0f) as f32 - 8.0);
                    chunk[j + 16] = d * ((blk[2 + j] >> 4) as f32 - 8.0);
                }
            }
            WType::Q4_1 => {
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                for j in 0..16 {
                    chunk[j] = d * (blk[4 + j] & 0x0f) as f32 + m;
                    chunk[j + 16] = d * (blk[4 + j] >> 4) as f32 + m;
                }
            }
            WType::Q8_0 => {
                let d = f16_at(blk, 0);
                for j in 0..32 {
                    chunk[j] = d * (blk[2 + j] as i8) as f32;
                }
            }
        }
    }
}

/// `y[i][j] = sum_l x[i][l] * w[j][l]` for `m` rows of activations `x` (`m * w.k` floats);
/// `y` holds `m * w.n` floats. Row `i` of `y` is bit-identical whatever `m` and the thread
/// count are (batch invariance).
pub fn matmul(pool: &ThreadPool, w: &QMatrix<'_>, x: &[f32], m: usize, y: &mut [f32]) {
    assert_eq!(x.len(), m * w.k);
    assert_eq!(y.len(), m * w.n);
    let rb = w.ty.row_bytes(w.k);
    let yp = SendPtr(y.as_mut_ptr());
    pool.run(&|tid, nth| {
        let per = w.n.div_ceil(nth);
        let (lo, hi) = (tid * per, ((tid + 1) * per).min(w.n));
        let mut row = vec![0f32; w.k];
        for j in lo..hi {
            dequantize_row(w.ty, &w.data[j * rb..(j + 1) * rb], &mut row);
            for i in 0..m {
                let xi = &x[i * w.k..(i + 1) * w.k];
                let s: f32 = xi.iter().zip(&row).map(|(a, b)| a * b).sum();
                // SAFETY: each (i, j) is written by exactly one thread (j is split by thread).
                unsafe { *yp.get().add(i * w.n + j) = s };
            }
        }
    });
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

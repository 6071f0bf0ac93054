//! Matrix products on the GPU: the matrix-vector kernels (f32 activations, or 8-bit ones) for up
//! to 8 activation rows a launch; past that, quantized weights either through the fused
//! tensor-core kernels (mmq.cu, up to 256 rows, when on) or dequantized to f16 for cuBLAS (f16
//! operands, f32 accumulation).

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::CudaFunction;

use super::{
    Arg, CudaError, DBuf, DevMatrix, GemmScratch, Gpu, MMQ_MAX_ROWS, MMV_MAX_ROWS, MMV_QUANT_ROWS,
    Result, check_type, wtype_id,
};
use crate::WType;

/// The matrix-vector kernels' launches over `m` activation rows: (first row, rows) of up to
/// [`MMV_MAX_ROWS`] each.
fn row_chunks(m: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..m)
        .step_by(MMV_MAX_ROWS)
        .map(move |done| (done, (m - done).min(MMV_MAX_ROWS)))
}

impl Gpu {
    /// `y[m][n] = x[m][k] . W[n][k]^T` (f32 in and out).
    pub fn matmul(
        &self,
        w: &DevMatrix,
        x: u64,
        m: usize,
        y: u64,
        scratch: &mut GemmScratch,
    ) -> Result<()> {
        check_type(w.ty)?;
        let dense = matches!(w.ty, WType::F16 | WType::BF16);
        let small = m <= MMV_MAX_ROWS || (!dense && m <= MMV_QUANT_ROWS) || w.ty == WType::F32;
        if small {
            return self.matvec(w, x, m, y, scratch);
        }
        if self.use_mmq && m <= MMQ_MAX_ROWS && self.k.mmq[wtype_id(w.ty) as usize].is_some() {
            return self.mmq(w, x, m, y);
        }
        if self.blas.is_none() {
            return self.matvec(w, x, m, y, scratch);
        }
        self.gemm_f16(w, x, m, y, scratch)
    }

    /// The fused tensor-core kernels (mmq.cu) over all `m` rows in one launch: tiles of 64
    /// weight rows by 32 or 64 activation rows.
    pub fn mmq(&self, w: &DevMatrix, x: u64, m: usize, y: u64) -> Result<()> {
        let fs = self.k.mmq[wtype_id(w.ty) as usize]
            .as_ref()
            .ok_or(CudaError::NoMatvec(w.ty))?;
        let (f, bm) = if m <= 32 { (&fs[0], 32) } else { (&fs[1], 64) };
        let a = [
            Arg::P(w.ptr),
            Arg::L(w.row_bytes() as i64),
            Arg::P(x),
            Arg::P(y),
            Arg::I(w.n as i32),
            Arg::I(w.k as i32),
            Arg::I(m as i32),
            Arg::I(w.n as i32),
        ];
        self.run(f, (w.n.div_ceil(64) as u32, m.div_ceil(bm) as u32), 128, &a)
    }

    /// The matrix-vector kernels over `m` rows, 8 rows per launch. K-quants first quantize the
    /// activations to 8 bits (into `scratch`) for the integer-dot kernels.
    pub fn matvec(
        &self,
        w: &DevMatrix,
        x: u64,
        m: usize,
        y: u64,
        scratch: &mut GemmScratch,
    ) -> Result<()> {
        let id = wtype_id(w.ty) as usize;
        if let Some(fs) = self.k.mmvq[id].as_ref()
            && self.takes_q8(id)
        {
            return self.matvec_q8(fs, w, x, m, y, scratch);
        }
        if self.use_wide && m == 1 && matches!(w.ty, WType::F16 | WType::BF16) {
            let f = &self.k.mmv_wide[usize::from(w.ty == WType::BF16)];
            let a = [
                Arg::P(w.ptr),
                Arg::L(w.row_bytes() as i64),
                Arg::P(x),
                Arg::P(y),
                Arg::I(w.n as i32),
                Arg::I(w.k as i32),
            ];
            return self.run(f, (w.n.div_ceil(4) as u32, 1), 128, &a);
        }
        let fs = self.k.mmv[id].as_ref().ok_or(CudaError::NoMatvec(w.ty))?;
        for (done, rows) in row_chunks(m) {
            let a = [
                Arg::P(w.ptr),
                Arg::L(w.row_bytes() as i64),
                Arg::P(x + (done * w.k * 4) as u64),
                Arg::P(y + (done * w.n * 4) as u64),
                Arg::I(w.n as i32),
                Arg::I(w.k as i32),
                Arg::I(rows as i32),
                Arg::I(w.n as i32),
            ];
            self.run(
                Self::by_rows(fs, rows),
                (w.n.div_ceil(4) as u32, 1),
                128,
                &a,
            )?;
        }
        Ok(())
    }

    /// Whether weights of type id `id` go through the 8-bit-activation kernels: when they are
    /// on, or when matvec.cu has no f32-activation kernel for the type.
    fn takes_q8(&self, id: usize) -> bool {
        self.use_mmvq || self.k.mmv[id].is_none()
    }

    /// The kernel of `fs` (for 1, 2, 4, 8 rows) that takes `rows` rows.
    fn by_rows(fs: &[CudaFunction; 4], rows: usize) -> &CudaFunction {
        match rows {
            1 => &fs[0],
            2 => &fs[1],
            3 | 4 => &fs[2],
            _ => &fs[3],
        }
    }

    /// `quantize_q8` of the `m x k` activations into `scratch`: the device addresses of the
    /// int8 values and of their f32 scales, one per 32.
    fn quantize_q8(
        &self,
        x: u64,
        m: usize,
        k: usize,
        scratch: &mut GemmScratch,
    ) -> Result<(u64, u64)> {
        let blocks = m * k / 32;
        let d_at = (m * k).next_multiple_of(256);
        let q = self.ensure(&mut scratch.x, d_at + blocks * 4)?;
        let d = q + d_at as u64;
        // Eight warps a block, one warp per 32 values.
        self.run(
            &self.k.quantize_q8,
            (blocks.div_ceil(8) as u32, 1),
            256,
            &[Arg::P(x), Arg::P(q), Arg::P(d), Arg::L(blocks as i64)],
        )?;
        Ok((q, d))
    }

    /// `quantize_q8` of the activations, then the integer-dot kernels, 8 rows per launch.
    fn matvec_q8(
        &self,
        fs: &[CudaFunction; 4],
        w: &DevMatrix,
        x: u64,
        m: usize,
        y: u64,
        scratch: &mut GemmScratch,
    ) -> Result<()> {
        let (n, k) = (w.n, w.k);
        let (q, d) = self.quantize_q8(x, m, k, scratch)?;
        for (done, rows) in row_chunks(m) {
            let a = [
                Arg::P(w.ptr),
                Arg::L(w.row_bytes() as i64),
                Arg::P(q + (done * k) as u64),
                Arg::P(d + (done * (k / 32) * 4) as u64),
                Arg::P(y + (done * n * 4) as u64),
                Arg::I(n as i32),
                Arg::I(k as i32),
                Arg::I(rows as i32),
                Arg::I(n as i32),
            ];
            self.run(Self::by_rows(fs, rows), (n.div_ceil(4) as u32, 1), 128, &a)?;
        }
        Ok(())
    }

    /// A SwiGLU FFN's gate-up product and gating: `out[r][c] = silu(x[r] . W[c]) *
    /// (x[r] . W[ffn + c])` for `W = [gate | up]` (`2 ffn` rows). Where [`Gpu::matvec`] would
    /// take the 8-bit-activation kernels, one fused kernel per 8 rows (`mmvq_swiglu`); else the
    /// product into `gu` (`m x 2 ffn` floats), then `swiglu`.
    pub fn gate_up_swiglu(
        &self,
        w: &DevMatrix,
        x: u64,
        m: usize,
        gu: u64,
        out: u64,
        scratch: &mut GemmScratch,
    ) -> Result<()> {
        let (id, ffn, k) = (wtype_id(w.ty) as usize, w.n / 2, w.k);
        let fused = m <= MMV_QUANT_ROWS
            && w.n.is_multiple_of(2)
            && self.takes_q8(id)
            && self.k.mmvq_swiglu[id].is_some();
        let Some(fs) = self.k.mmvq_swiglu[id].as_ref().filter(|_| fused) else {
            self.matmul(w, x, m, gu, scratch)?;
            return self.swiglu(gu, out, ffn, m);
        };
        check_type(w.ty)?;
        let (q, d) = self.quantize_q8(x, m, k, scratch)?;
        for (done, rows) in row_chunks(m) {
            let a = [
                Arg::P(w.ptr),
                Arg::L(w.row_bytes() as i64),
                Arg::P(q + (done * k) as u64),
                Arg::P(d + (done * (k / 32) * 4) as u64),
                Arg::P(out + (done * ffn * 4) as u64),
                Arg::I(ffn as i32),
                Arg::I(k as i32),
                Arg::I(rows as i32),
            ];
            self.run(
                Self::by_rows(fs, rows),
                (ffn.div_ceil(4) as u32, 1),
                128,
                &a,
            )?;
        }
        Ok(())
    }

    fn ensure(&self, slot: &mut Option<DBuf>, bytes: usize) -> Result<u64> {
        self.grow(slot, bytes, |_| bytes)
    }

    /// The device address of `slot`, first replaced by a buffer of `size(old length)` bytes
    /// (at least `need`) when it holds fewer than `need`. The old buffer is freed first, so a
    /// grown buffer may move: whatever captured its address must be re-captured.
    pub fn grow(
        &self,
        slot: &mut Option<DBuf>,
        need: usize,
        size: impl FnOnce(usize) -> usize,
    ) -> Result<u64> {
        let old = slot.as_ref().map_or(0, DBuf::len);
        if slot.is_none() || old < need {
            *slot = None;
            *slot = Some(self.alloc(size(old).max(need))?);
        }
        Ok(slot.as_ref().map_or(0, DBuf::ptr))
    }

    /// The tensor-core path: activations to f16, weights to f16 unless they are, cuBLAS GEMM
    /// with f32 accumulation and f32 output.
    pub fn gemm_f16(
        &self,
        w: &DevMatrix,
        x: u64,
        m: usize,
        y: u64,
        scratch: &mut GemmScratch,
    ) -> Result<()> {
        check_type(w.ty)?;
        let Some(blas) = &self.blas else {
            return self.matvec(w, x, m, y, scratch);
        };
        let (n, k) = (w.n, w.k);
        let xh = self.ensure(&mut scratch.x, m * k * 2)?;
        self.run(
            &self.k.f32_to_f16,
            (Self::grid_for(m * k), 1),
            256,
            &[Arg::P(x), Arg::P(xh), Arg::L((m * k) as i64)],
        )?;
        let wh = if w.ty == WType::F16 {
            w.ptr
        } else {
            let wh = self.ensure(&mut scratch.w, n * k * 2)?;
            let a = [
                Arg::P(w.ptr),
                Arg::I(wtype_id(w.ty)),
                Arg::I(k as i32),
                Arg::L(w.row_bytes() as i64),
                Arg::L((n * k / 32) as i64),
                Arg::P(wh),
            ];
            self.run(
                &self.k.dequant_f16,
                (Self::grid_for(n * k / 32), 1),
                256,
                &a,
            )?;
            wh
        };
        let (alpha, beta) = (1.0f32, 0.0f32);
        // Column-major: Y^T (n x m) = W (k x n)^T . X^T (k x m).
        // SAFETY: the pointers address buffers of the stated shapes.
        unsafe {
            cudarc::cublas::result::gemm_ex(
                *blas.handle(),
                cublasOperation_t::CUBLAS_OP_T,
                cublasOperation_t::CUBLAS_OP_N,
                n as i32,
                m as i32,
                k as i32,
                (&raw const alpha).cast(),
                wh as *const _,
                cudaDataType::CUDA_R_16F,
                k as i32,
                xh as *const _,
                cudaDataType::CUDA_R_16F,
                k as i32,
                (&raw const beta).cast(),
                y as *mut _,
                cudaDataType::CUDA_R_32F,
                n as i32,
                cublasComputeType_t::CUBLAS_COMPUTE_32F,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )?;
        }
        Ok(())
    }
}

//! The CUDA kernels (`kernels/cuda/*.cu`, compiled ahead to the PTX in `kernels/ptx/`, embedded
//! here) behind safe wrappers on cudarc. Nothing here links a CUDA library: libcuda and cuBLAS are
//! loaded at run time, and [`probe`] checks for the driver first, so a machine without one gets
//! an error to show instead of a panic.
//!
//! Buffers are [`DBuf`]s (device bytes); the operations take device addresses ([`DBuf::ptr`] plus
//! byte offsets), so callers can address layers and rows inside one allocation. Everything runs
//! on one stream in order; [`Gpu::sync`] waits for it. Modules: `matmul` (matrix products:
//! matrix-vector kernels, the fused tensor-core GEMM, cuBLAS, the fused SwiGLU gate-up) and
//! `attention` (per-token paged attention, flash prefill tiles and the split between them),
//! `rowops` (RoPE with its scalings and the KV store, QK-norm, scales, soft-capping, gating),
//! `support` (the one table of what the CUDA path runs: each weight type and model operation
//! missing, untried or tried, and the refusal worded from it).
//!
//! The sources, `kernels/cuda/`: `common.cuh` (type ids, reductions, the mma wrapper),
//! `blocks.cuh` (every quantized block layout, decoded once for all kernels), `matvec.cu`
//! (f32-activation matrix-vector kernels), `mmvq.cu` (8-bit-activation ones), `mmq.cu` (fused
//! tensor-core GEMM), `attention.cu` and `flash.cu` (attention), `elementwise.cu` (norms, RoPE,
//! embedding, gating, argmax and top-k, dequantization); `sim/` runs them on the CPU for
//! `kernels/tests/cuda_sim.rs`; `build-ptx.sh` regenerates the PTX. Kernels written without a
//! GPU stay opt-in until `tests/gpu/gpu-check.sh` has run them: [`Gpu::set_mmvq`],
//! [`Gpu::set_mmq`] and [`Gpu::set_wide`] here, which the engine's CUDA device sets from its
//! options (`CudaOpts`, read once from `TPSLAB_CUDA_*` at the edge); this crate reads no
//! environment.

use std::sync::Arc;

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{
    CudaContext, CudaFunction, CudaGraph, CudaModule, CudaSlice, CudaStream, DevicePtr,
    LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::Ptx;

use crate::WType;

mod attention;
mod matmul;
mod rowops;
mod support;

pub use attention::{AttnGeom, AttnIo, AttnSplit, FLASH_MAX_TILE, flash_split};
pub use rowops::RopeSpec;
pub use support::{Feature, Support, Unsupported};

const PTX_ELEMENTWISE: &str = include_str!("../ptx/elementwise.ptx");
const PTX_MATVEC: &str = include_str!("../ptx/matvec.ptx");
const PTX_ATTENTION: &str = include_str!("../ptx/attention.ptx");
const PTX_MMVQ: &str = include_str!("../ptx/mmvq.ptx");
const PTX_MMQ: &str = include_str!("../ptx/mmq.ptx");
const PTX_FLASH: &str = include_str!("../ptx/flash.ptx");

/// Largest activation batch the matrix-vector kernels take in one launch.
const MMV_MAX_ROWS: usize = 8;
/// Up to this many rows, quantized weights go through the matrix-vector kernels; past it, they
/// are dequantized to f16 for cuBLAS (measured on an H200: launches of 8 rows re-read the
/// activations per output row and fall far behind dequantize + GEMM at 16 rows and more).
const MMV_QUANT_ROWS: usize = 8;
/// Up to this many rows, quantized weights go through the fused tensor-core kernels (mmq.cu)
/// when they are on ([`Gpu::set_mmq`]); past it, dequantize + cuBLAS.
const MMQ_MAX_ROWS: usize = 256;
/// From this many tokens in a step, attention uses the wide kernel (measured on an H200: the
/// lanes-over-keys kernel won at 1-64 decodes, the wide one at 256 decodes and in prefill).
pub const WIDE_ATTN_TOKENS: usize = 128;
/// cuBLAS workspace (its recommendation for Hopper is 32 MiB).
const CUBLAS_WORKSPACE: usize = 32 << 20;

/// A captured sequence of launches, replayed with one call ([`Gpu::launch_graph`]).
pub struct Graph(CudaGraph);

// SAFETY: a graph is only launched on its `Gpu`'s stream, by whichever single thread owns the
// `Gpu` (the engine thread); CUDA graph handles may be used from any thread of the context.
unsafe impl Send for Graph {}

/// Why a CUDA call failed.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    #[error("cuBLAS: {0:?}")]
    Cublas(#[from] cudarc::cublas::result::CublasError),
    #[error("cuBLAS workspace: {0}")]
    CublasWorkspace(String),
    #[error("no CUDA driver found (libcuda is not installed)")]
    NoDriver,
    #[error("the CUDA driver reports no GPU")]
    NoGpu,
    #[error("there is no GPU cuda:{ordinal} ({found} found)")]
    NoSuchGpu { ordinal: usize, found: usize },
    /// A weight type or an operation the CUDA path does not take ([`support`]'s table).
    #[error(transparent)]
    Unsupported(#[from] Unsupported),
    #[error("{0} has no CUDA kernel yet (its 8-bit one is off)")]
    NoMatvec(WType),
    #[error("kernel {name} missing from the PTX: {source}")]
    MissingKernel {
        name: String,
        #[source]
        source: cudarc::driver::DriverError,
    },
    #[error("cannot allocate {bytes} bytes of GPU memory: {source}")]
    Alloc {
        bytes: usize,
        #[source]
        source: cudarc::driver::DriverError,
    },
    #[error("the graph capture recorded nothing")]
    EmptyCapture,
    #[error("no attention kernel for head size {0}")]
    HeadDim(usize),
    #[error("top-k of {k} out of {vocab}")]
    TopK { k: usize, vocab: usize },
}

type Result<T> = std::result::Result<T, CudaError>;

/// The type id the kernels use for a weight type (`WT_*` in `common.cuh`): its row in the
/// weight-type table, [`WType::ALL`]'s order.
pub fn wtype_id(ty: WType) -> i32 {
    i32::from(ty as u8)
}

/// `Ok` when the CUDA backend takes weights of type `ty` (tried in [`support`]'s table), else
/// the error to show.
pub fn check_type(ty: WType) -> Result<()> {
    Ok(Feature::Type(ty).check(false)?)
}

/// Whether matvec.cu has f32-activation kernels for `ty`.
fn has_f32_mmv(ty: WType) -> bool {
    matches!(
        ty,
        WType::F32
            | WType::F16
            | WType::BF16
            | WType::Q4_0
            | WType::Q4_1
            | WType::Q8_0
            | WType::Q4K
            | WType::Q6K
    )
}

/// Whether mmvq.cu has 8-bit-activation kernels for `ty` (every quantized type).
fn has_mmvq(ty: WType) -> bool {
    ty.block_size() > 1
}

/// The kernels' type suffix: ggml's name in lower case ("q4_k"), as the .cu files spell it.
fn mmv_name(ty: WType) -> String {
    ty.name().to_ascii_lowercase()
}

/// Whether a driver and at least one device are present: `Ok(device count)`, or why not.
pub fn probe() -> Result<usize> {
    // SAFETY: only tries to open the library; without this check cudarc panics on first use.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return Err(CudaError::NoDriver);
    }
    let n = CudaContext::device_count()?;
    if n <= 0 {
        return Err(CudaError::NoGpu);
    }
    Ok(n as usize)
}

/// Device memory. Freed when dropped.
pub struct DBuf {
    slice: CudaSlice<u8>,
    ptr: u64,
}

impl DBuf {
    /// Device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }
    pub fn len(&self) -> usize {
        self.slice.len()
    }
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

/// A weight matrix in device memory: `n` rows of `k` elements in the ggml layout of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct DevMatrix {
    pub ty: WType,
    pub n: usize,
    pub k: usize,
    pub ptr: u64,
}

impl DevMatrix {
    pub fn row_bytes(&self) -> usize {
        self.ty.row_bytes(self.k)
    }
}

/// Reusable f16 buffers of the tensor-core path, grown on demand.
#[derive(Default)]
pub struct GemmScratch {
    x: Option<DBuf>,
    w: Option<DBuf>,
}

impl GemmScratch {
    pub fn bytes(&self) -> usize {
        self.x.as_ref().map_or(0, DBuf::len) + self.w.as_ref().map_or(0, DBuf::len)
    }

    /// The buffers' addresses (a graph that captured them is stale once they move).
    pub fn ptrs(&self) -> (u64, u64) {
        (
            self.x.as_ref().map_or(0, DBuf::ptr),
            self.w.as_ref().map_or(0, DBuf::ptr),
        )
    }
}

enum Arg {
    P(u64),
    I(i32),
    L(i64),
    F(f32),
}

struct Kernels {
    embed_rows: CudaFunction,
    rms_norm: CudaFunction,
    add_rms_norm: CudaFunction,
    add_inplace: CudaFunction,
    add_bias: CudaFunction,
    swiglu: CudaFunction,
    rope_store: CudaFunction,
    qk_norm: CudaFunction,
    scale_inplace: CudaFunction,
    softcap_inplace: CudaFunction,
    gated_act: CudaFunction,
    gather_rows: CudaFunction,
    scatter_add_rows: CudaFunction,
    argmax_rows: CudaFunction,
    topk_rows: CudaFunction,
    f32_to_f16: CudaFunction,
    dequant_f16: CudaFunction,
    /// `[type id][0..4]` for 1, 2, 4, 8 rows: f32 activations (matvec.cu).
    mmv: Vec<Option<[CudaFunction; 4]>>,
    /// F16 and BF16 times one row with four loads in flight a lane (matvec.cu `mmv_*_wide`).
    mmv_wide: [CudaFunction; 2],
    /// The same for the K-quants over 8-bit activations (mmvq.cu), and that quantizer.
    mmvq: Vec<Option<[CudaFunction; 4]>>,
    /// The same with a SwiGLU FFN's gating fused into the gate-up product.
    mmvq_swiglu: Vec<Option<[CudaFunction; 4]>>,
    quantize_q8: CudaFunction,
    /// `[type id]`: the fused tensor-core kernels (mmq.cu) for tiles of 32 and 64 activation rows.
    mmq: Vec<Option<[CudaFunction; 2]>>,
    /// By head_dim / 32 (index 1..=8; 7 missing): lanes over keys, and the wide variant.
    attn: Vec<Option<CudaFunction>>,
    attn_wide: Vec<Option<CudaFunction>>,
    /// By head_dim / 32 (as `attn`): flash.cu's prefill tiles.
    flash: Vec<Option<CudaFunction>>,
}

/// One GPU: its context, stream, cuBLAS handle and loaded kernels.
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: Option<CudaBlas>,
    _workspace: Option<CudaSlice<u8>>,
    k: Kernels,
    name: String,
    ordinal: usize,
    /// K-quant matrix-vector products over 8-bit activations (mmvq.cu). Off unless set
    /// ([`Gpu::set_mmvq`]) until the kernels have passed tests/gpu/gpu-check.sh on a GPU
    /// (written in a session without one).
    use_mmvq: bool,
    /// Quantized weights times 9 to 256 rows by the fused kernels of mmq.cu (weights decoded to
    /// f16 in shared memory, tensor-core mma) instead of dequantize + cuBLAS. Off unless set
    /// ([`Gpu::set_mmq`]) until tests/gpu/gpu-check.sh has measured it against cuBLAS.
    use_mmq: bool,
    /// F16/BF16 batch-1 products by `mmv_*_wide` (four 16-byte streaming loads in flight a
    /// lane) instead of `mmv_*_1`. Off unless set ([`Gpu::set_wide`]) until the GPU check has
    /// measured it.
    use_wide: bool,
}

fn load(m: &Arc<CudaModule>, name: &str) -> Result<CudaFunction> {
    m.load_function(name)
        .map_err(|source| CudaError::MissingKernel {
            name: name.to_string(),
            source,
        })
}

impl Gpu {
    /// Opens device `ordinal` and loads the kernels (the driver compiles the PTX for the GPU).
    pub fn new(ordinal: usize) -> Result<Self> {
        let n = probe()?;
        if ordinal >= n {
            return Err(CudaError::NoSuchGpu { ordinal, found: n });
        }
        let ctx = CudaContext::new(ordinal)?;
        // One stream, in order: no per-buffer events needed.
        // SAFETY: every buffer is used on this one stream only.
        unsafe { ctx.disable_event_tracking() };
        // A stream of our own (the legacy default stream cannot be captured into a graph).
        let stream = ctx.new_stream()?;
        let (blas, workspace) = Self::open_blas(&stream)?;
        let ew = ctx.load_module(Ptx::from_src(PTX_ELEMENTWISE))?;
        let mv = ctx.load_module(Ptx::from_src(PTX_MATVEC))?;
        let at = ctx.load_module(Ptx::from_src(PTX_ATTENTION))?;
        let q8 = ctx.load_module(Ptx::from_src(PTX_MMVQ))?;
        let mq = ctx.load_module(Ptx::from_src(PTX_MMQ))?;
        let (mut mmv, mut mmvq, mut mmq) = (Vec::new(), Vec::new(), Vec::new());
        let mut mmvq_swiglu = Vec::new();
        let four = |m: &Arc<CudaModule>, prefix: &str, ty: WType| -> Result<[CudaFunction; 4]> {
            let f = |r: usize| load(m, &format!("{prefix}_{}_{r}", mmv_name(ty)));
            Ok([f(1)?, f(2)?, f(4)?, f(8)?])
        };
        for ty in WType::ALL {
            mmv.push(has_f32_mmv(ty).then(|| four(&mv, "mmv", ty)).transpose()?);
            mmvq.push(has_mmvq(ty).then(|| four(&q8, "mmvq", ty)).transpose()?);
            mmvq_swiglu.push(
                has_mmvq(ty)
                    .then(|| four(&q8, "mmvq_swiglu", ty))
                    .transpose()?,
            );
            let two = || -> Result<[CudaFunction; 2]> {
                let f = |bm: usize| load(&mq, &format!("mmq_{}_{bm}", mmv_name(ty)));
                Ok([f(32)?, f(64)?])
            };
            mmq.push(has_mmvq(ty).then(two).transpose()?);
        }
        let fl = ctx.load_module(Ptx::from_src(PTX_FLASH))?;
        let (mut attn, mut attn_wide, mut flash) = (vec![None], vec![None], vec![None]);
        for hdl in 1..=8 {
            let f = |m: &Arc<CudaModule>, name: &str| -> Result<Option<CudaFunction>> {
                Ok(if hdl == 7 {
                    None
                } else {
                    Some(load(m, &format!("{name}_{hdl}"))?)
                })
            };
            attn.push(f(&at, "paged_attention")?);
            attn_wide.push(f(&at, "paged_attention_wide")?);
            flash.push(f(&fl, "flash_prefill")?);
        }
        let k = Kernels {
            embed_rows: load(&ew, "embed_rows")?,
            rms_norm: load(&ew, "rms_norm")?,
            add_rms_norm: load(&ew, "add_rms_norm")?,
            add_inplace: load(&ew, "add_inplace")?,
            add_bias: load(&ew, "add_bias")?,
            swiglu: load(&ew, "swiglu")?,
            rope_store: load(&ew, "rope_store")?,
            qk_norm: load(&ew, "qk_norm")?,
            scale_inplace: load(&ew, "scale_inplace")?,
            softcap_inplace: load(&ew, "softcap_inplace")?,
            gated_act: load(&ew, "gated_act")?,
            gather_rows: load(&ew, "gather_rows")?,
            scatter_add_rows: load(&ew, "scatter_add_rows")?,
            argmax_rows: load(&ew, "argmax_rows")?,
            topk_rows: load(&ew, "topk_rows")?,
            f32_to_f16: load(&ew, "f32_to_f16")?,
            dequant_f16: load(&ew, "dequant_f16")?,
            mmv,
            mmv_wide: [load(&mv, "mmv_f16_wide")?, load(&mv, "mmv_bf16_wide")?],
            mmvq,
            mmvq_swiglu,
            quantize_q8: load(&q8, "quantize_q8")?,
            mmq,
            attn,
            attn_wide,
            flash,
        };
        let name = ctx.name()?;
        Ok(Self {
            ctx,
            stream,
            blas,
            _workspace: workspace,
            k,
            name,
            ordinal,
            use_mmvq: false,
            use_mmq: false,
            use_wide: false,
        })
    }

    /// Turns the wide-load F16/BF16 batch-1 kernels on or off (see `use_wide`).
    pub fn set_wide(&mut self, on: bool) {
        self.use_wide = on;
    }

    /// Turns the fused tensor-core kernels for 9 to 256 rows on or off (see `use_mmq`).
    pub fn set_mmq(&mut self, on: bool) {
        self.use_mmq = on;
    }

    /// Turns the 8-bit-activation K-quant kernels on or off (see `use_mmvq`).
    pub fn set_mmvq(&mut self, on: bool) {
        self.use_mmvq = on;
    }

    /// cuBLAS and its fixed workspace (so GEMMs captured into a graph allocate nothing), or
    /// `None` when the library is not installed: then batches of any size take the
    /// matrix-vector kernels (slower past 8 rows) and running needs only the driver.
    fn open_blas(stream: &Arc<CudaStream>) -> Result<(Option<CudaBlas>, Option<CudaSlice<u8>>)> {
        // SAFETY: only tries to open the library (cudarc panics on first use without it).
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Ok((None, None));
        }
        let blas = CudaBlas::new(stream.clone())?;
        let workspace = stream.alloc_zeros::<u8>(CUBLAS_WORKSPACE)?;
        {
            let (ws, _guard) = workspace.device_ptr(stream);
            // SAFETY: the workspace lives as long as the handle (both owned by `Gpu`).
            let st = unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ws as *mut _,
                    CUBLAS_WORKSPACE,
                )
            };
            if st != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(CudaError::CublasWorkspace(format!("{st:?}")));
            }
        }
        Ok((Some(blas), Some(workspace)))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether cuBLAS was found (the tensor-core path for batches past 8 rows).
    pub fn has_cublas(&self) -> bool {
        self.blas.is_some()
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// Makes this GPU's context current on the calling thread (needed once per thread).
    pub fn bind(&self) -> Result<()> {
        Ok(self.ctx.bind_to_thread()?)
    }

    /// (free, total) device memory in bytes, from the driver (cuMemGetInfo).
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        Ok(self.ctx.mem_get_info()?)
    }

    /// Waits for all work queued so far; reports an error a kernel raised.
    pub fn sync(&self) -> Result<()> {
        Ok(self.stream.synchronize()?)
    }

    fn wrap(&self, slice: CudaSlice<u8>) -> DBuf {
        let ptr = {
            let (ptr, _guard) = slice.device_ptr(&self.stream);
            ptr
        };
        DBuf { slice, ptr }
    }

    /// `bytes` of zeroed device memory.
    pub fn alloc(&self, bytes: usize) -> Result<DBuf> {
        let s = self
            .stream
            .alloc_zeros::<u8>(bytes.max(1))
            .map_err(|source| CudaError::Alloc { bytes, source })?;
        Ok(self.wrap(s))
    }

    /// A copy of `data` in device memory.
    pub fn upload<T: cudarc::driver::DeviceRepr>(&self, data: &[T]) -> Result<DBuf> {
        let bytes = std::mem::size_of_val(data);
        let buf = self.alloc(bytes)?;
        self.htod(buf.ptr(), data)?;
        Ok(buf)
    }

    /// Copies `src` to device address `dst` (queued on the stream).
    pub fn htod<T>(&self, dst: u64, src: &[T]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: callers pass an address inside one of their buffers with room for `src`.
        unsafe {
            cudarc::driver::result::memcpy_htod_async(dst, src, self.stream.cu_stream())?;
        }
        // Pageable host memory: the copy has been staged when the call returns, but make the
        // ordering explicit for the caller's next reuse of `src`.
        Ok(())
    }

    /// Copies device memory at `src` into `dst` and waits for it.
    pub fn dtoh<T>(&self, src: u64, dst: &mut [T]) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: `src` holds at least `dst.len()` elements (callers' contract).
        unsafe {
            cudarc::driver::result::memcpy_dtoh_async(dst, src, self.stream.cu_stream())?;
        }
        self.sync()
    }

    /// Starts recording this thread's launches on the stream into a graph instead of running
    /// them. Nothing may allocate, copy to the host or synchronize until [`Gpu::end_capture`].
    pub fn begin_capture(&self) -> Result<()> {
        Ok(self
            .stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?)
    }

    /// Ends a capture and instantiates the graph.
    pub fn end_capture(&self) -> Result<Graph> {
        match self.stream.end_capture(CUgraphInstantiate_flags(0))? {
            Some(g) => Ok(Graph(g)),
            None => Err(CudaError::EmptyCapture),
        }
    }

    /// Replays a captured graph on the stream.
    pub fn launch_graph(&self, g: &Graph) -> Result<()> {
        Ok(g.0.launch()?)
    }

    /// Sets `bytes` bytes at `dst` to `value` (e.g. 0xff to poison outputs in tests).
    pub fn memset(&self, dst: u64, value: u8, bytes: usize) -> Result<()> {
        // SAFETY: `dst..dst + bytes` lies in one of the caller's buffers.
        unsafe {
            cudarc::driver::result::memset_d8_async(dst, value, bytes, self.stream.cu_stream())?;
        }
        Ok(())
    }

    fn run(&self, f: &CudaFunction, grid: (u32, u32), block: u32, args: &[Arg]) -> Result<()> {
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::P(x) => b.arg(x),
                Arg::I(x) => b.arg(x),
                Arg::L(x) => b.arg(x),
                Arg::F(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: (grid.0.max(1), grid.1.max(1), 1),
            block_dim: (block, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: every kernel's arguments are pushed in its declared order and types; buffer
        // sizes are the callers' contract (checked by the engine before each step).
        unsafe { b.launch(cfg) }?;
        Ok(())
    }

    fn grid_for(n: usize) -> u32 {
        n.div_ceil(256).min(65_535 * 8) as u32
    }

    /// `out[i] = table[tokens[i]]` as f32 (`tokens`: `n` i32 on the device).
    pub fn embed(&self, table: &DevMatrix, tokens: u64, n: usize, out: u64) -> Result<()> {
        check_type(table.ty)?;
        let a = [
            Arg::P(table.ptr),
            Arg::I(wtype_id(table.ty)),
            Arg::I(table.k as i32),
            Arg::L(table.row_bytes() as i64),
            Arg::P(tokens),
            Arg::P(out),
        ];
        self.run(&self.k.embed_rows, (n as u32, 1), 256, &a)
    }

    /// `out[r] = rms_norm(x[rows[r]]) * w` for `n` rows (`rows`: i32 indices, or all in order).
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        x: u64,
        rows: Option<u64>,
        n: usize,
        w: u64,
        out: u64,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let a = [
            Arg::P(x),
            Arg::P(rows.unwrap_or(0)),
            Arg::P(w),
            Arg::P(out),
            Arg::I(dim as i32),
            Arg::F(eps),
        ];
        self.run(&self.k.rms_norm, (n as u32, 1), 256, &a)
    }

    /// `x += delta; out = rms_norm(x) * w`, for `n` rows of `dim`.
    #[allow(clippy::too_many_arguments)]
    pub fn add_rms_norm(
        &self,
        x: u64,
        delta: u64,
        w: u64,
        out: u64,
        n: usize,
        dim: usize,
        eps: f32,
    ) -> Result<()> {
        let a = [
            Arg::P(x),
            Arg::P(delta),
            Arg::P(w),
            Arg::P(out),
            Arg::I(dim as i32),
            Arg::F(eps),
        ];
        self.run(&self.k.add_rms_norm, (n as u32, 1), 256, &a)
    }

    /// `x += y` over `n` floats.
    pub fn add(&self, x: u64, y: u64, n: usize) -> Result<()> {
        let a = [Arg::P(x), Arg::P(y), Arg::L(n as i64)];
        self.run(&self.k.add_inplace, (Self::grid_for(n), 1), 256, &a)
    }

    /// Adds bias `b` (`n` floats) to each of `rows` rows of `y`.
    pub fn add_bias(&self, y: u64, b: u64, n: usize, rows: usize) -> Result<()> {
        let a = [
            Arg::P(y),
            Arg::P(b),
            Arg::I(n as i32),
            Arg::L((n * rows) as i64),
        ];
        self.run(&self.k.add_bias, (Self::grid_for(n * rows), 1), 256, &a)
    }

    /// `out[r] = silu(gate) * up` where each row of `gu` is `[gate | up]` of `ffn` each.
    pub fn swiglu(&self, gu: u64, out: u64, ffn: usize, rows: usize) -> Result<()> {
        let a = [
            Arg::P(gu),
            Arg::P(out),
            Arg::I(ffn as i32),
            Arg::L((ffn * rows) as i64),
        ];
        self.run(&self.k.swiglu, (Self::grid_for(ffn * rows), 1), 256, &a)
    }

    /// `out[r]` (u32) = index of the largest of `vocab` logits in row `r`, for `rows` rows.
    pub fn argmax(&self, logits: u64, rows: usize, vocab: usize, out: u64) -> Result<()> {
        let a = [Arg::P(logits), Arg::I(vocab as i32), Arg::P(out)];
        self.run(&self.k.argmax_rows, (rows as u32, 1), 1024, &a)
    }

    /// The `k` largest of `vocab` logits in each of `rows` rows, unordered: `k` u32 ids at `ids`
    /// and `k` f32 values at `vals` per row (ties at the k-th value: any of them).
    pub fn topk(
        &self,
        logits: u64,
        rows: usize,
        vocab: usize,
        k: usize,
        ids: u64,
        vals: u64,
    ) -> Result<()> {
        if k == 0 || k > vocab {
            return Err(CudaError::TopK { k, vocab });
        }
        let a = [
            Arg::P(logits),
            Arg::I(vocab as i32),
            Arg::I(k as i32),
            Arg::P(ids),
            Arg::P(vals),
        ];
        self.run(&self.k.topk_rows, (rows as u32, 1), 1024, &a)
    }
}

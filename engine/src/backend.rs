//! The seam between the engine loop and the hardware. The scheduler, block manager, samplers and
//! metrics are the same for every device; what differs is behind [`Backend`]: the model forward
//! and the KV pool it writes. [`CpuBackend`] runs the kernels crate's CPU code; the CUDA backend
//! (`cuda_model`) runs the same model on a GPU.

use std::str::FromStr;
use std::sync::Arc;

use tpslab_kernels::ThreadPool;

use crate::generate::LoadedModel;
use crate::kv::{Batch, KvCache};
use crate::model::{ModelError, Workspace};

/// Which device runs the model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceChoice {
    #[default]
    Cpu,
    /// GPU by CUDA ordinal.
    Cuda(usize),
    /// The first GPU if a CUDA driver and GPU are present, else the CPU.
    Auto,
}

impl FromStr for DeviceChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Self::Cpu),
            "auto" => Ok(Self::Auto),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| {
                    format!("unknown device '{s}' (expected cpu, cuda, cuda:N or auto)")
                }),
        }
    }
}

impl std::fmt::Display for DeviceChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Cpu => f.write_str("cpu"),
            Self::Cuda(n) => write!(f, "cuda:{n}"),
            Self::Auto => f.write_str("auto"),
        }
    }
}

/// What the sampler of one logits row needs from a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowNeed {
    /// The greedy token only.
    Argmax,
    /// The `k` largest logits (ids and values) suffice (top-k sampling without penalties).
    TopK(usize),
    /// The whole row.
    Full,
}

/// One step's output. When `argmax` is empty (a backend that computes logits on the host) every
/// logits row is in `logits`, packed in order. Otherwise, by each row's [`RowNeed`]: `Argmax`
/// rows have only `argmax[j]`; `TopK` rows have `topk_k` candidates each in `topk_ids` /
/// `topk_vals` (packed in order of those rows; at least their k, unordered); `Full` rows are
/// packed in `logits`.
pub struct StepOutput<'a> {
    pub logits: &'a [f32],
    pub argmax: &'a [u32],
    pub topk_k: usize,
    pub topk_ids: &'a [u32],
    pub topk_vals: &'a [f32],
}

/// Memory a backend holds, in bytes, parts apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryUse {
    pub weights: usize,
    pub kv: usize,
    pub activations: usize,
    /// Device memory (used, total) from the driver; `None` on the CPU.
    pub device_used: Option<u64>,
    pub device_total: Option<u64>,
}

/// A model forward plus its KV pool on one device.
pub trait Backend: Send {
    /// For labels: "CPU, 2 threads" or "CUDA cuda:0 NVIDIA H200".
    fn describe(&self) -> String;
    /// Runs the batch (writing its K/V), returning what each logits row's sampler needs
    /// (`needs[j]` for row `j`; see [`StepOutput`]).
    fn forward(&mut self, batch: &Batch, needs: &[RowNeed]) -> Result<StepOutput<'_>, ModelError>;
    /// Replaces the KV pool (everything in it is dropped).
    fn rebuild_kv(&mut self, block_size: usize, num_blocks: usize) -> Result<(), String>;
    fn num_blocks(&self) -> usize;
    fn block_size(&self) -> usize;
    fn memory(&self) -> MemoryUse;
    /// Compute threads (CPU) or 0.
    fn threads(&self) -> usize;
    /// Runs `lm`'s weights from now on (same architecture and shape; another precision). The
    /// KV pool is kept as it is; the caller recomputes what it held. On an error the old
    /// weights stay.
    fn set_model(&mut self, lm: &Arc<LoadedModel>) -> Result<(), String>;
}

/// The model on the CPU: the kernels crate's quantized matmuls and paged attention.
pub struct CpuBackend {
    lm: Arc<LoadedModel>,
    pool: ThreadPool,
    kv: KvCache,
    ws: Workspace,
}

impl CpuBackend {
    pub fn new(
        lm: Arc<LoadedModel>,
        threads: usize,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, String> {
        let kv = KvCache::new(&lm.model.cfg, block_size, num_blocks).map_err(|e| e.to_string())?;
        Ok(Self {
            lm,
            pool: ThreadPool::new(threads),
            kv,
            ws: Workspace::default(),
        })
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("CPU, {} threads", self.pool.n_threads())
    }

    fn forward(&mut self, batch: &Batch, _: &[RowNeed]) -> Result<StepOutput<'_>, ModelError> {
        let logits = self
            .lm
            .model
            .forward(&self.pool, batch, &mut self.kv, &mut self.ws)?;
        Ok(StepOutput {
            logits,
            argmax: &[],
            topk_k: 0,
            topk_ids: &[],
            topk_vals: &[],
        })
    }

    fn rebuild_kv(&mut self, block_size: usize, num_blocks: usize) -> Result<(), String> {
        self.kv =
            KvCache::new(&self.lm.model.cfg, block_size, num_blocks).map_err(|e| e.to_string())?;
        Ok(())
    }

    fn num_blocks(&self) -> usize {
        self.kv.num_blocks
    }

    fn block_size(&self) -> usize {
        self.kv.block_size
    }

    fn memory(&self) -> MemoryUse {
        MemoryUse {
            weights: self.lm.model.weights.bytes(),
            kv: self.kv.bytes(),
            activations: self.ws.bytes(),
            device_used: None,
            device_total: None,
        }
    }

    fn set_model(&mut self, lm: &Arc<LoadedModel>) -> Result<(), String> {
        if lm.model.cfg != self.lm.model.cfg {
            return Err("the new weights are of another model shape".into());
        }
        self.lm = Arc::clone(lm);
        Ok(())
    }

    fn threads(&self) -> usize {
        self.pool.n_threads()
    }
}

/// What [`open`] chose, and why when it fell back to the CPU.
pub struct Opened {
    pub backend: Box<dyn Backend>,
    /// Set when `Auto` found no usable GPU ("no CUDA driver found, using CPU").
    pub note: Option<String>,
}

/// Sizes the KV pool and opens the backend for `device`. `kv_budget` is in bytes; with
/// `gpu_kv_fraction > 0` on a GPU the budget is that fraction of the memory free after the
/// weights are loaded instead.
pub fn open(
    lm: Arc<LoadedModel>,
    device: DeviceChoice,
    threads: usize,
    block_size: usize,
    kv_budget: usize,
    gpu_kv_fraction: f32,
) -> Result<Opened, String> {
    let cfg = lm.model.cfg.clone();
    let blocks =
        |budget| KvCache::pool_for_budget(&cfg, block_size, budget).map_err(|e| e.to_string());
    let cpu = |lm: Arc<LoadedModel>| -> Result<Box<dyn Backend>, String> {
        Ok(Box::new(CpuBackend::new(
            lm,
            threads,
            block_size,
            blocks(kv_budget)?,
        )?))
    };
    let ordinal = match device {
        DeviceChoice::Cpu => {
            return Ok(Opened {
                backend: cpu(lm)?,
                note: None,
            });
        }
        DeviceChoice::Cuda(n) => n,
        DeviceChoice::Auto => 0,
    };
    match open_cuda(&lm, ordinal, block_size, kv_budget, gpu_kv_fraction) {
        Ok(b) => Ok(Opened {
            backend: b,
            note: None,
        }),
        Err(e) if device == DeviceChoice::Auto => Ok(Opened {
            backend: cpu(lm)?,
            note: Some(format!("{e}; using CPU")),
        }),
        Err(e) => Err(e),
    }
}

#[cfg(feature = "cuda")]
fn open_cuda(
    lm: &Arc<LoadedModel>,
    ordinal: usize,
    block_size: usize,
    kv_budget: usize,
    fraction: f32,
) -> Result<Box<dyn Backend>, String> {
    // cudarc resolves driver symbols lazily and panics on one an old driver lacks: turn that
    // into an error (and a CPU fallback under `auto`) instead of taking the app down.
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        crate::cuda_model::CudaBackend::new(lm, ordinal, block_size, kv_budget, fraction)
    }));
    match made {
        Ok(b) => Ok(Box::new(b?)),
        Err(p) => {
            let why = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(format!(
                "the CUDA driver could not be used ({why}); a driver for CUDA 13 is needed"
            ))
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(
    _: &Arc<LoadedModel>,
    _: usize,
    _: usize,
    _: usize,
    _: f32,
) -> Result<Box<dyn Backend>, String> {
    Err("this build has no CUDA support (built without the `cuda` feature)".into())
}

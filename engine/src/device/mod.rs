//! The devices a model runs on, and the seam between the engine loop and them. The scheduler,
//! block manager, samplers and metrics are the same for every device; what differs is behind
//! [`Backend`]: the model forward and the KV pool it writes. Each device implements the
//! backend-ops seam ([`crate::model::ops::Ops`]) and runs the architecture's recipe on it.
//!
//! Modules:
//! - [`cpu`]: the CPU device over `tpslab_kernels` and [`cpu::CpuBackend`].
//! - [`rowops`]: the CPU's per-row ops (RMSNorm, RoPE, SwiGLU, residual add).
//! - [`attention`]: paged attention on the CPU and its plain reference.
//! - [`moe`]: mixture-of-experts routing, load counting and experts run on the host, shared by
//!   the devices.
//! - `cuda` (feature `cuda`): the CUDA device over the PTX kernels and its backend.

use std::str::FromStr;
use std::sync::Arc;

use crate::kv::{Batch, KvError, KvSettings, KvTypes};
use crate::model::LoadedModel;
use crate::model::config::ModelConfig;

pub mod attention;
pub mod cpu;
#[cfg(feature = "cuda")]
pub mod cuda;
pub mod moe;
pub mod rowops;

pub use cpu::{CpuBackend, Workspace};

/// A batch a device refuses before touching memory with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BatchError {
    #[error("empty batch")]
    Empty,
    #[error("tokens, positions and sequence indices differ in length")]
    Lengths,
    #[error("token id {0} is outside the vocabulary")]
    Token(u32),
    #[error("position {0} is past the context length")]
    Position(usize),
    #[error("token {0}: block table does not cover its position")]
    BlockTable(usize),
    #[error("a logits row is outside the batch")]
    LogitsRow,
}

/// Why a device could not be opened or could not run a step.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("bad batch: {0}")]
    Batch(#[from] BatchError),
    #[error(transparent)]
    Kv(#[from] KvError),
    #[error("the KV budget holds no block")]
    EmptyPool,
    #[error("KV pool size overflows")]
    PoolOverflow,
    #[error("the new weights are of another model shape")]
    ShapeChanged,
    #[error("the CUDA attention kernel does not take head size {0}")]
    HeadDim(usize),
    /// The model needs an operation the CUDA path does not take (the kernels' support table).
    #[cfg(feature = "cuda")]
    #[error(transparent)]
    NoCudaOp(#[from] tpslab_kernels::cuda::Unsupported),
    /// Q/K/V (or gate/up) of different types (a Q4_K_M file's mix), which the CUDA path does
    /// not stack yet.
    #[error(
        "a matrix stacks parts of different types ({0:?}), which the CUDA path cannot run yet; use --device cpu"
    )]
    MixedTypes(Vec<tpslab_kernels::WType>),
    /// A CUDA call failed; `what` says what the engine was doing.
    #[cfg(feature = "cuda")]
    #[error("{what}: {source}")]
    Cuda {
        what: String,
        #[source]
        source: tpslab_kernels::cuda::CudaError,
    },
    #[error("warm-up step on {device}: {source}")]
    WarmUp {
        device: String,
        #[source]
        source: Box<BackendError>,
    },
    #[error("the CUDA driver could not be used ({0}); a driver for CUDA 13 is needed")]
    Driver(String),
    #[error("this build has no CUDA support (built without the `cuda` feature)")]
    NoCudaBuild,
    /// The error of a backend from outside this crate (the trait is public).
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

/// Checks a batch against the model and a KV pool of `num_blocks` blocks of `block_size` before
/// any device touches memory with it: token ids, positions, block tables, logits rows.
pub fn check_batch(
    cfg: &ModelConfig,
    batch: &Batch,
    num_blocks: usize,
    block_size: usize,
) -> Result<(), BatchError> {
    let n = batch.len();
    if batch.positions.len() != n || batch.seq_of.len() != n {
        return Err(BatchError::Lengths);
    }
    for i in 0..n {
        if batch.tokens[i] as usize >= cfg.vocab {
            return Err(BatchError::Token(batch.tokens[i]));
        }
        if batch.positions[i] >= cfg.context_len {
            return Err(BatchError::Position(batch.positions[i]));
        }
        let table = batch.block_tables.get(batch.seq_of[i]);
        let need = batch.positions[i] / block_size;
        match table {
            Some(t) if need < t.len() && t[..=need].iter().all(|&b| (b as usize) < num_blocks) => {}
            _ => return Err(BatchError::BlockTable(i)),
        }
    }
    if batch.logit_rows.iter().any(|&r| r >= n) {
        return Err(BatchError::LogitsRow);
    }
    Ok(())
}

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

/// A device name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown device '{0}' (expected cpu, cuda, cuda:N or auto)")]
pub struct UnknownDevice(pub String);

impl FromStr for DeviceChoice {
    type Err = UnknownDevice;
    fn from_str(s: &str) -> Result<Self, UnknownDevice> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "cpu" => Ok(Self::Cpu),
            "auto" => Ok(Self::Auto),
            "cuda" | "gpu" => Ok(Self::Cuda(0)),
            _ => s
                .strip_prefix("cuda:")
                .and_then(|n| n.parse().ok())
                .map(Self::Cuda)
                .ok_or_else(|| UnknownDevice(s.clone())),
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

/// Index of the largest value, lowest index on ties (as the CUDA argmax kernel breaks them); 0
/// when all are -inf/NaN or empty. What a row that needs only [`RowNeed::Argmax`] samples.
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best = i;
            best_v = v;
        }
    }
    u32::try_from(best).unwrap_or(0)
}

/// One step's output. When `argmax` is empty (a backend that computes logits on the host) every
/// logits row is in `logits`, packed in order. Otherwise, by each row's [`RowNeed`]: `Argmax`
/// rows have only `argmax[j]`; `TopK` rows have `topk_k` candidates each in `topk_ids` /
/// `topk_vals` (packed in order of those rows; at least their k, unordered); `Full` rows are
/// packed in `logits`.
pub struct StepOutput<'a> {
    pub logits: &'a [f32],
    /// The output-normed states of the batch's `hidden_rows` (embeddings), a model width of
    /// floats each, in that order; empty on a backend that does not embed ([`Backend::embeds`]).
    pub hidden: &'a [f32],
    pub argmax: &'a [u32],
    pub topk_k: usize,
    pub topk_ids: &'a [u32],
    pub topk_vals: &'a [f32],
}

/// Memory a backend holds, in bytes, parts apart.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct MemoryUse {
    /// Weights on the device (on the CPU: all of them).
    pub weights: usize,
    /// Weights a GPU leaves in host memory for the CPU to run (`--n-cpu-moe`'s experts); 0 on
    /// the CPU.
    pub host_weights: usize,
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
    fn forward(&mut self, batch: &Batch, needs: &[RowNeed])
    -> Result<StepOutput<'_>, BackendError>;
    /// Replaces the KV pool (everything in it is dropped), its K and V stored as `types`.
    fn rebuild_kv(
        &mut self,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<(), BackendError>;
    fn num_blocks(&self) -> usize;
    /// The element types the KV pool stores.
    fn kv_types(&self) -> KvTypes;
    fn block_size(&self) -> usize;
    fn memory(&self) -> MemoryUse;
    /// Compute threads (CPU) or 0.
    fn threads(&self) -> usize;
    /// Whether [`Backend::forward`] returns the states of `hidden_rows` (embeddings).
    fn embeds(&self) -> bool {
        false
    }
    /// What the last step read of a mixture of experts (`None` for a dense model, or a device
    /// that does not count it).
    fn expert_load(&self) -> Option<&ExpertLoad> {
        None
    }
    /// Runs `lm`'s weights from now on (same architecture and shape; another precision). The
    /// KV pool is kept as it is; the caller recomputes what it held. On an error the old
    /// weights stay.
    fn set_model(&mut self, lm: &Arc<LoadedModel>) -> Result<(), BackendError>;
}

/// What one step read of a mixture of experts: the expert bytes it read against the bytes of
/// every expert of every layer it ran (the CPU counts per chunk of tokens it groups), how many
/// tokens chose each expert, summed over the `layers` MoE layers it ran. Empty for a dense model.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ExpertLoad {
    pub bytes_read: usize,
    pub bytes_total: usize,
    pub tokens_per_expert: Vec<u32>,
    pub layers: u32,
}

impl ExpertLoad {
    /// The share of expert bytes the step read (`None` for a dense model).
    pub fn share(&self) -> Option<f64> {
        (self.bytes_total > 0).then(|| self.bytes_read as f64 / self.bytes_total as f64)
    }

    /// Tokens that chose each expert, averaged over the layers (a layer's expert `e` and the
    /// next layer's are different experts; the mean shows how evenly the router spreads).
    pub fn mean_tokens_per_expert(&self) -> impl Iterator<Item = f64> + '_ {
        let layers = f64::from(self.layers.max(1));
        self.tokens_per_expert
            .iter()
            .map(move |&n| f64::from(n) / layers)
    }

    /// Empty for the next step, keeping the allocation.
    pub fn clear(&mut self) {
        self.bytes_read = 0;
        self.bytes_total = 0;
        self.tokens_per_expert.iter_mut().for_each(|n| *n = 0);
        self.layers = 0;
    }
}

/// What [`open`] chose, and why when it fell back to the CPU.
pub struct Opened {
    pub backend: Box<dyn Backend>,
    /// Set when `Auto` found no usable GPU ("no CUDA driver found, using CPU").
    pub note: Option<String>,
}

/// Sizes the KV pool as `kv` says (its budget in bytes, its block size, K and V types) and opens
/// the backend for `device`. With `gpu_kv_fraction > 0` on a GPU the budget is that fraction of
/// the memory free after the weights are loaded instead. On a GPU the experts of the first `cpu_moe_layers` blocks stay
/// in host memory and run on `threads` CPU threads (`--n-cpu-moe`); on the CPU every weight is
/// in host memory already.
pub fn open(
    lm: Arc<LoadedModel>,
    device: DeviceChoice,
    threads: usize,
    kv: &KvSettings,
    gpu_kv_fraction: f32,
    cpu_moe_layers: usize,
) -> Result<Opened, BackendError> {
    let (block_size, kv_budget, kv_types) = (kv.block_size, kv.budget_bytes, kv.types);
    let cfg = lm.model.cfg.clone();
    let blocks = |budget| {
        kv_types
            .pool_for_budget(&cfg, block_size, budget)
            .map_err(BackendError::from)
    };
    let cpu = |lm: Arc<LoadedModel>| -> Result<Box<dyn Backend>, BackendError> {
        Ok(Box::new(CpuBackend::with_kv_types(
            lm,
            threads,
            block_size,
            blocks(kv_budget)?,
            kv_types,
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
        DeviceChoice::Auto => {
            // No GPU here at all: say that, not what the CUDA path could not run of this model
            // (its refusals are checked before a device is opened, so they come first).
            #[cfg(feature = "cuda")]
            if let Err(e) = tpslab_kernels::cuda::probe() {
                return Ok(Opened {
                    backend: cpu(lm)?,
                    note: Some(format!("{e}; using CPU")),
                });
            }
            0
        }
    };
    let gpu = GpuOpen {
        ordinal,
        block_size,
        kv_budget,
        kv_types,
        fraction: gpu_kv_fraction,
        cpu_moe_layers,
        threads,
    };
    match open_cuda(&lm, gpu) {
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

/// What [`open`] passes on to a GPU.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
struct GpuOpen {
    ordinal: usize,
    block_size: usize,
    kv_budget: usize,
    kv_types: KvTypes,
    fraction: f32,
    cpu_moe_layers: usize,
    threads: usize,
}

#[cfg(feature = "cuda")]
fn open_cuda(lm: &Arc<LoadedModel>, o: GpuOpen) -> Result<Box<dyn Backend>, BackendError> {
    let opts = cuda::CudaOpts {
        cpu_moe_layers: o.cpu_moe_layers,
        threads: o.threads,
        kv_types: o.kv_types,
        ..cuda::CudaOpts::from_env()
    };
    // cudarc resolves driver symbols lazily and panics on one an old driver lacks: turn that
    // into an error (and a CPU fallback under `auto`) instead of taking the app down.
    let made = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        cuda::CudaBackend::new_with(lm, o.ordinal, o.block_size, o.kv_budget, o.fraction, opts)
    }));
    match made {
        Ok(b) => Ok(Box::new(b?)),
        Err(p) => {
            let why = p
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(BackendError::Driver(why.to_string()))
        }
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_: &Arc<LoadedModel>, _: GpuOpen) -> Result<Box<dyn Backend>, BackendError> {
    Err(BackendError::NoCudaBuild)
}

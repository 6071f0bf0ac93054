//! What the CUDA path takes of a model: [`cuda_gap`], the first operation of its recipe that the
//! kernels' support table (`tpslab_kernels::cuda::Feature`) marks missing, or untried when
//! untried kernels are not asked for; [`refuse_kv_types`], the KV types it has no kernels for;
//! and [`CudaOpts`], how a model is placed and run on a GPU.

use tpslab_kernels::cuda::{Feature, Unsupported};

use crate::kv::KvTypes;

use crate::model::arch;
use crate::model::config::ModelConfig;
use crate::model::ops::{Activation, AttnOpts, Heads, Rope};
use crate::model::record::{Op, Recording};
use crate::model::weights::Weights;

/// The first operation of `cfg`'s recipe that the CUDA path does not take (found by running the
/// recipe on the recording device), so a model is refused before anything is uploaded. With
/// `untried`, operations whose kernels have only been checked on the CPU simulator
/// (kernels/tests/cuda_sim.rs) are taken too; without it they are refused until
/// tests/gpu/gpu-check.sh has run them (`every_family_but_gpt_oss_matches_cpu`).
pub fn cuda_gap(cfg: &ModelConfig, w: &Weights, untried: bool) -> Option<Unsupported> {
    let mut rec = Recording::new();
    match arch::forward(cfg, &w.shapes(), &mut rec) {
        Ok(()) => {}
        Err(never) => match never {},
    }
    let (_, ops) = rec.into_parts();
    ops.iter()
        .filter_map(op_feature)
        .find_map(|f| f.check(untried).err())
}

/// Refused unless K and V are f16: other KV types are the support table's
/// [`Feature::QuantizedKv`] row.
pub fn refuse_kv_types(types: KvTypes) -> Result<(), Unsupported> {
    if types.is_f16() {
        Ok(())
    } else {
        Feature::QuantizedKv.check(false)
    }
}

/// The row of the support table a recorded operation needs beyond the plain Llama block's
/// (matrix products, RMS norms, RoPE and attention as Llama has them), if any.
fn op_feature(op: &Op) -> Option<Feature> {
    match op {
        Op::Attention { sinks: Some(_), .. } => Some(Feature::AttentionSinks),
        Op::MoeFfn { .. } => Some(Feature::Experts),
        Op::Scale { .. } => Some(Feature::ConstScale),
        Op::Softcap { .. } => Some(Feature::LogitSoftcap),
        Op::QkNorm { .. } => Some(Feature::QkNorm),
        Op::RmsNorm { x, out, .. } if x == out => Some(Feature::InPlaceRmsNorm),
        Op::RopeStore { rope, factors, .. } => rope_feature(rope.as_ref(), factors.is_some()),
        Op::Attention { heads, opts, .. } => attn_feature(*heads, opts),
        Op::GatedFfn {
            act: Activation::GeluTanh,
            ..
        } => Some(Feature::GeluGate),
        Op::GatedFfn {
            act: Activation::SwigluOai,
            ..
        } => Some(Feature::SwigluOai),
        _ => None,
    }
}

fn rope_feature(rope: Option<&Rope>, factors: bool) -> Option<Feature> {
    match rope {
        None => Some(Feature::NoRope),
        Some(_) if factors => Some(Feature::RopeFactors),
        Some(r) if r.freq_scale != 1.0 || r.yarn.is_some() || r.mscale != 1.0 => {
            Some(Feature::RopeScaling)
        }
        Some(_) => None,
    }
}

fn attn_feature(heads: Heads, opts: &AttnOpts) -> Option<Feature> {
    if opts.window.is_some() {
        Some(Feature::SlidingWindow)
    } else if opts.softcap.is_some() {
        Some(Feature::AttentionSoftcap)
    } else if *opts != AttnOpts::plain(heads.head_dim) {
        Some(Feature::QueryScale)
    } else {
        None
    }
}

/// How a model is placed and run on a GPU, beyond its KV budget: the one place the CUDA
/// device's switches live. The command line's edge fills them from the environment once
/// ([`CudaOpts::from_env`]); nothing below it reads `TPSLAB_CUDA_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaOpts {
    /// Take operations whose kernels have only run on the CPU simulator (see [`cuda_gap`]).
    pub untried: bool,
    /// Turn on every kernel that is opt-in until measured ([`super::CudaBackend::set_trial_kernels`]).
    pub trial_kernels: bool,
    /// Keep the experts of the first this many blocks in host memory and run them on the CPU
    /// (llama.cpp's `--n-cpu-moe`): attention and the router stay on the GPU. 0 uploads every
    /// weight; a dense model has no experts to keep.
    pub cpu_moe_layers: usize,
    /// CPU threads for the experts kept in host memory (0: one per core).
    pub threads: usize,
    /// Replay decode steps as captured CUDA graphs (on; off to measure what they pay).
    pub graphs: bool,
    /// The opt-in kernels one by one (all of them: `trial_kernels`): 8-bit-activation
    /// matrix-vector products, the fused tensor-core GEMM for 9 to 256 rows, wide-load
    /// F16/BF16 batch-1 products, flash prefill, graphs of padded mixed steps.
    pub mmvq: bool,
    pub mmq: bool,
    pub wide: bool,
    pub flash: bool,
    pub mixed_graphs: bool,
    /// The KV cache's element types: only f16 has CUDA kernels (others are refused through
    /// [`Feature::QuantizedKv`]).
    pub kv_types: KvTypes,
}

impl Default for CudaOpts {
    fn default() -> Self {
        Self {
            untried: false,
            trial_kernels: false,
            cpu_moe_layers: 0,
            threads: 0,
            graphs: true,
            mmvq: false,
            mmq: false,
            wide: false,
            flash: false,
            mixed_graphs: false,
            kv_types: KvTypes::F16,
        }
    }
}

impl CudaOpts {
    /// The switches from the environment, read once: `TPSLAB_CUDA_TRIAL=1` takes the untried
    /// operations and turns on every trial kernel; `TPSLAB_CUDA_MMVQ`, `_MMQ`, `_WIDE`,
    /// `_FLASH`, `_MIXED_GRAPHS` `=1` turn on one; `TPSLAB_CUDA_GRAPHS=0` turns graphs off.
    pub fn from_env() -> Self {
        let on = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        let trial = on("TPSLAB_CUDA_TRIAL");
        Self {
            untried: trial,
            trial_kernels: trial,
            graphs: std::env::var("TPSLAB_CUDA_GRAPHS").map_or(true, |v| v != "0"),
            mmvq: on("TPSLAB_CUDA_MMVQ"),
            mmq: on("TPSLAB_CUDA_MMQ"),
            wide: on("TPSLAB_CUDA_WIDE"),
            flash: on("TPSLAB_CUDA_FLASH"),
            mixed_graphs: on("TPSLAB_CUDA_MIXED_GRAPHS"),
            ..Self::default()
        }
    }
}

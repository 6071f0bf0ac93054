//! `ModelArgs`: where a command's model comes from (a file, `default`, a library name, a Hugging
//! Face repo `owner/name[:QUANT]` or `-hf`, or `--synthetic`), the device and threads that run
//! it, and loading it; shared by the command line and `serve`. [`resolve`] is the one way a
//! command turns a model reference into a path ([`crate::hub::resolve_model`]).

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::quant::preset::weight_type;
use tpslab_kernels::WType;

/// Where the model comes from and how many threads run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file, a Hugging Face safetensors folder, `default` for the built-in default
    /// model (fetched on first use), a model's NAME in the library (`tpslab models`), or a
    /// Hugging Face repo `owner/name[:QUANT]` (also `hf.co/owner/name:QUANT`): found in the
    /// library or the Hugging Face cache (HF_HUB_CACHE, HF_HOME), else downloaded.
    #[arg(short = 'm', long, default_value = "default")]
    pub model: String,
    /// A Hugging Face repo `owner/name[:QUANT]` as llama.cpp's `-hf` takes it (also spelled
    /// `-hf`): the GGUF whose name holds QUANT (default Q4_K_M, else Q8_0, else the first),
    /// split parts together; from the library or the Hugging Face cache when there, else
    /// downloaded from $HF_ENDPOINT (default https://huggingface.co) into the library.
    #[arg(
        long = "hf-repo",
        value_name = "REPO[:QUANT]",
        conflicts_with = "model"
    )]
    pub hf_repo: Option<String>,
    /// Instead of a model file: a model of this architecture's exact shape with seeded random
    /// weights (smollm2-135m, llama-3.2-1b, qwen2.5-0.5b, llama-3-8b, qwen3-30b-a3b, gpt-oss-20b), for
    /// measuring speed where no model file can travel. Its output is noise.
    #[arg(long, value_name = "ARCH", conflicts_with_all = ["model", "hf_repo"])]
    pub synthetic: Option<String>,
    /// Weight precision of --synthetic: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k
    /// (default f16, as vLLM's dummy weights in half precision). K-quants fall back to q4_1 /
    /// q8_0 for rows that are not whole 256-element blocks, as llama.cpp's quantizer does.
    #[arg(long, value_name = "T", requires = "synthetic", value_parser = weight_type)]
    pub precision: Option<WType>,
    /// Seed of the --synthetic weights: the same seed builds the same bytes.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "synthetic")]
    pub synthetic_seed: u64,
    /// Compute device: cpu, cuda, cuda:N, or auto (the first GPU when a CUDA driver and GPU
    /// are present, else the CPU).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Compute threads (0 = one per core).
    #[arg(short = 't', long, default_value_t = 0)]
    pub threads: usize,
    /// On a GPU: keep the experts of the first N blocks of a mixture of experts in host memory
    /// and run them on the CPU, attention and routing staying on the GPU (llama.cpp's option of
    /// this name), for a model larger than the GPU's memory. No effect on the CPU or on a dense
    /// model.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub n_cpu_moe: usize,
    /// On a GPU: every block's experts in host memory (as `--n-cpu-moe` past the last block).
    #[arg(long, conflicts_with = "n_cpu_moe")]
    pub cpu_moe: bool,
}

/// The path of the model `spec` (or the `-hf` repo `hf_repo`) names, downloaded from the Hub
/// (`$HF_ENDPOINT`, `$HF_TOKEN`) only when neither the library nor the Hugging Face cache holds
/// it; progress on stderr.
pub fn resolve(spec: &str, hf_repo: Option<&str>) -> Result<std::path::PathBuf> {
    let cfg = crate::hub::HubConfig::resolve(None, None);
    crate::hub::resolve_model(spec, hf_repo, &cfg, &mut |m| eprintln!("{m}"))
}

/// Parses a `--device` value (`cpu`, `cuda`, `cuda:N`, `auto`).
pub fn parse_device(s: &str) -> Result<DeviceChoice, tpslab_engine::device::UnknownDevice> {
    s.parse()
}

impl ModelArgs {
    pub fn load(&self) -> Result<Arc<LoadedModel>> {
        if let Some(arch) = &self.synthetic {
            let ty = self.precision.unwrap_or(WType::F16);
            let start = std::time::Instant::now();
            let lm = LoadedModel::synthetic(arch, ty, self.synthetic_seed, self.n_threads())?;
            eprintln!(
                "built {} with random {} weights (seed {}): {:.0} MiB in {:.2} s",
                lm.path.display(),
                lm.precision,
                self.synthetic_seed,
                lm.model.weights.bytes() as f64 / (1 << 20) as f64,
                start.elapsed().as_secs_f64()
            );
            return Ok(Arc::new(lm));
        }
        let path = resolve(&self.model, self.hf_repo.as_deref())?;
        let lm = LoadedModel::load(&path)
            .with_context(|| format!("cannot load model {}", path.display()))?;
        Ok(Arc::new(lm))
    }

    /// What names the model: the `-hf` repo when given, else `--model`.
    pub fn name(&self) -> &str {
        self.hf_repo.as_deref().unwrap_or(&self.model)
    }

    /// The blocks whose experts a GPU leaves in host memory (`--n-cpu-moe`, `--cpu-moe`).
    pub fn cpu_moe_layers(&self) -> usize {
        if self.cpu_moe {
            usize::MAX
        } else {
            self.n_cpu_moe
        }
    }

    /// The thread count actually used (0 resolved to the number of cores).
    pub fn n_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
            n => n,
        }
    }
}

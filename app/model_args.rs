//! `ModelArgs`: where a command's model comes from (a file, `default`, or `--synthetic`), the
//! device and threads that run it, and loading it; shared by the command line and `serve`.

use std::sync::Arc;

use anyhow::{Context, Result};
use clap::Args;
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::library;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::quant::preset::weight_type;
use tpslab_kernels::WType;

/// Where the model comes from and how many threads run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file, a Hugging Face safetensors folder, or `default` for the built-in default
    /// model (fetched on first use).
    #[arg(short = 'm', long, default_value = "default")]
    pub model: String,
    /// Instead of a model file: a model of this architecture's exact shape with seeded random
    /// weights (smollm2-135m, llama-3.2-1b, qwen2.5-0.5b, llama-3-8b, qwen3-30b-a3b, gpt-oss-20b), for
    /// measuring speed where no model file can travel. Its output is noise.
    #[arg(long, value_name = "ARCH", conflicts_with = "model")]
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
        let path = library::resolve_model(&self.model, &mut |msg| eprintln!("{msg}"))?;
        let lm = LoadedModel::load(&path)
            .with_context(|| format!("cannot load model {}", path.display()))?;
        Ok(Arc::new(lm))
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

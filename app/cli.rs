//! Command line: argument parsing and the subcommands. Errors are handled once, here: one line
//! on stderr naming the problem and a non-zero exit status.

use std::io::Write;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::library;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::engine::Refusal;
use tpslab_engine::serving::generate::generate_on;
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::ChatMessage;
use tpslab_kernels::WType;

#[derive(Parser, Debug)]
#[command(
    name = "tpslab",
    version,
    about = "Run LLMs locally and see what batching does to tokens per second"
)]
pub struct Cli {
    /// With no subcommand, the window opens on this model (a GGUF file, or `default`).
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Compute threads for the window's engine (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Compute device for the window's engine: cpu, cuda, cuda:N, or auto (the first GPU when a
    /// CUDA driver and GPU are present, else the CPU). Without it, the device last chosen in the
    /// window, and auto the first time.
    #[arg(long, value_parser = parse_device)]
    pub device: Option<DeviceChoice>,
    /// The window's painter: auto (wgpu on a GPU, OpenGL when wgpu would draw on the CPU),
    /// wgpu, or glow (OpenGL).
    #[arg(long, value_enum, default_value = "auto")]
    pub renderer: crate::ui::renderer::RendererChoice,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text for one prompt, streaming it to stdout.
    Generate(GenerateArgs),
    /// Serving benchmark at several concurrency levels (or single-stream with --pp/--tg).
    Bench(crate::bench::BenchArgs),
    /// Re-quantize a GGUF model to another weight type (F16, Q8_0, Q4_K, ...).
    Quantize(crate::model_cmds::QuantizeArgs),
    /// Perplexity over a text (the bundled public-domain one by default), llama.cpp's way.
    Perplexity(crate::model_cmds::PerplexityArgs),
    /// Export a model to a Hugging Face safetensors folder (F32, F16 or BF16).
    Export(crate::model_cmds::ExportArgs),
    /// OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /metrics).
    Serve(crate::serve::ServeArgs),
    /// The model library: list (NAME, source, shape, size, sha256), `import PATH`, `rm NAME`,
    /// `search QUERY`.
    Models(crate::library_cmds::ModelsArgs),
    /// Download a model from the Hugging Face Hub into the library (resumable, sha256-checked).
    Pull(crate::library_cmds::PullArgs),
}

/// Where the model comes from and how many threads run it.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A GGUF file, a Hugging Face safetensors folder, or `default` for the built-in default
    /// model (fetched on first use).
    #[arg(long, default_value = "default")]
    pub model: String,
    /// Instead of a model file: a model of this architecture's exact shape with seeded random
    /// weights (smollm2-135m, llama-3.2-1b, qwen2.5-0.5b, llama-3-8b), for measuring speed where
    /// no model file can travel. Its output is noise.
    #[arg(long, value_name = "ARCH", conflicts_with = "model")]
    pub synthetic: Option<String>,
    /// Weight precision of --synthetic: f32, f16, bf16, q8_0, q4_0, q4_1, q4_k, q5_k, q6_k
    /// (default f16, as vLLM's dummy weights in half precision). K-quants fall back to q4_1 /
    /// q8_0 for rows that are not whole 256-element blocks, as llama.cpp's quantizer does.
    #[arg(long, value_name = "T", requires = "synthetic")]
    pub precision: Option<WType>,
    /// Seed of the --synthetic weights: the same seed builds the same bytes.
    #[arg(long, value_name = "N", default_value_t = 0, requires = "synthetic")]
    pub synthetic_seed: u64,
    /// Compute device: cpu, cuda, cuda:N, or auto (the first GPU when a CUDA driver and GPU
    /// are present, else the CPU).
    #[arg(long, default_value = "auto", value_parser = parse_device)]
    pub device: DeviceChoice,
    /// Compute threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

/// Parses a `--device` value (`cpu`, `cuda`, `cuda:N`, `auto`).
pub fn parse_device(s: &str) -> Result<DeviceChoice, String> {
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

    /// The thread count actually used (0 resolved to the number of cores).
    pub fn n_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
            n => n,
        }
    }
}

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt text.
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System message for --chat (otherwise the template's default applies).
    #[arg(long, requires = "chat")]
    pub system: Option<String>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_tokens: u32,
    /// 0 = greedy.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0)]
    pub top_k: u32,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    /// 0 = off.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub min_p: f32,
    /// 1 = off.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop generating at this string (repeatable); it is not included in the output.
    #[arg(long)]
    pub stop: Vec<String>,
    /// Don't stop at end-of-sequence tokens.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Print one JSON object (token ids, text, finish reason, timings) instead of streaming.
    #[arg(long)]
    pub json: bool,
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // clap formats usage errors and help itself; exit 2 for errors, 0 for --help.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Some(Command::Generate(args)) => run_generate(&args),
        Some(Command::Bench(args)) => crate::bench::run(&args),
        Some(Command::Quantize(args)) => crate::model_cmds::run_quantize(&args),
        Some(Command::Perplexity(args)) => crate::model_cmds::run_perplexity(&args),
        Some(Command::Export(args)) => crate::model_cmds::run_export(&args),
        Some(Command::Serve(args)) => crate::serve::run(&args),
        Some(Command::Models(args)) => crate::library_cmds::run_models(&args),
        Some(Command::Pull(args)) => crate::library_cmds::run_pull(&args),
        None => crate::ui::run(
            crate::ui::AppOptions {
                model: cli.model,
                threads: cli.threads,
                device: cli.device,
            },
            cli.renderer,
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run_generate(a: &GenerateArgs) -> Result<()> {
    let sampling = SamplingParams {
        temperature: a.temperature,
        top_k: a.top_k,
        top_p: a.top_p,
        min_p: a.min_p,
        repetition_penalty: a.repetition_penalty,
        frequency_penalty: a.frequency_penalty,
        presence_penalty: a.presence_penalty,
        seed: a.seed,
    };
    sampling.validate()?;
    if a.prompt.is_empty() {
        // Before the model loads; the engine's admission says it the same way for tokens.
        return Err(Refusal::EmptyPrompt.into());
    }
    let lm = a.model.load()?;
    if lm.is_synthetic() {
        eprintln!(
            "note: {} has random weights; the text is noise",
            lm.path.display()
        );
    }
    let prompt = if a.chat {
        let mut messages = Vec::new();
        if let Some(s) = &a.system {
            messages.push(ChatMessage::system(s.clone()));
        }
        messages.push(ChatMessage::user(a.prompt.clone()));
        lm.chat_prompt(&messages)?
    } else {
        lm.raw_prompt(&a.prompt)?
    };
    let mut stop = lm.default_stop(Some(a.max_tokens as usize));
    stop.stop_strings = a.stop.clone();
    stop.ignore_eos = a.ignore_eos;
    let stdout = std::io::stdout();
    let json = a.json;
    let mut on_text = |t: &str| {
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(t.as_bytes());
            let _ = out.flush();
        }
    };
    let out = generate_on(
        &lm,
        a.model.device,
        a.model.threads,
        &prompt,
        &sampling,
        stop,
        &mut on_text,
    )?;
    if json {
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {}; TTFT {:.1} ms, decode {:.1} tok/s; {} threads, {}]",
            out.prompt_token_ids.len(),
            out.output_token_ids.len(),
            out.finish_reason,
            out.ttft_ms,
            out.decode_tokens_per_s,
            a.model.n_threads(),
            lm.precision,
        );
    }
    Ok(())
}

//! Command line: the clap definitions and the dispatch to each subcommand. Errors are handled
//! once, here: one line on stderr naming the problem and a non-zero exit status.
//!
//! Modules:
//! - [`generate`]: `tpslab generate` (one prompt, streamed or as JSON).
//! - [`bench_args`]: `tpslab bench`'s arguments and the helpers both of its modes report with.
//! - [`bench`](mod@bench): `tpslab bench`'s dispatch and its single-stream mode (llama-bench style).
//! - [`serve_bench`]: the serving benchmark over the engine or a remote server (vLLM's figures
//!   per concurrency).
//! - [`model_cmds`]: `tpslab quantize`, `tpslab perplexity` and `tpslab export`.
//! - [`library_cmds`]: `tpslab models` (list, import, rm, search) and `tpslab pull`.
//! - [`plan`]: `tpslab plan`, the capacity planner (predicted TPS, TTFT, concurrency and cost
//!   per device).
//! - [`fleet`]: `tpslab fleet`, the fleet simulator (a workload replayed against autoscaled
//!   replicas of planned configurations; latency per window, shedding, cost, the cheapest that
//!   meets the SLO).
//! - [`plan_calibrate`]: `tpslab plan --calibrate`, this machine measured and its CPU row refitted.
//! - [`tune`]: `tpslab tune`, the SLO tuner (measured runs of the engine's knobs, successive
//!   halving, the winner and the defaults verified).

pub mod bench;
pub mod bench_args;
pub mod fleet;
pub mod generate;
pub mod library_cmds;
pub mod model_cmds;
pub mod plan;
pub mod plan_calibrate;
pub mod serve_bench;
pub mod tune;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use tpslab_engine::device::DeviceChoice;

use crate::model_args::parse_device;

#[derive(Parser, Debug)]
#[command(
    name = "tpslab",
    version,
    about = "Run LLMs locally and see what batching does to tokens per second"
)]
pub struct Cli {
    /// With no subcommand, the window opens on this model (a GGUF file, `default`, a library
    /// NAME, or a Hugging Face repo `owner/name[:QUANT]`).
    #[arg(short = 'm', long, default_value = "default")]
    pub model: String,
    /// Compute threads for the window's engine (0 = one per core).
    #[arg(short = 't', long, default_value_t = 0)]
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
    /// The window's planner tab uses this device table instead of the bundled one (for example
    /// one `tpslab plan --calibrate --save-devices FILE` wrote for this machine).
    #[arg(long, value_name = "FILE")]
    pub devices: Option<std::path::PathBuf>,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text for one prompt, streaming it to stdout.
    Generate(generate::GenerateArgs),
    /// Serving benchmark at several concurrency levels (or single-stream with --pp/--tg).
    Bench(bench_args::BenchArgs),
    /// Re-quantize a GGUF model to a preset (Q8_0, Q6_K, Q5_K_M, Q4_K_M, IQ4_XS, Q3_K_M, Q2_K, ...).
    Quantize(model_cmds::QuantizeArgs),
    /// Perplexity over a text (the bundled public-domain one by default), llama.cpp's way.
    Perplexity(model_cmds::PerplexityArgs),
    /// Export a model to a Hugging Face safetensors folder (F32, F16 or BF16).
    Export(model_cmds::ExportArgs),
    /// OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, /v1/models, /metrics).
    Serve(crate::serve::ServeArgs),
    /// The model library: list (NAME, source, shape, size, sha256), `import PATH`, `rm NAME`,
    /// `search QUERY`.
    Models(library_cmds::ModelsArgs),
    /// Download a model from the Hugging Face Hub into the library (resumable, sha256-checked).
    Pull(library_cmds::PullArgs),
    /// Capacity planner: predicted per-request and aggregate TPS, TTFT, the concurrency that
    /// fits and $ per 1M tokens on a table of devices (a calibrated roofline of this engine).
    Plan(plan::PlanArgs),
    /// Fleet simulator: a workload (preset, burst, daily curve or recorded trace) replayed
    /// against autoscaled replicas of planned configurations: P50/P99 latency over time,
    /// requests shed, replicas, GPU-hours, $ per 1M tokens, the cheapest that meets the SLO.
    Fleet(fleet::FleetArgs),
    /// SLO tuner: searches the engine's knobs with short measured runs (successive halving)
    /// for the most goodput under objectives on TTFT, ITL, TPOT, E2E latency and TPS.
    Tune(tune::TuneArgs),
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse_from(std::env::args_os().map(llama_spelling)) {
        Ok(cli) => cli,
        Err(e) => {
            // clap formats usage errors and help itself; exit 2 for errors, 0 for --help.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 2 } else { 0 });
        }
    };
    let result = match cli.command {
        Some(Command::Generate(args)) => generate::run(&args),
        Some(Command::Bench(args)) => bench::run(&args),
        Some(Command::Quantize(args)) => model_cmds::run_quantize(&args),
        Some(Command::Perplexity(args)) => model_cmds::run_perplexity(&args),
        Some(Command::Export(args)) => model_cmds::run_export(&args),
        Some(Command::Serve(args)) => crate::serve::run(&args),
        Some(Command::Models(args)) => library_cmds::run_models(&args),
        Some(Command::Pull(args)) => library_cmds::run_pull(&args),
        Some(Command::Plan(args)) => plan::run(&args),
        Some(Command::Fleet(args)) => fleet::run(&args),
        Some(Command::Tune(args)) => tune::run(&args),
        None => crate::ui::window::run(
            crate::ui::AppOptions {
                model: cli.model,
                threads: cli.threads,
                device: cli.device,
            },
            cli.renderer,
            cli.devices,
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

/// llama.cpp's one-dash long flag `-hf REPO` (and `-hf=REPO`) as `--hf-repo` (clap would read
/// `-hf` as `-h -f`).
/// llama.cpp's single-dash spellings as this command line's long options: clap reads a single
/// dash as a run of one-letter flags. `-hf owner/name`, `-ctk q8_0`, `-ctv=q4_0`.
const LLAMA_SPELLINGS: [(&str, &str); 3] = [
    ("-hf", "--hf-repo"),
    ("-ctk", "--cache-type-k"),
    ("-ctv", "--cache-type-v"),
];

fn llama_spelling(arg: std::ffi::OsString) -> std::ffi::OsString {
    let Some(s) = arg.to_str() else { return arg };
    for (short, long) in LLAMA_SPELLINGS {
        if let Some(rest) = s.strip_prefix(short)
            && (rest.is_empty() || rest.starts_with('='))
        {
            return format!("{long}{rest}").into();
        }
    }
    arg
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::Cli;

    /// clap's own checks over every subcommand: no two flags share a name or a short letter
    /// (`-m`, `-t`, `-c`, `-n`, `-p` are llama.cpp's spellings on commands that also flatten
    /// shared argument structs).
    #[test]
    fn no_two_flags_clash_in_any_command() {
        Cli::command().debug_assert();
    }
}

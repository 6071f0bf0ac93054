//! `tpslab quantize` (re-quantize a GGUF model or a safetensors folder to another weight type,
//! with the predicted size first and a progress bar), `tpslab perplexity` (llama.cpp-style, over
//! the bundled text; `--kl-base` adds the KL divergence from the base model) and `tpslab export` (a model to a Hugging Face safetensors folder).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::quant::preset::Preset;
use tpslab_engine::quant::quantize::{QuantizeOptions, plan, quantize_file};
use tpslab_engine::serving::kl::{Estimate, kl_divergence};
use tpslab_engine::serving::perplexity::{BUNDLED_TEXT, BUNDLED_TEXT_NAME, perplexity_kv};
use tpslab_kernels::WType;

use crate::kv_args::KvTypeArgs;

const MIB: f64 = (1 << 20) as f64;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The source model: a GGUF file, a Hugging Face safetensors folder, or `default`.
    pub input: String,
    /// Where to write the quantized GGUF (written as OUT.tmp, renamed when complete).
    pub output: PathBuf,
    /// Target preset, as llama-quantize names them: q8_0, q6_k, q5_k_m, q5_k_s, q4_k_m,
    /// q4_k_s, iq4_xs, q3_k_m, q2_k, q5_1, q5_0, q4_1, q4_0, iq4_nl, f16, bf16, f32 (q4_k,
    /// q5_k and q3_k are their _m mix), with llama.cpp's per-tensor rules.
    #[arg(long = "type", value_name = "T")]
    pub ty: Preset,
    /// Threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run_quantize(a: &QuantizeArgs) -> Result<()> {
    let target = a.ty;
    let note = target.note();
    let input = crate::model_args::resolve(&a.input, None)?;
    let f = GgufFile::open(&input)?;
    let p = plan(&f, target)?;
    eprintln!(
        "quantizing {} ({:.1} MiB) to {}: {note}",
        input.display(),
        p.input_bytes as f64 / MIB,
        p.summary()
    );
    eprintln!(
        "predicted size: {:.1} MiB ({:+.0}%) -> {}",
        p.output_bytes as f64 / MIB,
        (p.output_bytes as f64 / p.input_bytes as f64 - 1.0) * 100.0,
        a.output.display()
    );
    let bar = ProgressBar::new(p.output_bytes);
    bar.set_style(
        ProgressStyle::with_template(
            "{bar:40} {bytes}/{total_bytes} {bytes_per_sec} eta {eta} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let opts = QuantizeOptions {
        threads: a.threads,
        cancel: None,
    };
    let report = quantize_file(&f, &p, &a.output, opts, &mut |pr| {
        bar.set_position(pr.bytes_done);
        bar.set_message(pr.name.to_string());
    })
    .with_context(|| {
        format!(
            "quantizing to {target} failed; {} was not written",
            a.output.display()
        )
    });
    bar.finish_and_clear();
    let report = report?;
    println!(
        "wrote {} ({:.1} MiB, {} tensors re-quantized) in {:.1} s",
        a.output.display(),
        report.output_bytes as f64 / MIB,
        report.converted,
        report.seconds
    );
    Ok(())
}

#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// The model: a GGUF file, a Hugging Face safetensors folder, `default`, a library NAME, or
    /// a Hugging Face repo `owner/name[:QUANT]` (as `--model` takes them).
    #[arg(required_unless_present = "hf_repo")]
    pub model: Option<String>,
    /// A Hugging Face repo `owner/name[:QUANT]`, as llama.cpp's `-hf` (also spelled `-hf`).
    #[arg(
        long = "hf-repo",
        value_name = "REPO[:QUANT]",
        conflicts_with = "model"
    )]
    pub hf_repo: Option<String>,
    /// Window length in tokens; the second half of each window is scored (llama.cpp's way).
    #[arg(long, default_value_t = 512)]
    pub ctx: usize,
    /// A text file to score instead of the bundled public-domain text.
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    /// Also the KL divergence of MODEL's next-token distributions from BASE's (the model it was
    /// quantized from; same vocabulary), llama.cpp's `--kl-divergence`: mean and P99 KL, top-1
    /// agreement, perplexity against the base's.
    #[arg(long, value_name = "BASE")]
    pub kl_base: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub kv: KvTypeArgs,
}

pub fn run_perplexity(a: &PerplexityArgs) -> Result<()> {
    let (text, source) = match &a.text {
        Some(p) => (
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))?,
            p.display().to_string(),
        ),
        None => (BUNDLED_TEXT.to_string(), BUNDLED_TEXT_NAME.to_string()),
    };
    let spec = a.model.as_deref().unwrap_or_default();
    let path = crate::model_args::resolve(spec, a.hf_repo.as_deref())?;
    let lm = LoadedModel::load(&path)
        .with_context(|| format!("cannot load model {}", path.display()))?;
    if let Some(base) = &a.kl_base {
        return run_kl(a, &lm, base, &text, &source);
    }
    let size = model_bytes(&path);
    let kv = a.kv.types();
    eprintln!(
        "perplexity of {} ({}, {:.1} MiB) on {source}, windows of {} tokens, {kv} KV cache",
        path.display(),
        lm.precision,
        size as f64 / MIB,
        a.ctx
    );
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} window {pos}/{len} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    // Ctrl-C ends the process: no cancel flag.
    let r = perplexity_kv(
        &lm,
        &text,
        a.ctx,
        a.threads,
        kv,
        None,
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    );
    bar.finish_and_clear();
    let r = r?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "perplexity {:.4} over {} tokens scored ({} windows of {}, {} tokens of text) in {:.1} s",
            r.perplexity, r.tokens_scored, r.windows, r.ctx, r.text_tokens, r.seconds
        );
    }
    Ok(())
}

/// `tpslab perplexity MODEL --kl-base BASE`: both models over the same windows, MODEL's KV cache
/// stored as `--cache-type-k/-v` (BASE's f16: `--kl-base` of the same model measures the cache).
fn run_kl(
    a: &PerplexityArgs,
    lm: &LoadedModel,
    base: &str,
    text: &str,
    source: &str,
) -> Result<()> {
    let base_path = crate::model_args::resolve(base, None)?;
    let base = LoadedModel::load(&base_path)
        .with_context(|| format!("cannot load base model {}", base_path.display()))?;
    eprintln!(
        "KL divergence of {} ({}) from {} ({}) on {source}, windows of {} tokens",
        lm.path.display(),
        lm.precision,
        base.path.display(),
        base.precision,
        a.ctx
    );
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("{bar:40} window {pos}/{len} eta {eta}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let r = kl_divergence(
        lm,
        &base,
        text,
        a.ctx,
        a.threads,
        a.kv.types(),
        None,
        &mut |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        },
    );
    bar.finish_and_clear();
    let r = r?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
        return Ok(());
    }
    let pm = |e: Estimate| format!("{:.6} ± {:.6}", e.value, e.unc);
    let pct = |e: Estimate| format!("{:.3} ± {:.3} %", 100.0 * e.value, 100.0 * e.unc);
    println!(
        "{} tokens scored ({} windows of {}, {} tokens of text) in {:.1} s",
        r.tokens_scored, r.windows, r.ctx, r.text_tokens, r.seconds
    );
    println!("Mean PPL(Q)                   : {}", pm(r.ppl));
    println!("Mean PPL(base)                : {}", pm(r.ppl_base));
    println!(
        "Cor(ln(PPL(Q)), ln(PPL(base))): {:.2}%",
        100.0 * r.ppl_correlation
    );
    println!("Mean ln(PPL(Q)/PPL(base))     : {}", pm(r.ln_ppl_ratio));
    println!("Mean PPL(Q)/PPL(base)         : {}", pm(r.ppl_ratio));
    println!("Mean PPL(Q)-PPL(base)         : {}", pm(r.ppl_diff));
    let k = &r.kld_spread;
    println!("Mean    KLD: {}", pm(r.kld));
    println!("Maximum KLD: {:.6}", k.max);
    println!("99.0%   KLD: {:.6}", k.p99);
    println!("95.0%   KLD: {:.6}", k.p95);
    println!("Median  KLD: {:.6}", k.median);
    println!("Minimum KLD: {:.6}", k.min);
    println!("Mean    Δp: {}", pct(r.dp));
    println!("RMS Δp    : {}", pct(r.dp_rms));
    println!("Same top p: {}", pct(r.same_top));
    Ok(())
}

/// Bytes of a model on disk: the GGUF file, or every file of a folder.
fn model_bytes(path: &std::path::Path) -> u64 {
    match std::fs::read_dir(path) {
        Ok(entries) => entries
            .filter_map(|e| e.ok()?.metadata().ok())
            .filter(|m| m.is_file())
            .map(|m| m.len())
            .sum(),
        Err(_) => std::fs::metadata(path).map_or(0, |m| m.len()),
    }
}

#[derive(Args, Debug)]
pub struct ExportArgs {
    /// The model: a GGUF file, a safetensors folder, or `default`.
    pub model: String,
    /// The folder to write (created; it must not exist or be empty).
    pub output: PathBuf,
    /// Weight type of every tensor: f32, f16 or bf16.
    #[arg(long, default_value = "f16")]
    pub dtype: WType,
    /// Threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run_export(a: &ExportArgs) -> Result<()> {
    let dtype = a.dtype;
    let input = crate::model_args::resolve(&a.model, None)?;
    let f = GgufFile::open(&input)?;
    let threads = match a.threads {
        0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
        n => n,
    };
    let bar = ProgressBar::new(f.tensors.len() as u64);
    let report = tpslab_engine::quant::hf_export::export_folder(
        &f,
        &a.output,
        dtype,
        threads,
        &mut |d, _| bar.set_position(d as u64),
    )
    .with_context(|| format!("exporting {} to {}", input.display(), a.output.display()));
    bar.finish_and_clear();
    let report = report?;
    println!(
        "wrote {} ({} tensors, {:.1} MiB of {dtype} weights)",
        a.output.display(),
        report.tensors,
        report.weights_bytes as f64 / MIB,
    );
    Ok(())
}

//! `tpslab quantize`: re-quantize a GGUF model to another weight type, with the predicted size
//! first and a progress bar.

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use tpslab_engine::gguf::GgufFile;
use tpslab_engine::library;
use tpslab_engine::quantize::{QuantizeOptions, TARGETS, plan, quantize_file};
use tpslab_engine::synthetic::{self, precision_name};

const MIB: f64 = (1 << 20) as f64;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The source model: a GGUF file, or `default`.
    pub input: String,
    /// Where to write the quantized GGUF (written as OUT.tmp, renamed when complete).
    pub output: PathBuf,
    /// Target type: f32, f16, bf16, q8_0, q6_k, q4_k (q4_k_m, q4_k_s), q4_1 or q4_0.
    #[arg(long = "type", value_name = "T")]
    pub ty: String,
    /// Threads (0 = one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
}

pub fn run_quantize(a: &QuantizeArgs) -> Result<()> {
    let target = synthetic::parse_precision(&a.ty)?;
    let note = TARGETS
        .iter()
        .find(|(t, _)| *t == target)
        .map_or("", |(_, n)| n);
    let input = library::resolve_model(&a.input, &mut |m| eprintln!("{m}"))?;
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
            "quantizing to {} failed; {} was not written",
            precision_name(target),
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

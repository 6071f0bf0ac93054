//! `tpslab plan`: the capacity planner on the command line. For a model (a GGUF file or a
//! `--synthetic` shape), precisions, devices and a workload, one row per (device, precision,
//! concurrency) with per-request and aggregate TPS, TTFT, the concurrency that fits and the cost
//! per million output tokens; each device's prediction source is printed with its error against
//! measured runs. `--tp`, `--pp` and `--ep` split the model over GPUs of one device kind (the
//! rows then say the split and the GPU count, and cost all of them); the published multi-GPU
//! runs of other engines on the chosen devices are printed beside their predictions.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::model::config::ModelConfig;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::plan::calibrate::{INEXACT, INEXACT_WHY};
use tpslab_engine::plan::{
    DeviceTable, ModelShape, Parallel, PlanGrid, Prediction, PublishedCheck, Source, check,
    check_published, plan_grid, source,
};
use tpslab_engine::quant::preset::weight_type;
use tpslab_kernels::WType;

#[derive(Args, Debug)]
pub struct PlanArgs {
    /// A GGUF file or `default` (its header is read; no weights are loaded).
    #[arg(long, conflicts_with = "synthetic")]
    pub model: Option<String>,
    /// Instead of a file: a known architecture's shape (smollm2-135m, llama-3.2-1b,
    /// qwen2.5-0.5b, llama-3-8b, llama-3.1-70b, qwen2.5-72b, qwen3-235b-a22b, ...).
    #[arg(long, value_name = "ARCH")]
    pub synthetic: Option<String>,
    /// Weight precisions to plan for (comma separated; default: the file's own, or f16).
    #[arg(long, value_delimiter = ',', value_parser = weight_type)]
    pub precision: Vec<WType>,
    /// Devices of the table (comma separated ids; default: all of them).
    #[arg(long, value_delimiter = ',')]
    pub device: Vec<String>,
    /// Concurrent requests (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,16,64,256")]
    pub concurrency: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Prompt tokens per step (the scheduler's token budget).
    #[arg(long, default_value_t = 8192)]
    pub token_budget: usize,
    /// Tensor-parallel sizes to plan (comma separated): weights and K/V heads split over that
    /// many GPUs, two all-reduces per layer over the device's link.
    #[arg(long, value_delimiter = ',', default_value = "1")]
    pub tp: Vec<usize>,
    /// Pipeline stages: the layers split over this many groups of `--tp` GPUs.
    #[arg(long, default_value_t = 1)]
    pub pp: usize,
    /// Expert parallelism for a mixture of experts: 1 (each expert split by TP) or equal to
    /// `--tp` (the experts spread whole over the TP group's GPUs, all-to-alls instead of the
    /// FFN's all-reduce).
    #[arg(long, default_value_t = 1)]
    pub ep: usize,
    /// Whose calibration predicts (default: each device's backend, this engine's): e.g. `vllm`
    /// or `sglang`, fitted on their published runs.
    #[arg(long)]
    pub engine: Option<String>,
    /// A device table to use instead of the bundled `assets/devices.json`.
    #[arg(long, value_name = "FILE")]
    pub devices: Option<PathBuf>,
    /// Also write the rows, the sources and their errors as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// First measure this machine: the default model through the engine at concurrency 1, 4
    /// and 16 (prompt 128, output 128; about half a minute), then refit this-cpu's bandwidth
    /// and FLOP/s to the run at one request. The other runs are held out: the error printed
    /// beside this-cpu is how far its predictions fall from them.
    #[arg(long)]
    pub calibrate: bool,
    /// Compute threads of the calibration run (0 = one per core).
    #[arg(long, default_value_t = 0, requires = "calibrate")]
    pub threads: usize,
    /// Write the device table, with this-cpu as calibrated, to this file (for `--devices`).
    #[arg(long, value_name = "FILE", requires = "calibrate")]
    pub save_devices: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Report<'a> {
    model: &'a ModelShape,
    prompt_len: usize,
    output_len: usize,
    token_budget: usize,
    rows: &'a [Prediction],
    sources: &'a [Source],
    /// Published runs of other engines on the chosen devices, beside their predictions.
    published: &'a [PublishedCheck],
}

/// The shape and default precision of `--model` or `--synthetic` (also `tpslab fleet`'s).
pub(crate) fn shape_of(
    model: Option<&str>,
    synthetic: Option<&str>,
) -> Result<(ModelShape, WType)> {
    if let Some(arch) = synthetic {
        return Ok((ModelShape::synthetic(arch)?, WType::F16));
    }
    let spec = model.unwrap_or("default");
    let path = crate::model_args::resolve(spec, None)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot read {}", path.display()))?;
    let cfg = ModelConfig::from_gguf(&file).with_context(|| format!("{}", path.display()))?;
    let tied = file.tensor("output.weight").is_none();
    let ty = Precision::of_file(&file).map_or(WType::F16, |p| p.main);
    let name = path
        .file_name()
        .map_or_else(|| spec.to_string(), |n| n.to_string_lossy().into_owned());
    Ok((ModelShape::from_config(&name, &cfg, tied), ty))
}

/// Replaces this-cpu in `table` with its calibration on this machine, says what changed, and
/// writes the table to `--save-devices`.
fn calibrate(table: &mut DeviceTable, a: &PlanArgs) -> Result<()> {
    let new = super::plan_calibrate::calibrate_here(table, a.threads)?;
    let old = table.replace_device(new)?;
    let new = table.device(&old.id)?;
    println!(
        "calibrated {}: bandwidth {:.1} GB/s (table: {:.1}); {}",
        new.id,
        new.bandwidth_gb_s.value,
        old.bandwidth_gb_s.value,
        (new.tflops.iter())
            .map(|(p, f)| format!(
                "{p} {:.3} TFLOP/s (table: {:.3})",
                f.value,
                old.tflops.get(p).map_or(f64::NAN, |o| o.value)
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
    // How closely the fitted run is reproduced (not exactly where its decode was compute-bound;
    // the source says so then).
    let fitted = check(table, new)?.and_then(|e| e.rows.into_iter().find(|r| r.row.fitted));
    if let Some(r) = fitted {
        println!(
            "the fitted run reproduced within {:+.2}% per-request TPS and {:+.2}% TTFT{}",
            r.per_request_err * 100.0,
            r.ttft_err * 100.0,
            if r.per_request_err.abs() > INEXACT || r.ttft_err.abs() > INEXACT {
                format!(": {INEXACT_WHY}")
            } else {
                String::new()
            }
        );
    }
    if let Some(path) = &a.save_devices {
        let text = serde_json::to_string_pretty(&*table)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
        println!("device table with this machine's row: {}", path.display());
    }
    Ok(())
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"))
}

/// The rows as a table.
fn print_rows(rows: &[Prediction]) {
    println!(
        "{:<10} {:<8} {:>4} {:<9} {:>11} {:>15} {:>13} {:>10} {:>15} {:>9} {:>8}",
        "device",
        "parallel",
        "gpus",
        "precision",
        "concurrency",
        "per_request_tps",
        "aggregate_tps",
        "ttft_ms",
        "max_concurrency",
        "$/M tok",
        "weights/GPU"
    );
    for r in rows {
        println!(
            "{:<10} {:<8} {:>4} {:<9} {:>11} {:>15} {:>13} {:>10} {:>15} {:>9} {:>5.1} GiB{}",
            r.device,
            r.parallel.label(),
            r.gpus,
            r.precision,
            r.concurrency,
            opt(r.per_request_tps, 1),
            opt(r.aggregate_tps, 0),
            opt(r.ttft_ms, 0),
            r.max_concurrency,
            opt(r.usd_per_million_tokens, 3),
            r.weights_gib,
            if r.kv_limited {
                "  (KV-limited: the rest wait)"
            } else {
                ""
            }
        );
    }
}

pub fn run(a: &PlanArgs) -> Result<()> {
    let mut table = match &a.devices {
        Some(p) => DeviceTable::load(p)?,
        None => DeviceTable::bundled()?,
    };
    if a.calibrate {
        calibrate(&mut table, a)?;
    }
    let (shape, own) = shape_of(a.model.as_deref(), a.synthetic.as_deref())?;
    let precisions = if a.precision.is_empty() {
        vec![own]
    } else {
        a.precision.clone()
    };
    let devices: Vec<&str> = if a.device.is_empty() {
        table.ids()
    } else {
        a.device.iter().map(String::as_str).collect()
    };
    if a.concurrency.is_empty() {
        bail!("--concurrency needs at least one level");
    }
    let splits = (a.tp.iter())
        .map(|&tp| Parallel {
            tp,
            pp: a.pp,
            ep: a.ep,
        })
        .collect::<Vec<_>>();
    for par in &splits {
        // A split the model's shape forbids is refused before any device is tried.
        par.check(&shape)?;
    }
    let srcs = (devices.iter())
        .map(|id| source(&table, table.device(id)?))
        .collect::<Result<Vec<_>, _>>()?;
    let mut published = Vec::new();
    for id in &devices {
        published.extend(check_published(&table, table.device(id)?)?);
    }
    let devices: Vec<String> = devices.iter().map(|d| d.to_string()).collect();
    let grid = PlanGrid {
        devices: &devices,
        splits: &splits,
        precisions: &precisions,
        concurrency: &a.concurrency,
        prompt_len: a.prompt_len,
        output_len: a.output_len,
        token_budget: a.token_budget,
        engine: a.engine.as_deref(),
    };
    let (rows, notes) = plan_grid(&table, &shape, &grid)?;
    if rows.is_empty() {
        bail!("nothing to plan: {}", notes.join("; "));
    }
    println!(
        "plan: {} ({} layers, hidden {}), prompt {} -> output {} tok, token budget {}",
        shape.name, shape.n_layers, shape.hidden, a.prompt_len, a.output_len, a.token_budget
    );
    println!(
        "prediction sources (error = |predicted - measured| / measured over aggregate TPS, per-request TPS and TTFT):"
    );
    for s in &srcs {
        println!("  {}", s.text);
    }
    if let Some(engine) = &a.engine {
        let cal = (table.calibrations.get(engine))
            .with_context(|| format!("--engine {engine}: no such calibration in the table"))?;
        println!(
            "  the rows below use the {engine} calibration instead of each device's: {}",
            cal.source
        );
    }
    if !published.is_empty() {
        println!(
            "published runs of other engines (error = (predicted - published) / published output tok/s):"
        );
        for p in &published {
            println!("  {}", p.text());
        }
    }
    print_rows(&rows);
    for n in &notes {
        println!("{n}");
    }
    if let Some(path) = &a.json {
        let report = Report {
            model: &shape,
            prompt_len: a.prompt_len,
            output_len: a.output_len,
            token_budget: a.token_budget,
            rows: &rows,
            sources: &srcs,
            published: &published,
        };
        let text = serde_json::to_string_pretty(&report)?;
        std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
}

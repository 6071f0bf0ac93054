//! `tpslab tune`: the SLO tuner on the command line. The engine starts once; each candidate's
//! knobs are applied to it live and measured with the load generator (successive halving), and
//! the winner and the default knobs get fresh verification runs in the same session. Prints
//! goodput against settings and the Pareto frontier; `--json` writes the whole report.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use anyhow::{Result, bail};
use clap::Args;
use serde::Serialize;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::quant::preset::weight_type;
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs, KvSettings};
use tpslab_engine::tune::run::last_runs;
use tpslab_engine::tune::workload::{MAX_TRACE_LEN, preset};
use tpslab_engine::tune::{
    CandidateRun, Knob, Space, Trace, TuneConfig, TuneEvent, TuneReport, TuneSlo, Workload, tune,
    tune_client,
};
use tpslab_kernels::WType;

use crate::kv_args::KvArgs;
use crate::model_args::ModelArgs;

#[derive(Args, Debug)]
pub struct TuneArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Objectives: ttft_p99_ms, itl_p99_ms, tpot_p99_ms, e2e_p99_ms (milliseconds) and min_tps
    /// (per-request tokens/s), as KEY=VALUE,... e.g. ttft_p99_ms=2000,itl_p99_ms=200.
    #[arg(long, value_parser = TuneSlo::parse)]
    pub slo: TuneSlo,
    #[arg(long, default_value_t = 128, conflicts_with_all = ["workload", "trace"])]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 128, conflicts_with_all = ["workload", "trace"])]
    pub output_len: usize,
    /// A named workload shape instead of fixed lengths: prompt and output lengths drawn from
    /// its ranges (chat, summarize, code-completion, long-context).
    #[arg(long, value_name = "PRESET", conflicts_with = "trace")]
    pub workload: Option<String>,
    /// A recorded trace of a server's requests (`tpslab serve --record-trace FILE` writes one):
    /// prompt and output lengths drawn from those it holds, arriving at its mean rate unless
    /// --rate or --concurrency says otherwise.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Poisson arrivals at this many requests per second.
    #[arg(long, required_unless_present_any = ["concurrency", "trace"])]
    pub rate: Option<f64>,
    /// Closed loop at this many requests in flight (with --rate: the most in flight).
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Seconds of measured runs in all: 70% for the search, 15% for each verification. Each run
    /// submits requests for its share, then waits for them at most as long as a request that
    /// meets the objectives can take (+1 s; as long again as it submitted when the objectives
    /// bound no request's length); what still runs then is cut and counts as missing them.
    #[arg(long, default_value_t = 60.0)]
    pub budget_s: f64,
    /// The shortest run of the first rung (fewer candidates start when the budget is small).
    #[arg(long, default_value_t = 1.0)]
    pub min_run_s: f64,
    /// The most candidates the search starts with.
    #[arg(long, default_value_t = 32)]
    pub max_candidates: usize,
    /// Weight precisions to try besides the loaded one (comma separated, e.g. Q8_0,Q4_K);
    /// each change re-quantizes the weights in memory, which takes seconds.
    #[arg(long, value_delimiter = ',', value_parser = weight_type)]
    pub precisions: Vec<WType>,
    /// Seed of the sample of the space.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Write the report (best knobs, verified and default runs, every candidate's rungs) here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Tune against a remote OpenAI-compatible server (http(s)://host:port) instead of the
    /// in-process engine: only what a client controls is searched (requests in flight, and the
    /// arrival rate under --rate).
    /// `--model` then names the served model (default: the first one the server lists);
    /// prompts are token ids cut from the bundled text by the default model's tokenizer.
    #[arg(long, value_name = "URL", conflicts_with = "precisions")]
    pub endpoint: Option<String>,
    /// Bearer token for --endpoint (also read from TPSLAB_API_KEY).
    #[arg(long, value_name = "K", env = "TPSLAB_API_KEY", requires = "endpoint")]
    pub api_key: Option<String>,
}

#[derive(Serialize)]
struct Report<'a, K> {
    date: String,
    model: String,
    device: String,
    #[serde(flatten)]
    tune: &'a TuneReport<K>,
}

fn f1(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.1}"))
}

fn row<K: Knob>(r: &CandidateRun<K>) -> String {
    let m = &r.measured;
    match &r.error {
        Some(e) => format!(
            "| {} | {} | {:.1} | failed: {e} |",
            r.candidate, r.rung, r.seconds
        ),
        None => format!(
            "| {} | {} | {:.1} | {} | {}/{} | {:.2} | {:.0}% | {:.0} | {:.0} | {} | {} |",
            r.candidate,
            r.rung,
            r.seconds,
            r.knobs.label(),
            m.good,
            m.requests,
            m.goodput,
            m.slo_attainment * 100.0,
            m.ttft_p99_ms,
            m.itl_p99_ms,
            f1(m.per_request_tps_mean),
            if m.meets_slo { "yes" } else { "no" },
        ),
    }
}

const HEADER: &str = "| # | rung | run s | knobs | good/done | goodput req/s | attainment | TTFT p99 ms | ITL p99 ms | per-request TPS | meets SLO |\n|---|---|---|---|---|---|---|---|---|---|---|";

/// Prints each event as it comes: the plan, a table row per measured rung, verifications.
fn print_event<K: Knob>(ev: TuneEvent<K>) {
    match ev {
        TuneEvent::Started { candidates, runs } => {
            println!("successive halving: {candidates} candidates, {runs} measured runs");
            println!("{HEADER}");
        }
        TuneEvent::Measured(r) => println!("{}", row(&r)),
        TuneEvent::Verifying(what) => eprintln!("verifying the {what} knobs with a fresh run"),
    }
}

fn write_json<K: Serialize>(
    a: &TuneArgs,
    model: String,
    device: String,
    r: &TuneReport<K>,
) -> Result<()> {
    if let Some(path) = &a.json {
        let out = Report {
            date: super::bench_args::utc_now(),
            model,
            device,
            tune: r,
        };
        std::fs::write(path, serde_json::to_string_pretty(&out)?)?;
    }
    Ok(())
}

/// `--endpoint`: the client's concurrency (and under `--rate`, its rate) against a remote
/// server.
fn run_remote(a: &TuneArgs, url: &str, cfg: &TuneConfig) -> Result<()> {
    let path = tpslab_engine::library::resolve_model("default", &mut |m| eprintln!("{m}"))?;
    let prompts = super::serve_bench::prompt_set(&LoadedModel::load(&path)?)?;
    let model = (a.model.model != "default").then_some(a.model.model.as_str());
    let target = crate::remote::RemoteTarget::connect(url, a.api_key.clone(), model)
        .map_err(|e| anyhow::anyhow!(e))?;
    let device = format!("remote {} ({})", target.url(), target.model());
    println!(
        "endpoint: {device}; {} (ids), greedy; tuning the client's concurrency{}; budget {:.0} s",
        cfg.workload.label(),
        if cfg.workload.rate.is_some() {
            " and rate"
        } else {
            ""
        },
        a.budget_s
    );
    let stop = AtomicBool::new(false);
    let report = tune_client(&target, &prompts, cfg, &stop, &mut |ev| print_event(ev))?;
    print_summary(&report);
    write_json(a, target.model().to_string(), device, &report)
}

/// The workload the arguments describe: fixed lengths, a preset's, or a trace's (its rate
/// unless one is given).
fn workload(a: &TuneArgs) -> Result<Workload> {
    let mut w = Workload::fixed(a.prompt_len, a.output_len, a.concurrency, a.rate);
    if let Some(name) = &a.workload {
        (w.prompt_len, w.output_len) = preset(name).map_err(anyhow::Error::msg)?;
    }
    if let Some(path) = &a.trace {
        let t = Trace::read(path, MAX_TRACE_LEN).map_err(anyhow::Error::msg)?;
        println!("trace {}: {}", path.display(), t.summary());
        t.apply(&mut w, a.concurrency.is_none() && a.rate.is_none());
    }
    Ok(w)
}

pub fn run(a: &TuneArgs) -> Result<()> {
    let workload = workload(a)?;
    workload.check().map_err(anyhow::Error::msg)?;
    if !(a.budget_s.is_finite() && a.budget_s > 0.0) {
        bail!("--budget-s must be a positive number of seconds");
    }
    if !(a.min_run_s.is_finite() && a.min_run_s > 0.0) {
        bail!("--min-run-s must be a positive number of seconds");
    }
    let mut space = Space::default_for(a.concurrency.unwrap_or(64));
    space
        .precision
        .extend(a.precisions.iter().map(|t| Some(t.name().to_string())));
    let cfg = TuneConfig {
        slo: a.slo,
        workload,
        budget_s: a.budget_s,
        min_run_s: a.min_run_s,
        max_candidates: a.max_candidates,
        space,
        seed: a.seed,
    };
    if let Some(url) = &a.endpoint {
        return run_remote(a, url, &cfg);
    }
    let lm = a.model.load()?;
    let w = &cfg.workload;
    super::serve_bench::check_fits(&lm, w.prompt_len.max(), w.output_len.max())?;
    let prompts = super::serve_bench::prompt_set(&lm)?;
    let base = Knobs {
        kv: a.kv.settings(KvSettings::default().budget_bytes >> 20),
        ..Knobs::default()
    };
    let engine = EngineHandle::start(
        lm.clone(),
        EngineConfig {
            threads: a.model.threads,
            knobs: base.clone(),
            device: a.model.device,
            gpu_kv_fraction: a.kv.gpu_fraction(),
            ..EngineConfig::default()
        },
        None,
    )?;
    let device = engine.stats().device;
    println!(
        "model: {} ({}), {device}; {}; budget {:.0} s",
        lm.path.display(),
        lm.precision,
        cfg.workload.label(),
        a.budget_s
    );
    let stop = AtomicBool::new(false);
    let report = tune(&engine, &prompts, &base, &cfg, &stop, &mut |ev| {
        print_event(ev)
    })?;
    print_summary(&report);
    write_json(a, lm.path.display().to_string(), device, &report)
}

fn print_summary<K: Knob>(r: &TuneReport<K>) {
    println!("\nPareto frontier (goodput vs mean per-request TPS, each at its last rung):");
    let last = last_runs(r.candidates.len(), &r.runs);
    for &i in &r.frontier {
        if let Some(run) = last[i] {
            println!(
                "  #{i}: goodput {:.2} req/s, per-request TPS {} — {}",
                run.measured.goodput,
                f1(run.measured.per_request_tps_mean),
                run.knobs.label()
            );
        }
    }
    println!("\nbest knobs: {}", r.best.label());
    println!("best (fresh run): {}", r.verified.describe());
    println!(
        "default (fresh run; {}): {}",
        r.default.knobs.label(),
        r.default.measured.describe()
    );
    println!("took {:.1} s", r.elapsed_s);
}

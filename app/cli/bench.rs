//! `tpslab bench`: the dispatch to its two modes, and the single-stream mode in llama-bench's
//! shape (prompt processing of N tokens, pp N, and decoding of N tokens after a one-token prompt,
//! tg N; median of several repetitions), each decode figure beside the weight bytes it streams a
//! second and their share of the read bandwidth measured in the same run. The serving mode is
//! in `serve_bench`.

use anyhow::{Result, bail};
use serde::Serialize;
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::model::synthetic;
use tpslab_engine::sched::stop::StopCriteria;
use tpslab_engine::serving::generate::{GenerateSetup, generate_with};
use tpslab_engine::serving::sampler::SamplingParams;

use super::bench_args::{BenchArgs, utc_now};

const PROMPT_TEXT: &str = include_str!("../../assets/prompts/bench.txt");

#[derive(Debug, Serialize)]
struct Row {
    test: String,
    n_tokens: usize,
    tokens_per_s: f64,
    all_tokens_per_s: Vec<f64>,
    /// Decode (tg) on the CPU: the weight bytes it streamed a second (every weight once a
    /// token), in GB/s, and that as a share of the read bandwidth measured in the same run.
    weights_gbps: Option<f64>,
    bandwidth_share: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    date: String,
    model: String,
    precision: Precision,
    threads: usize,
    rows: Vec<Row>,
    /// The CPU's read bandwidth measured after the runs (GB/s, `tpslab_kernels::membw`), when
    /// decode ran on the CPU.
    read_bandwidth_gbps: Option<f64>,
    peak_rss_bytes: Option<u64>,
}

/// Whether the runs used the CPU: asked for, or `auto` on a machine without a GPU.
fn ran_on_cpu(device: DeviceChoice) -> bool {
    match device {
        DeviceChoice::Cpu => true,
        DeviceChoice::Cuda(_) => false,
        DeviceChoice::Auto => !gpu_present(),
    }
}

#[cfg(feature = "cuda")]
fn gpu_present() -> bool {
    tpslab_kernels::cuda::probe().is_ok()
}

#[cfg(not(feature = "cuda"))]
fn gpu_present() -> bool {
    false
}

/// `n` prompt tokens cut from the bundled text (repeated if it is too short); seeded random ids
/// for a synthetic model, which has no real vocabulary to cut text into.
fn prompt_tokens(lm: &LoadedModel, n: usize) -> Result<Vec<u32>> {
    if lm.is_synthetic() {
        return Ok(synthetic::random_tokens(lm.model.cfg.vocab, n, 0));
    }
    let base = lm.raw_prompt(PROMPT_TEXT)?;
    if base.is_empty() {
        bail!("the benchmark prompt tokenized to nothing");
    }
    Ok(base.iter().copied().cycle().take(n).collect())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub fn run(a: &BenchArgs) -> Result<()> {
    if a.pp.is_none() && a.tg.is_none() {
        return super::serve_bench::run(a);
    }
    let lm = a.model.load()?;
    let threads = a.model.threads;
    let ctx = lm.model.cfg.context_len;
    // Context positions per test: pp n takes n (its one sampled token none); tg n one prompt
    // token and n + 1 generated, the last of which takes none.
    let pp = a.pp.iter().flatten().map(|&n| ("pp", n, n));
    let tg = a.tg.iter().flatten().map(|&n| ("tg", n, n + 1));
    if let Some((kind, n, _)) = pp.chain(tg).find(|&(_, _, positions)| positions > ctx) {
        bail!("{kind}{n} does not fit the model's context of {ctx} tokens");
    }
    let greedy = SamplingParams::greedy();
    let mut rows = Vec::new();
    let (spec, draft) = a.spec.resolve()?;
    let setup = GenerateSetup {
        device: a.model.device,
        threads,
        spec,
        draft,
        cpu_moe_layers: a.model.cpu_moe_layers(),
        kv_types: a.kv.types.types(),
    };
    // One untimed warm-up so page faults and thread start-up don't land in the first figure.
    generate_with(
        &lm,
        &setup,
        &prompt_tokens(&lm, 16)?,
        &greedy,
        fixed(4),
        &mut |_| {},
    )?;
    for &n in a.pp.iter().flatten().filter(|&&n| n > 0) {
        let prompt = prompt_tokens(&lm, n)?;
        let mut all = Vec::new();
        for _ in 0..a.reps {
            let out = generate_with(&lm, &setup, &prompt, &greedy, fixed(1), &mut |_| {})?;
            all.push(out.prefill_tokens_per_s);
        }
        rows.push(Row {
            test: format!("pp{n}"),
            n_tokens: n,
            tokens_per_s: median(&mut all.clone()),
            all_tokens_per_s: all,
            weights_gbps: None,
            bandwidth_share: None,
        });
    }
    for &n in a.tg.iter().flatten().filter(|&&n| n > 0) {
        let prompt = prompt_tokens(&lm, 1)?;
        let mut all = Vec::new();
        for _ in 0..a.reps {
            let out = generate_with(&lm, &setup, &prompt, &greedy, fixed(n + 1), &mut |_| {})?;
            all.push(out.decode_tokens_per_s);
        }
        rows.push(Row {
            test: format!("tg{n}"),
            n_tokens: n,
            tokens_per_s: median(&mut all.clone()),
            all_tokens_per_s: all,
            weights_gbps: None,
            bandwidth_share: None,
        });
    }
    // The runs' peak, before the bandwidth probe's buffer counts in it.
    let peak_rss_bytes = crate::mem::rss_bytes().map(|(_, peak)| peak);
    let read_bandwidth_gbps = against_bandwidth(&mut rows, a, lm.model.weights.bytes());
    let report = Report {
        date: utc_now(),
        model: lm.path.display().to_string(),
        precision: lm.precision,
        threads: a.model.n_threads(),
        rows,
        read_bandwidth_gbps,
        peak_rss_bytes,
    };
    print_report(&report, a.reps, lm.model.weights.bytes());
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// Passes of the read-bandwidth probe (spread over about two seconds).
const BANDWIDTH_PASSES: usize = 16;

/// Decode streams every weight once a token: on the CPU, the read bandwidth measured now (on
/// the runs' threads) and each decode row's weight GB/s and its share of it, which say how far
/// decode is from the memory limit. Returns the bandwidth, if measured.
fn against_bandwidth(rows: &mut [Row], a: &BenchArgs, weights_bytes: usize) -> Option<f64> {
    let decodes = rows.iter().any(|r| r.test.starts_with("tg"));
    if !decodes || !ran_on_cpu(a.model.device) {
        return None;
    }
    let pool = tpslab_kernels::pool::ThreadPool::new(a.model.n_threads());
    let bw = tpslab_kernels::membw::read_bandwidth(
        &pool,
        tpslab_kernels::membw::DEFAULT_BYTES,
        BANDWIDTH_PASSES,
    );
    for r in rows.iter_mut().filter(|r| r.test.starts_with("tg")) {
        let gbps = r.tokens_per_s * weights_bytes as f64 / 1e9;
        r.weights_gbps = Some(gbps);
        r.bandwidth_share = Some(gbps / bw);
    }
    Some(bw)
}

/// The report as llama-bench's markdown table, with the bandwidth line and the peak RSS.
fn print_report(report: &Report, reps: u32, weights_bytes: usize) {
    println!(
        "model: {} ({}), {} threads, batch 1, greedy",
        report.model, report.precision, report.threads
    );
    println!(
        "| test | tokens/s (median of {}) | runs | weights GB/s | share of read bandwidth |",
        reps
    );
    println!("|---|---|---|---|---|");
    for r in &report.rows {
        let runs: Vec<String> = r
            .all_tokens_per_s
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect();
        let (gbps, share) = match (r.weights_gbps, r.bandwidth_share) {
            (Some(g), Some(s)) => (format!("{g:.1}"), format!("{:.0}%", s * 100.0)),
            _ => ("-".into(), "-".into()),
        };
        println!(
            "| {} | {:.1} | {} | {gbps} | {share} |",
            r.test,
            r.tokens_per_s,
            runs.join(", ")
        );
    }
    if let Some(bw) = report.read_bandwidth_gbps {
        println!(
            "read bandwidth: {bw:.1} GB/s ({} threads, best of {BANDWIDTH_PASSES} passes over {} MiB); decode streams {:.1} MiB of weights a token",
            report.threads,
            tpslab_kernels::membw::DEFAULT_BYTES >> 20,
            weights_bytes as f64 / (1 << 20) as f64
        );
    }
    if let Some(p) = report.peak_rss_bytes {
        println!("peak RSS: {:.1} MiB", p as f64 / (1 << 20) as f64);
    }
}

/// Exactly `n` generated tokens: end-of-sequence ignored, as benchmarks need fixed lengths.
fn fixed(n: usize) -> StopCriteria {
    StopCriteria {
        max_tokens: Some(n),
        ignore_eos: true,
        ..StopCriteria::default()
    }
}

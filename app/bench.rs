//! `tpslab bench`: its arguments, and the single-stream mode in llama-bench's shape (prompt
//! processing of N tokens, pp N, and decoding of N tokens after a one-token prompt, tg N; median
//! of several repetitions). The serving mode is in `serve_bench`.

use anyhow::{Result, bail};
use clap::Args;
use serde::Serialize;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::model::synthetic;
use tpslab_engine::sched::stop::StopCriteria;
use tpslab_engine::serving::generate::generate_on;
use tpslab_engine::serving::sampler::SamplingParams;

use crate::cli::ModelArgs;

const PROMPT_TEXT: &str = include_str!("../assets/prompts/bench.txt");

/// Two modes: the serving benchmark (default: many concurrent requests through the engine,
/// vLLM's figures), or single-stream prompt/decode speed when `--pp` or `--tg` is given.
#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Concurrency levels to measure (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
    pub concurrency: Vec<usize>,
    /// Poisson arrivals at this many requests per second (default: all at once).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Requests per level (default: as many as the concurrency, so all start together).
    #[arg(long)]
    pub num_requests: Option<usize>,
    #[arg(long, default_value_t = 128)]
    pub prompt_len: usize,
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Scheduler cap on sequences per step (default: at least the concurrency).
    #[arg(long)]
    pub max_num_seqs: Option<usize>,
    /// Scheduler token budget per step.
    #[arg(long)]
    pub max_batched_tokens: Option<usize>,
    /// KV cache memory in MiB.
    #[arg(long, default_value_t = 1024)]
    pub kv_budget_mb: usize,
    /// On a GPU: size the KV cache as this fraction of the memory left free after the weights
    /// (like vLLM's --gpu-memory-utilization, but of what is free), instead of --kv-budget-mb.
    #[arg(long, value_name = "F", value_parser = parse_fraction)]
    pub gpu_kv_fraction: Option<f32>,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Single-stream mode: prompt lengths to measure prompt processing at (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub pp: Option<Vec<usize>>,
    /// Single-stream mode: tokens to decode (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub tg: Option<Vec<usize>>,
    /// Single-stream mode: repetitions of each test; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub reps: u32,
    /// Also write every figure and the settings as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
    /// Drive a remote OpenAI-compatible server instead of the in-process engine (vLLM, SGLang,
    /// TGI, llama.cpp's server, `tpslab serve`): http(s)://host:port. `--model` then names the
    /// served model (default: the first one the server lists); prompts are token ids cut from
    /// the bundled text by `--tokenizer`'s tokenizer.
    #[arg(long, value_name = "URL")]
    pub endpoint: Option<String>,
    /// Bearer token for --endpoint (also read from TPSLAB_API_KEY).
    #[arg(long, value_name = "K", env = "TPSLAB_API_KEY", requires = "endpoint")]
    pub api_key: Option<String>,
    /// Service-level objectives for goodput, as vLLM's: `ttft:MS tpot:MS e2el:MS` (any of them);
    /// requests per second that meet all of them are reported as `request_goodput`.
    #[arg(long, value_name = "KEY:MS", num_args = 1.., value_parser = parse_slo_part)]
    pub goodput: Vec<(String, f64)>,
    /// With --endpoint: the model file (or `default`) whose tokenizer cuts the prompts.
    #[arg(
        long,
        value_name = "PATH",
        default_value = "default",
        requires = "endpoint"
    )]
    pub tokenizer: String,
}

#[derive(Debug, Serialize)]
struct Row {
    test: String,
    n_tokens: usize,
    tokens_per_s: f64,
    all_tokens_per_s: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    date: String,
    model: String,
    precision: Precision,
    threads: usize,
    rows: Vec<Row>,
    peak_rss_bytes: Option<u64>,
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
        return crate::serve_bench::run(a);
    }
    let lm = a.model.load()?;
    let threads = a.model.threads;
    let ctx = lm.model.cfg.context_len;
    if let Some(&n) =
        a.pp.iter()
            .flatten()
            .chain(a.tg.iter().flatten())
            .find(|&&n| n + 1 >= ctx)
    {
        bail!("{n} tokens do not fit the model's context of {ctx}");
    }
    let greedy = SamplingParams::greedy();
    let mut rows = Vec::new();
    // One untimed warm-up so page faults and thread start-up don't land in the first figure.
    let dev = a.model.device;
    generate_on(
        &lm,
        dev,
        threads,
        &prompt_tokens(&lm, 16)?,
        &greedy,
        fixed(4),
        &mut |_| {},
    )?;
    for &n in a.pp.iter().flatten().filter(|&&n| n > 0) {
        let prompt = prompt_tokens(&lm, n)?;
        let mut all = Vec::new();
        for _ in 0..a.reps {
            let out = generate_on(&lm, dev, threads, &prompt, &greedy, fixed(1), &mut |_| {})?;
            all.push(out.prefill_tokens_per_s);
        }
        rows.push(Row {
            test: format!("pp{n}"),
            n_tokens: n,
            tokens_per_s: median(&mut all.clone()),
            all_tokens_per_s: all,
        });
    }
    for &n in a.tg.iter().flatten().filter(|&&n| n > 0) {
        let prompt = prompt_tokens(&lm, 1)?;
        let mut all = Vec::new();
        for _ in 0..a.reps {
            let out = generate_on(
                &lm,
                dev,
                threads,
                &prompt,
                &greedy,
                fixed(n + 1),
                &mut |_| {},
            )?;
            all.push(out.decode_tokens_per_s);
        }
        rows.push(Row {
            test: format!("tg{n}"),
            n_tokens: n,
            tokens_per_s: median(&mut all.clone()),
            all_tokens_per_s: all,
        });
    }
    let report = Report {
        date: utc_now(),
        model: lm.path.display().to_string(),
        precision: lm.precision,
        threads: a.model.n_threads(),
        rows,
        peak_rss_bytes: crate::mem::rss_bytes().map(|(_, peak)| peak),
    };
    println!(
        "model: {} ({}), {} threads, batch 1, greedy",
        report.model, report.precision, report.threads
    );
    println!("| test | tokens/s (median of {}) | runs |", a.reps);
    println!("|---|---|---|");
    for r in &report.rows {
        let runs: Vec<String> = r
            .all_tokens_per_s
            .iter()
            .map(|v| format!("{v:.1}"))
            .collect();
        println!(
            "| {} | {:.1} | {} |",
            r.test,
            r.tokens_per_s,
            runs.join(", ")
        );
    }
    if let Some(p) = report.peak_rss_bytes {
        println!("peak RSS: {:.1} MiB", p as f64 / (1 << 20) as f64);
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// Exactly `n` generated tokens: end-of-sequence ignored, as benchmarks need fixed lengths.
fn fixed(n: usize) -> StopCriteria {
    StopCriteria {
        max_tokens: Some(n),
        ignore_eos: true,
        ..StopCriteria::default()
    }
}

/// The current UTC time as `YYYY-MM-DD HH:MM:SS UTC` (for reports).
pub fn utc_now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    tpslab_engine::text::chat::strftime_utc("%Y-%m-%d %H:%M:%S UTC", secs)
}

/// A fraction in (0, 0.95].
fn parse_fraction(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(f) if f > 0.0 && f <= 0.95 => Ok(f),
        _ => Err(format!("'{s}' is not a fraction between 0 and 0.95")),
    }
}

/// One `KEY:MS` of `--goodput`: ttft, tpot or e2el, and a positive number of milliseconds.
fn parse_slo_part(v: &str) -> Result<(String, f64), String> {
    let (k, ms) = v
        .split_once(':')
        .ok_or_else(|| format!("{v:?}: expected KEY:MS, e.g. ttft:500"))?;
    let k = k.trim().to_ascii_lowercase();
    if !["ttft", "tpot", "e2el"].contains(&k.as_str()) {
        return Err(format!("{k:?}: the objectives are ttft, tpot and e2el"));
    }
    let ms: f64 = ms
        .trim()
        .parse()
        .map_err(|_| format!("{ms:?} is not a number of milliseconds"))?;
    if !(ms.is_finite() && ms > 0.0) {
        return Err(format!(
            "{k}:{ms}: the objective must be a positive number of milliseconds"
        ));
    }
    Ok((k, ms))
}

/// `--goodput`'s objectives (`None` when none was given).
pub fn slo(parts: &[(String, f64)]) -> Option<tpslab_engine::serving::metrics::Slo> {
    let get = |key: &str| parts.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v);
    (!parts.is_empty()).then(|| tpslab_engine::serving::metrics::Slo {
        ttft_ms: get("ttft"),
        tpot_ms: get("tpot"),
        e2el_ms: get("e2el"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goodput_objectives_parse_as_vllm_spells_them() {
        assert_eq!(parse_slo_part("ttft:500"), Ok(("ttft".into(), 500.0)));
        assert_eq!(parse_slo_part("TPOT: 50.5"), Ok(("tpot".into(), 50.5)));
        assert!(parse_slo_part("itl:5").is_err());
        assert!(parse_slo_part("ttft").is_err());
        assert!(parse_slo_part("e2el:-3").is_err());
        assert!(parse_slo_part("e2el:NaN").is_err());
        let s = slo(&[("ttft".into(), 500.0), ("e2el".into(), 9000.0)]).expect("slo");
        assert_eq!(
            (s.ttft_ms, s.tpot_ms, s.e2el_ms),
            (Some(500.0), None, Some(9000.0))
        );
        assert!(slo(&[]).is_none());
    }
}

//! Single-stream benchmarks in llama-bench's shape: prompt processing of N tokens (pp N) and
//! decoding of N tokens after a one-token prompt (tg N), median of several repetitions.

use anyhow::{Result, bail};
use clap::Args;
use serde::Serialize;
use tpslab_engine::generate::{LoadedModel, generate};
use tpslab_engine::sampler::SamplingParams;
use tpslab_engine::stop::StopCriteria;

use crate::cli::ModelArgs;

const PROMPT_TEXT: &str = include_str!("../assets/prompts/bench.txt");

#[derive(Args, Debug)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt lengths to measure prompt processing at (comma separated).
    #[arg(long, value_delimiter = ',', default_value = "128,512")]
    pub pp: Vec<usize>,
    /// Tokens to decode for the decode measurement (comma separated; 0 = skip).
    #[arg(long, value_delimiter = ',', default_value = "128")]
    pub tg: Vec<usize>,
    /// Repetitions of each test; the median is reported.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub reps: u32,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<std::path::PathBuf>,
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
    model: String,
    precision: String,
    threads: usize,
    rows: Vec<Row>,
    peak_rss_bytes: Option<u64>,
}

/// `n` prompt tokens cut from the bundled text (repeated if it is too short).
fn prompt_tokens(lm: &LoadedModel, n: usize) -> Result<Vec<u32>> {
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
    let (lm, pool) = a.model.load()?;
    let ctx = lm.model.cfg.context_len;
    if let Some(&n) = a.pp.iter().chain(&a.tg).find(|&&n| n + 1 >= ctx) {
        bail!("{n} tokens do not fit the model's context of {ctx}");
    }
    let greedy = SamplingParams::greedy();
    let mut rows = Vec::new();
    // One untimed warm-up so page faults and thread start-up don't land in the first figure.
    generate(&lm, &pool, &prompt_tokens(&lm, 16)?, &greedy, fixed(4), &mut |_| {})?;
    for &n in a.pp.iter().filter(|&&n| n > 0) {
        let prompt = prompt_tokens(&lm, n)?;
        let mut all = Vec::new();
        for _ in 0..a.reps {
            let out = generate(&lm, &pool, &prompt, &greedy, fixed(1), &mut |_| {})?;
            all.push(out.prefill_tokens_per_s);
        }
        rows.push(Row { test: format!("pp{n}"), n_tokens: n, tokens_per_s: median(&mut all.clone()), all_tokens_per_s: all });
    }
    for &n in a.tg.iter().filter(|&&n| n > 0) {
        let prompt = prompt_tokens(&lm, 1)?;
        let mut all = Vec::new();
        for _ in 0..a.reps {
            let out = generate(&lm, &pool, &prompt, &greedy, fixed(n + 1), &mut |_| {})?;
            all.push(out.decode_tokens_per_s);
        }
        rows.push(Row { test: format!("tg{n}"), n_tokens: n, tokens_per_s: median(&mut all.clone()), all_tokens_per_s: all });
    }
    let report = Report {
        model: lm.path.display().to_string(),
        precision: lm.precision.clone(),
        threads: pool.n_threads(),
        rows,
        peak_rss_bytes: crate::mem::rss_bytes().map(|(_, peak)| peak),
    };
    println!("model: {} ({}), {} threads, batch 1, greedy", report.model, report.precision, report.threads);
    println!("| test | tokens/s (median of {}) | runs |", a.reps);
    println!("|---|---|---|");
    for r in &report.rows {
        let runs: Vec<String> = r.all_tokens_per_s.iter().map(|v| format!("{v:.1}")).collect();
        println!("| {} | {:.1} | {} |", r.test, r.tokens_per_s, runs.join(", "));
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
    StopCriteria { max_tokens: Some(n), ignore_eos: true, ..StopCriteria::default() }
}

//! `tpslab bench`: the dispatch to its two modes, and the single-stream mode in llama-bench's
//! shape (prompt processing of N tokens, pp N, and decoding of N tokens after a one-token prompt,
//! tg N; median of several repetitions). The serving mode is in `serve_bench`.

use anyhow::{Result, bail};
use serde::Serialize;
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
        return super::serve_bench::run(a);
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
    let (spec, draft) = a.spec.resolve()?;
    let setup = GenerateSetup {
        device: a.model.device,
        threads,
        spec,
        draft,
        cpu_moe_layers: a.model.cpu_moe_layers(),
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

//! The serving benchmark: `tpslab bench --concurrency 1,4,16,64`. For each level it starts the
//! engine (or drives a remote server, `--endpoint`), drives it with the load generator, and
//! reports vLLM's figures (TTFT, TPOT, ITL, E2EL percentiles, output throughput) plus both faces
//! of TPS: per request and aggregate; `--json-schema` and (remote) `--tools` run every level
//! again with structured output or tool requests, side by side.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::model::synthetic;
use tpslab_engine::serving::constraint::{Grammar, compiler_for, mask_stats};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};
use tpslab_engine::serving::loadgen::{self, ConstrainedTarget, LenDist, LoadSpec, PromptSet};
use tpslab_engine::serving::metrics::{BenchSummary, RequestTiming};
use tpslab_engine::serving::spec_metrics::SpecUsage;

use super::bench_args::BenchArgs;
use crate::remote::{Decode, RemoteShape};

/// `tpslab bench`'s KV pool without `--kv-budget-mb`, in MiB: room for 64 requests of the
/// default lengths on a 1B model.
const BENCH_KV_MB: usize = 1024;

/// One concurrency level: vLLM's result fields (flattened) plus ours.
#[derive(Debug, Serialize)]
struct LevelResult {
    max_concurrency: usize,
    request_rate: Option<f64>,
    num_prompts: usize,
    prompt_len: usize,
    output_len: usize,
    #[serde(flatten)]
    summary: BenchSummary,
    /// Output tokens produced after every request had its first token, over that span: the
    /// steady decode rate (llama-batched-bench's S_TG when all requests start together).
    decode_throughput: Option<f64>,
    refused: usize,
    peak_rss_bytes: Option<u64>,
    /// The schema every request of this level was constrained to (`--json-schema`).
    #[serde(skip_serializing_if = "Option::is_none")]
    json_schema: Option<String>,
    /// The tools every (chat) request of this level carried, a call required (`--tools`).
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<String>,
    /// Speculative decoding over the level's requests (vLLM's spec_decode counts), when
    /// anything was proposed.
    spec: Option<SpecFigures>,
    /// The share of a mixture of experts' weights a step read, over the level's steps (weighted
    /// by step; `None` for a dense model or a remote server).
    #[serde(skip_serializing_if = "Option::is_none")]
    expert_share: Option<f64>,
}

/// A level's speculation: vLLM's counters and the rates derived from them.
#[derive(Debug, Serialize)]
struct SpecFigures {
    num_drafts: usize,
    num_draft_tokens: usize,
    num_accepted_tokens: usize,
    acceptance_rate: Option<f64>,
    mean_acceptance_length: Option<f64>,
    /// Mean proposal time, and mean time of a step that verified proposals, per verified step
    /// of a request (ms; a step's time counts for each request it verified).
    propose_ms_per_draft: Option<f64>,
    verify_ms_per_draft: Option<f64>,
}

/// "2.35", or "-" without a figure.
fn ms(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |v| format!("{v:.2}"))
}

fn spec_figures(timings: &[RequestTiming]) -> Option<SpecFigures> {
    let mut u = SpecUsage::default();
    for t in timings {
        u.add(&t.spec);
    }
    (u.draft_tokens > 0).then(|| SpecFigures {
        num_drafts: u.drafts,
        num_draft_tokens: u.draft_tokens,
        num_accepted_tokens: u.accepted_tokens,
        acceptance_rate: u.acceptance_rate(),
        mean_acceptance_length: u.mean_acceptance_length(),
        propose_ms_per_draft: u.propose_ms_per_draft(),
        verify_ms_per_draft: u.verify_ms_per_draft(),
    })
}

#[derive(Debug, Serialize)]
struct Report {
    date: String,
    model: String,
    /// `None` for a remote server (written as "", as reports always had it).
    #[serde(serialize_with = "empty_when_unknown")]
    precision: Option<Precision>,
    threads: usize,
    /// The device that ran the model ("CPU, 2 threads", "CUDA cuda:0 NVIDIA H200").
    device: String,
    weights_bytes: usize,
    knobs: Knobs,
    runs: Vec<LevelResult>,
}

/// A report's precision: its label, or "" where it is not known (a remote server's).
fn empty_when_unknown<S: serde::Serializer>(
    p: &Option<Precision>,
    s: S,
) -> Result<S::Ok, S::Error> {
    match p {
        Some(p) => p.serialize(s),
        None => s.serialize_str(""),
    }
}

/// Tokens per second after the last request got its first token, until the end of the run.
fn decode_throughput(timings: &[RequestTiming]) -> Option<f64> {
    let last_first = timings
        .iter()
        .filter_map(|t| t.token_times.first())
        .copied()
        .fold(f64::NAN, f64::max);
    let end = timings
        .iter()
        .filter_map(|t| t.token_times.last())
        .copied()
        .fold(f64::NAN, f64::max);
    let n = timings
        .iter()
        .flat_map(|t| &t.token_times)
        .filter(|&&x| x > last_first)
        .count();
    (end > last_first && n > 0).then(|| n as f64 / (end - last_first))
}

/// The bundled text's tokens; seeded random ids for a synthetic model, which has no real
/// vocabulary to cut text into.
pub fn prompt_set(lm: &LoadedModel) -> Result<PromptSet> {
    let tokens = match lm.is_synthetic() {
        true => synthetic::random_tokens(lm.model.cfg.vocab, 1 << 14, 0),
        false => lm.raw_prompt(loadgen::PROMPT_TEXT)?,
    };
    PromptSet::new(tokens).ok_or_else(|| anyhow::anyhow!("the prompt set tokenized to nothing"))
}

/// Refuses a prompt and output that together do not fit the model's context.
pub fn check_fits(lm: &LoadedModel, prompt_len: usize, output_len: usize) -> Result<()> {
    let ctx = lm.model.cfg.context_len;
    if prompt_len + output_len >= ctx {
        bail!(
            "prompt {prompt_len} + output {output_len} tokens do not fit the model's context of {ctx}"
        );
    }
    Ok(())
}

/// `--workload`'s prompts: free writing, or copy-heavy.
fn workload_prompts(a: &BenchArgs, lm: &LoadedModel) -> Result<PromptSet> {
    let p = prompt_set(lm)?;
    Ok(if a.workload == "copy" { p.copying() } else { p })
}

/// One markdown row per concurrency level.
fn print_table(runs: &[LevelResult]) {
    for r in runs.iter().filter(|r| r.summary.request_goodput.is_some()) {
        println!(
            "concurrency {}: goodput {:.2} req/s of {:.2} req/s",
            r.max_concurrency,
            r.summary.request_goodput.unwrap_or(0.0),
            r.summary.request_throughput
        );
    }
    println!(
        "| concurrency | requests | TTFT mean / p99 ms | TPOT mean / p99 ms | ITL p99 ms | per-request TPS mean / p10 | aggregate output TPS | decode-only TPS | req/s | peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let s = &r.summary;
        let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1}"));
        println!(
            "| {} | {} | {:.0} / {:.0} | {:.1} / {:.1} | {:.1} | {} / {} | {:.1} | {} | {:.2} | {} |",
            r.max_concurrency,
            s.completed,
            s.mean_ttft_ms,
            s.p99_ttft_ms,
            s.mean_tpot_ms,
            s.p99_tpot_ms,
            s.p99_itl_ms,
            f(s.mean_per_request_tps),
            f(s.p10_per_request_tps),
            s.output_throughput,
            f(r.decode_throughput),
            s.request_throughput,
            r.peak_rss_bytes.map_or("-".to_string(), |b| format!(
                "{:.0}",
                b as f64 / (1 << 20) as f64
            )),
        );
    }
    for r in runs {
        if let Some(share) = r.expert_share {
            println!(
                "concurrency {}: a step read {:.1}% of the expert weights",
                r.max_concurrency,
                share * 100.0
            );
        }
        if let Some(sp) = &r.spec {
            println!(
                "concurrency {}: speculation accepted {} of {} proposed tokens ({}), {} tokens per verified step, propose {} ms and verify {} ms a verified step",
                r.max_concurrency,
                sp.num_accepted_tokens,
                sp.num_draft_tokens,
                sp.acceptance_rate
                    .map_or("-".to_string(), |v| format!("{:.0}%", v * 100.0)),
                sp.mean_acceptance_length
                    .map_or("-".to_string(), |v| format!("{v:.2}")),
                ms(sp.propose_ms_per_draft),
                ms(sp.verify_ms_per_draft),
            );
        }
    }
}

/// Runs every concurrency level against a target `target_for(level)` gives, and collects the
/// results.
fn run_levels<T: loadgen::LoadTarget>(
    a: &BenchArgs,
    prompts: &PromptSet,
    mut target_for: impl FnMut(usize) -> Result<T>,
    rss: bool,
) -> Result<Vec<LevelResult>> {
    let mut runs = Vec::new();
    for (level, &c) in a.concurrency.iter().enumerate() {
        let n = a.num_requests.unwrap_or(c);
        let target = target_for(c)?;
        let spec = LoadSpec {
            concurrency: Some(c),
            rate: a.rate,
            num_requests: n,
            prompt_len: LenDist::Fixed(a.prompt_len),
            output_len: LenDist::Fixed(a.output_len),
            // Other prompts at each level: a server keeps its prefix cache between levels.
            seed: level as u64,
            priority: 0,
            submit_for_s: None,
            cut_after_s: None,
            temperature: a.temperature,
        };
        let bar = ProgressBar::new(n as u64);
        bar.set_style(
            ProgressStyle::with_template(
                "concurrency {prefix:>3} [{bar:30}] {pos}/{len} requests {elapsed}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_prefix(c.to_string());
        let stop = AtomicBool::new(false);
        let result = loadgen::run(&target, prompts, &spec, &stop, &mut |done, _| {
            bar.set_position(done as u64)
        });
        bar.finish_and_clear();
        if let Some(r) = result.refused.first() {
            eprintln!(
                "concurrency {c}: {} of {n} requests refused, e.g.: {r}",
                result.refused.len()
            );
        }
        let summary = BenchSummary::from_requests(
            &result.timings,
            result.duration_s,
            super::bench_args::slo(&a.goodput),
        );
        runs.push(LevelResult {
            max_concurrency: c,
            request_rate: a.rate,
            num_prompts: n,
            prompt_len: a.prompt_len,
            output_len: a.output_len,
            decode_throughput: decode_throughput(&result.timings),
            spec: spec_figures(&result.timings),
            expert_share: target.counters().and_then(|c| c.expert_share()),
            summary,
            refused: result.refused.len(),
            peak_rss_bytes: rss
                .then(|| crate::mem::rss_bytes().map(|(_, p)| p))
                .flatten(),
            json_schema: None,
            tools: None,
        });
    }
    Ok(runs)
}

/// `--endpoint`: the same levels, figures and report against a remote server, measured on the
/// client side.
fn run_remote(a: &BenchArgs, url: &str) -> Result<()> {
    if a.concurrency.contains(&0) {
        bail!("--concurrency levels must be at least 1");
    }
    let path = crate::model_args::resolve(&a.tokenizer, None)?;
    let lm = LoadedModel::load(&path)?;
    let prompts = workload_prompts(a, &lm)?;
    let model = (a.model.model != "default").then_some(a.model.model.as_str());
    let mut target = crate::remote::RemoteTarget::connect(url, a.api_key.clone(), model)
        .map_err(|e| anyhow::anyhow!(e))?;
    let device = format!("remote {} ({})", target.url(), target.model());
    println!(
        "endpoint: {}, model {}, prompt {} tokens (ids), output {} tokens, temperature {}, ignore-eos",
        target.url(),
        target.model(),
        a.prompt_len,
        a.output_len,
        a.temperature
    );
    let mut runs = run_levels(a, &prompts, |_| Ok(&target), false)?;
    print_table(&runs);
    let plain = runs.len();
    if let Some(file) = &a.json_schema {
        let schema = read_json(file)?;
        let extra = json!({"response_format": {"type": "json_schema",
            "json_schema": {"name": "bench", "schema": schema, "strict": true}}});
        target.set_requests(RemoteShape::Completions, object(extra));
        let mut more = run_levels(a, &prompts, |_| Ok(&target), false)?;
        for r in &mut more {
            r.json_schema = Some(file.display().to_string());
        }
        println!("\nwith every request constrained to {}:", file.display());
        print_table(&more);
        print_ratios(&runs[..plain], &more, "constrained");
        runs.extend(more);
    }
    if let Some(file) = &a.tools {
        let tools = read_json(file)?;
        if tools.as_array().is_none_or(|t| t.is_empty()) {
            bail!("{} must hold a JSON list of tools", file.display());
        }
        let lm = Arc::new(lm);
        let decode: Decode =
            Arc::new(move |ids| lm.tokenizer.decode(ids, true).unwrap_or_default());
        target.set_requests(
            RemoteShape::Chat(decode),
            object(json!({"tools": tools, "tool_choice": "required"})),
        );
        let mut more = run_levels(a, &prompts, |_| Ok(&target), false)?;
        for r in &mut more {
            r.tools = Some(file.display().to_string());
        }
        println!(
            "\nas chat requests with the tools of {} (a call required):",
            file.display()
        );
        print_table(&more);
        print_ratios(&runs[..plain], &more, "with tools");
        runs.extend(more);
    }
    if let Some(path) = &a.json {
        let report = Report {
            date: super::bench_args::utc_now(),
            model: target.model().to_string(),
            precision: None,
            threads: 0,
            device,
            weights_bytes: 0,
            knobs: Knobs::default(),
            runs,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

pub fn run(a: &BenchArgs) -> Result<()> {
    if let Some(url) = &a.endpoint {
        return run_remote(a, url);
    }
    let lm = a.model.load()?;
    check_fits(&lm, a.prompt_len, a.output_len)?;
    if a.concurrency.contains(&0) {
        bail!("--concurrency levels must be at least 1");
    }
    let prompts = workload_prompts(a, &lm)?;
    let mut knobs = Knobs::default();
    let (spec, draft) = a.spec.resolve()?;
    knobs.spec = spec;
    if let Some(n) = a.max_num_seqs {
        knobs.scheduler.max_num_seqs = n;
    }
    if let Some(n) = a.max_batched_tokens {
        knobs.scheduler.max_num_batched_tokens = n;
    }
    knobs.kv = a.kv.settings(BENCH_KV_MB);
    let mut device = String::new();
    let threads = a.model.n_threads();
    println!(
        "model: {} ({}), {threads} threads, prompt {} tokens ({}), output {} tokens, {}, ignore-eos, speculation {}{}",
        lm.path.display(),
        lm.precision,
        a.prompt_len,
        a.workload,
        a.output_len,
        if a.temperature > 0.0 {
            format!("temperature {}", a.temperature)
        } else {
            "greedy".into()
        },
        knobs.spec.method,
        match (knobs.spec.method, knobs.spec.payoff) {
            (tpslab_engine::spec::SpecMethod::Off, _) => "",
            (_, true) => " (verified when it pays)",
            (_, false) => " (every proposal verified)",
        }
    );
    let mut runs = run_levels(
        a,
        &prompts,
        |c| {
            let engine = start_engine(a, &lm, &knobs, c, draft.clone())?;
            if device.is_empty() {
                let st = engine.stats();
                device = st.device.clone();
                if let Some(note) = &st.device_note {
                    eprintln!("{note}");
                }
                println!("device: {device}");
                println!(
                    "KV pool: {} blocks of {} tokens ({} tokens, {} KV, {:.1} MiB)",
                    st.kv_total_blocks,
                    st.knobs.kv.block_size,
                    crate::serve::metrics::kv_capacity_tokens(&st),
                    st.knobs.kv.types,
                    st.kv_bytes as f64 / (1 << 20) as f64
                );
            }
            Ok(engine)
        },
        true,
    )?;
    print_table(&runs);
    if let Some(file) = &a.json_schema {
        runs.extend(run_constrained(a, &lm, &prompts, &knobs, file, &runs)?);
    }
    if let Some((_, peak)) = crate::mem::rss_bytes() {
        println!("peak RSS: {:.1} MiB", peak as f64 / (1 << 20) as f64);
    }
    if let Some(path) = &a.json {
        let report = Report {
            date: super::bench_args::utc_now(),
            model: lm.path.display().to_string(),
            precision: Some(lm.precision),
            threads,
            device,
            weights_bytes: lm.model.weights.bytes(),
            knobs,
            runs,
        };
        std::fs::write(path, serde_json::to_string_pretty(&report)?)?;
    }
    Ok(())
}

/// The in-process engine for one concurrency level.
fn start_engine(
    a: &BenchArgs,
    lm: &Arc<LoadedModel>,
    knobs: &Knobs,
    c: usize,
    draft: Option<Arc<LoadedModel>>,
) -> Result<EngineHandle> {
    let mut k = knobs.clone();
    // The batch cap must not hide the concurrency being measured.
    k.scheduler.max_num_seqs = a.max_num_seqs.unwrap_or(k.scheduler.max_num_seqs.max(c));
    Ok(EngineHandle::start(
        Arc::clone(lm),
        EngineConfig {
            threads: a.model.threads,
            knobs: k,
            device: a.model.device,
            gpu_kv_fraction: a.kv.gpu_fraction(),
            cpu_moe_layers: a.model.cpu_moe_layers(),
            draft,
        },
        None,
    )?)
}

/// `--json-schema`: the levels again with every request constrained, then the same-run ratios
/// and the mask cost per token (time on the workers, and time the engine step waited).
fn run_constrained(
    a: &BenchArgs,
    lm: &Arc<LoadedModel>,
    prompts: &PromptSet,
    knobs: &Knobs,
    file: &std::path::Path,
    plain: &[LevelResult],
) -> Result<Vec<LevelResult>> {
    let schema = read_json(file)?;
    let constraint = compiler_for(&lm.tokenizer)?.compile(&Grammar::json_schema(schema))?;
    let before = mask_stats();
    let mut runs = run_levels(
        a,
        prompts,
        |c| {
            Ok(ConstrainedTarget {
                // Constrained requests never speculate: a proposal would need the grammar's check.
                inner: start_engine(
                    a,
                    lm,
                    &Knobs {
                        spec: Default::default(),
                        ..knobs.clone()
                    },
                    c,
                    None,
                )?,
                constraint: constraint.clone(),
            })
        },
        true,
    )?;
    let after = mask_stats();
    for r in &mut runs {
        r.json_schema = Some(file.display().to_string());
    }
    println!("\nwith every request constrained to {}:", file.display());
    print_table(&runs);
    print_ratios(plain, &runs, "constrained");
    let masks = after.masks.saturating_sub(before.masks).max(1) as f64;
    println!(
        "masks: {} computed, {:.3} ms each on the workers, the engine step waited {:.3} ms per mask",
        after.masks - before.masks,
        (after.compute_ns - before.compute_ns) as f64 / masks / 1e6,
        (after.wait_ns - before.wait_ns) as f64 / masks / 1e6,
    );
    Ok(runs)
}

/// A JSON file, read and parsed.
fn read_json(file: &std::path::Path) -> Result<Value> {
    let text =
        std::fs::read_to_string(file).with_context(|| format!("cannot read {}", file.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{} is not valid JSON", file.display()))
}

/// A JSON object's fields (empty for anything else).
fn object(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

/// The same levels plain and with something added, side by side.
fn print_ratios(plain: &[LevelResult], runs: &[LevelResult], label: &str) {
    println!(
        "\n| concurrency | aggregate TPS plain | {label} | ratio | per-request TPS plain | {label} | ratio |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (p, s) in plain.iter().zip(runs) {
        let ratio = |x: f64, y: f64| if x > 0.0 { y / x } else { f64::NAN };
        let (pp, sp) = (
            p.summary.mean_per_request_tps.unwrap_or(0.0),
            s.summary.mean_per_request_tps.unwrap_or(0.0),
        );
        println!(
            "| {} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} |",
            p.max_concurrency,
            p.summary.output_throughput,
            s.summary.output_throughput,
            ratio(p.summary.output_throughput, s.summary.output_throughput),
            pp,
            sp,
            ratio(pp, sp),
        );
    }
}

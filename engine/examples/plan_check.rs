//! The capacity planner against a fresh measurement on this machine: the default model
//! (SmolLM2-135M Q4_1) through the real engine at each concurrency level, all requests at once,
//! prompt 128 and output 128 tokens, token budget 2048, with the load generator `tpslab bench`
//! uses; beside each measured figure, the planner's prediction for the table's `this-cpu` and
//! its error. A measurement, not a test: the figures depend on the machine's load.
//!
//! `cargo run -j 1 -p tpslab-engine --example plan_check -- 1,4,16 [THREADS]`

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::plan::{DeviceTable, ModelShape, Workload, predict};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};
use tpslab_engine::serving::loadgen::{self, LoadSpec, PromptSet};
use tpslab_engine::serving::metrics::{BenchSummary, percentile};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let levels: Vec<usize> = (args.next().unwrap_or_else(|| "1,4,16".into()).split(','))
        .map(str::parse)
        .collect::<std::result::Result<_, _>>()?;
    let threads: usize = args.next().map_or(Ok(2), |t| t.parse())?;
    let path = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}"))?;
    let lm = Arc::new(LoadedModel::load(&path)?);
    let prompts = PromptSet::new(lm.raw_prompt(loadgen::PROMPT_TEXT)?).ok_or("no prompt tokens")?;
    let table = DeviceTable::bundled()?;
    let cpu = table.device("this-cpu")?;
    let shape = ModelShape::from_config(
        "smollm2-135m",
        &lm.model.cfg,
        lm.model.weights.lm_head.is_none(),
    );
    let (prompt_len, output_len, budget) = (128, 128, 2048);
    println!(
        "| concurrency | aggregate tok/s | per-request tok/s (1000 / median TPOT) | median TTFT ms |"
    );
    println!("|---|---|---|---|");
    for (i, &c) in levels.iter().enumerate() {
        let mut knobs = Knobs::default();
        knobs.scheduler.max_num_seqs = knobs.scheduler.max_num_seqs.max(c);
        knobs.scheduler.max_num_batched_tokens = budget;
        let engine = EngineHandle::start(
            Arc::clone(&lm),
            EngineConfig {
                threads,
                knobs,
                device: DeviceChoice::Cpu,
                ..EngineConfig::default()
            },
            None,
        )?;
        let spec = LoadSpec::all_at_once(c, prompt_len, output_len, i as u64);
        let run = loadgen::run(
            &engine,
            &prompts,
            &spec,
            &AtomicBool::new(false),
            &mut |_, _| {},
        );
        let s = BenchSummary::from_requests(&run.timings, run.duration_s, None);
        let tpots: Vec<f64> = run.timings.iter().filter_map(|t| t.tpot()).collect();
        let ttfts: Vec<f64> = run.timings.iter().filter_map(|t| t.ttft()).collect();
        let per_request = percentile(&tpots, 50.0).map_or(f64::NAN, |t| 1.0 / t);
        let ttft_ms = percentile(&ttfts, 50.0).map_or(f64::NAN, |t| t * 1e3);
        let w = Workload {
            concurrency: c,
            prompt_len,
            output_len,
            token_budget: budget,
        };
        let p = predict(&table, cpu, &shape, lm.precision.main, &w)?;
        let cell = |pred: Option<f64>, meas: f64| {
            let pred = pred.unwrap_or(f64::NAN);
            format!(
                "{pred:.1} / {meas:.1} ({:+.0}%)",
                (pred / meas - 1.0) * 100.0
            )
        };
        println!(
            "| {c} | {} | {} | {} |",
            cell(p.aggregate_tps, s.output_throughput),
            cell(p.per_request_tps, per_request),
            cell(p.ttft_ms, ttft_ms)
        );
    }
    Ok(())
}

//! `tpslab plan --calibrate`: the default model (SmolLM2-135M, Q4_1) measured through the engine
//! on this machine at a few concurrencies, in the shape of the planner's measured rows, then
//! `this-cpu` refitted to the run at one request (`plan::calibrate_device`); the other levels are
//! held out, so the printed error says what the calibration is worth here.

use std::sync::atomic::AtomicBool;

use anyhow::{Context, Result, bail};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::plan::{DeviceSpec, DeviceTable, MeasuredRow, calibrate_device};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};
use tpslab_engine::serving::loadgen::{self, LoadSpec};
use tpslab_engine::serving::metrics::BenchSummary;
use tpslab_kernels::WType;

use super::bench_args::utc_now;
use super::serve_bench::prompt_set;
use crate::model_args::ModelArgs;

/// The levels measured: the first is fitted, the others held out.
const LEVELS: [usize; 3] = [1, 4, 16];
/// The workload of every level (the bundled rows' shape).
const PROMPT_LEN: usize = 128;
const OUTPUT_LEN: usize = 128;
/// The shape the default model is planned as.
const SHAPE: &str = "smollm2-135m";
/// The device row that stands for this machine.
const THIS_CPU: &str = "this-cpu";

/// `this-cpu` of `table`, refitted to the default model measured here with `threads` compute
/// threads (0: one per core); progress goes to stderr.
pub fn calibrate_here(table: &DeviceTable, threads: usize) -> Result<DeviceSpec> {
    let args = ModelArgs {
        model: "default".into(),
        synthetic: None,
        precision: None,
        synthetic_seed: 0,
        device: DeviceChoice::Cpu,
        threads,
    };
    let lm = args.load()?;
    if lm.precision != Precision::built(&lm.model.cfg, WType::Q4_1) {
        bail!(
            "the default model is {}, not the Q4_1 the calibration plans it as",
            lm.precision
        );
    }
    let prompts = prompt_set(&lm)?;
    let knobs = Knobs::default();
    let budget = knobs.scheduler.max_num_batched_tokens;
    let source = format!(
        "tpslab plan --calibrate, {}, {} threads, {} kernels",
        utc_now(),
        args.n_threads(),
        tpslab_kernels::Backend::detect().name()
    );
    let mut rows = Vec::new();
    for (i, &c) in LEVELS.iter().enumerate() {
        let engine = EngineHandle::start(
            lm.clone(),
            EngineConfig {
                threads: args.n_threads(),
                knobs: Knobs {
                    scheduler: tpslab_engine::sched::SchedulerConfig {
                        max_num_seqs: knobs.scheduler.max_num_seqs.max(c),
                        ..knobs.scheduler.clone()
                    },
                    ..knobs.clone()
                },
                device: DeviceChoice::Cpu,
                ..EngineConfig::default()
            },
            None,
        )?;
        let spec = LoadSpec::all_at_once(c, PROMPT_LEN, OUTPUT_LEN, i as u64);
        let stop = AtomicBool::new(false);
        let run = loadgen::run(&engine, &prompts, &spec, &stop, &mut |_, _| {});
        if let Some(r) = run.refused.first() {
            bail!("concurrency {c}: a request was refused: {r}");
        }
        let s = BenchSummary::from_requests(&run.timings, run.duration_s, None);
        let per_request = s
            .mean_per_request_tps
            .context("no request decoded two tokens")?;
        eprintln!(
            "calibration run, concurrency {c}: {:.1} tok/s aggregate, {per_request:.1} per request, median TTFT {:.0} ms",
            s.output_throughput, s.median_ttft_ms
        );
        rows.push(MeasuredRow {
            model: SHAPE.into(),
            precision: "Q4_1".into(),
            concurrency: c,
            prompt_len: PROMPT_LEN,
            output_len: OUTPUT_LEN,
            token_budget: budget,
            aggregate_tps: s.output_throughput,
            per_request_tps: per_request,
            ttft_ms: s.median_ttft_ms,
            fitted: i == 0,
            source: source.clone(),
        });
    }
    let device = table.device(THIS_CPU)?;
    Ok(calibrate_device(table, device, rows, &source)?)
}

//! `tpslab plan --calibrate`: the default model (SmolLM2-135M, Q4_1) measured through the engine
//! on this machine at a few concurrencies, in the shape of the planner's measured rows, then
//! `this-cpu` refitted to the run at one request (`plan::calibrate_device`); the other levels are
//! held out, so the printed error says what the calibration is worth here.

use std::sync::atomic::AtomicBool;

use anyhow::{Result, bail};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::plan::calibrate::{self, LEVELS, THIS_CPU};
use tpslab_engine::plan::{DeviceSpec, DeviceTable, calibrate_device};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};

use super::serve_bench::prompt_set;
use crate::model_args::ModelArgs;

/// `this-cpu` of `table`, refitted to the default model measured here with `threads` compute
/// threads (0: one per core); progress goes to stderr.
pub fn calibrate_here(table: &DeviceTable, threads: usize) -> Result<DeviceSpec> {
    let args = ModelArgs {
        model: "default".into(),
        hf_repo: None,
        synthetic: None,
        precision: None,
        synthetic_seed: 0,
        device: DeviceChoice::Cpu,
        threads,
        n_cpu_moe: 0,
        cpu_moe: false,
    };
    let lm = args.load()?;
    if lm.precision != Precision::built(&lm.model.cfg, calibrate::PRECISION) {
        bail!(
            "the default model is {}, not the Q4_1 the calibration plans it as",
            lm.precision
        );
    }
    let prompts = prompt_set(&lm)?;
    let knobs = Knobs::default();
    let budget = knobs.scheduler.max_num_batched_tokens;
    let source = calibrate::run_source("tpslab plan --calibrate", args.n_threads());
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
        let stop = AtomicBool::new(false);
        let row = calibrate::measure_level(&engine, &prompts, i, budget, &source, &stop)?;
        eprintln!(
            "calibration run, concurrency {c}: {:.1} tok/s aggregate, {:.1} per request, median TTFT {:.0} ms",
            row.aggregate_tps, row.per_request_tps, row.ttft_ms
        );
        rows.push(row);
    }
    let device = table.device(THIS_CPU)?;
    Ok(calibrate_device(table, device, rows, &source)?)
}

//! Structured output's cost on the real default model, in-process (the figures of BENCHMARKS.md
//! where the app is not built): at each concurrency the same load runs plain, then with every
//! request constrained to `assets/bench/records.schema.json` (a grammar that does not end within
//! the output length), in the same run; aggregate and per-request TPS, their ratio, and the mask
//! cost per token. Ignored by default (minutes); run it with
//! `cargo test -j 1 -p tpslab-engine --test constraint_bench -- --ignored --nocapture`
//! (the test profile builds the engine and its dependencies at opt-level 3).
//! `TPSLAB_BENCH_LEVELS=1,16,64` and `TPSLAB_BENCH_OUTPUT=64` choose the levels and length.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use serde_json::Value;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::constraint::{Grammar, MaskStats, compiler_for, mask_stats};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};
use tpslab_engine::serving::loadgen::{
    self, ConstrainedTarget, LenDist, LoadSpec, LoadTarget, PromptSet,
};
use tpslab_engine::serving::metrics::BenchSummary;

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect()
}

fn engine(lm: &Arc<LoadedModel>, c: usize) -> EngineHandle {
    let mut knobs = Knobs::default();
    knobs.scheduler.max_num_seqs = c.max(knobs.scheduler.max_num_seqs);
    knobs.kv.budget_bytes = 512 << 20;
    let config = EngineConfig {
        threads: 0,
        knobs,
        ..EngineConfig::default()
    };
    EngineHandle::start(Arc::clone(lm), config, None).expect("engine")
}

fn level(target: &dyn LoadTarget, prompts: &PromptSet, c: usize, out: usize) -> BenchSummary {
    let spec = LoadSpec {
        concurrency: Some(c),
        rate: None,
        num_requests: c.max(4),
        prompt_len: LenDist::Fixed(64),
        output_len: LenDist::Fixed(out),
        seed: c as u64,
        priority: 0,
        submit_for_s: None,
        cut_after_s: None,
        temperature: 0.0,
    };
    let stop = AtomicBool::new(false);
    let r = loadgen::run(target, prompts, &spec, &stop, &mut |_, _| {});
    assert!(r.refused.is_empty(), "{:?}", r.refused);
    BenchSummary::from_requests(&r.timings, r.duration_s, None)
}

#[test]
#[ignore = "minutes of load; run with --ignored for BENCHMARKS.md"]
fn structured_output_cost_at_each_concurrency() {
    let p = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("model");
    let lm = Arc::new(LoadedModel::load(&p).expect("load"));
    let prompts =
        PromptSet::new(lm.raw_prompt(loadgen::PROMPT_TEXT).expect("prompt")).expect("prompts");
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../assets/bench/records.schema.json");
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("schema")).expect("json");
    let constraint = compiler_for(&lm.tokenizer)
        .expect("compiler")
        .compile(&Grammar::json_schema(schema))
        .expect("compiles");
    let out = env_list("TPSLAB_BENCH_OUTPUT", "64")[0];
    println!(
        "| concurrency | aggregate TPS plain | constrained | ratio | per-request TPS plain | constrained | ratio | mask ms (worker) | step wait ms per mask |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for c in env_list("TPSLAB_BENCH_LEVELS", "1,16,64") {
        let plain = level(&engine(&lm, c), &prompts, c, out);
        let before: MaskStats = mask_stats();
        let target = ConstrainedTarget {
            inner: engine(&lm, c),
            constraint: constraint.clone(),
        };
        let constrained = level(&target, &prompts, c, out);
        let after = mask_stats();
        let masks = (after.masks - before.masks).max(1) as f64;
        let per = |s: &BenchSummary| s.mean_per_request_tps.unwrap_or(0.0);
        println!(
            "| {c} | {:.1} | {:.1} | {:.2} | {:.1} | {:.1} | {:.2} | {:.3} | {:.3} |",
            plain.output_throughput,
            constrained.output_throughput,
            constrained.output_throughput / plain.output_throughput,
            per(&plain),
            per(&constrained),
            per(&constrained) / per(&plain).max(1e-9),
            (after.compute_ns - before.compute_ns) as f64 / masks / 1e6,
            (after.wait_ns - before.wait_ns) as f64 / masks / 1e6,
        );
        assert_eq!(
            constrained.completed, plain.completed,
            "every request finished"
        );
    }
}

//! The adaptive token budget's decisions through the scheduler's API: under a long prompt
//! beside many decodes, with the policy on, the prefill chunk a step schedules shrinks to what
//! the step-time model says keeps the decodes under the ITL target. Step times are fed in as
//! the engine reports them; nothing here reads a clock or asserts one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use tpslab_engine::sched::{
    ClientId, RequestId, SchedRequest, Scheduler, SchedulerConfig, SchedulerOutput,
};

const DECODES: usize = 8;
const LONG: RequestId = 100;

fn req(id: RequestId, len: usize, max_tokens: usize) -> SchedRequest {
    SchedRequest {
        id,
        prompt: (0..len as u32).map(|t| t % 50 + id as u32).collect(),
        max_tokens,
        priority: 0,
        client: ClientId::LOCAL,
        prompt_rows: false,
        whole_prompt: false,
    }
}

fn step(s: &mut Scheduler) -> SchedulerOutput {
    let out = s.schedule();
    let sampled: Vec<_> = (out.scheduled.iter())
        .filter(|x| x.sample)
        .map(|x| (x.id, 7))
        .collect();
    s.update(&out, &sampled);
    out
}

/// `DECODES` requests decoding, step times of `2 ms + 0.5 ms per token` reported for steps of
/// several sizes, then a 3000-token prompt arrives: the tokens of its first chunk.
fn long_prompt_chunk(adaptive: bool, itl_target_ms: u32) -> (usize, usize) {
    let config = SchedulerConfig {
        max_num_batched_tokens: 512,
        prefix_caching: false,
        adaptive_budget: adaptive,
        itl_target_ms,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config, 4096, 16).expect("valid");
    for id in 1..=DECODES as RequestId {
        s.add_request(req(id, 12, 500)).expect("queued");
    }
    // Their prompts, then a few decode steps.
    for _ in 0..3 {
        let out = step(&mut s);
        assert!(!out.is_empty());
    }
    for n in [8, 64, 16, 256, 32, 512] {
        s.record_step_time(n, 2.0 + 0.5 * n as f64);
    }
    s.add_request(req(LONG, 3000, 4)).expect("queued");
    let budget = s.step_budget();
    let out = step(&mut s);
    let decodes = (out.scheduled.iter())
        .filter(|x| x.id != LONG)
        .map(|x| x.tokens.len())
        .sum::<usize>();
    assert_eq!(decodes, DECODES, "every decode keeps its token");
    let chunk = (out.scheduled.iter())
        .find(|x| x.id == LONG)
        .map_or(0, |x| x.tokens.len());
    assert_eq!(out.num_batched_tokens, decodes + chunk);
    assert!(out.num_batched_tokens <= budget);
    (chunk, budget)
}

#[test]
fn with_the_adaptive_budget_the_prefill_chunk_shrinks_beside_decodes() {
    let (off, off_budget) = long_prompt_chunk(false, 50);
    assert_eq!(off_budget, 512);
    assert_eq!(off, 512 - DECODES, "off: the chunk takes the whole budget");
    // 2 + 0.5 n <= 20 ms  =>  36 tokens a step: 8 decodes and a 28-token chunk.
    let (on, on_budget) = long_prompt_chunk(true, 20);
    assert_eq!(on_budget, 36);
    assert_eq!(on, 36 - DECODES);
    assert!(on < off);
    // A looser target lets a bigger chunk through; a target no step can meet still leaves
    // each decode its token and one block of prefill.
    let (looser, _) = long_prompt_chunk(true, 100);
    assert_eq!(looser, 196 - DECODES);
    let (tightest, budget) = long_prompt_chunk(true, 1);
    assert_eq!(budget, DECODES + 16);
    assert_eq!(tightest, 16);
}

#[test]
fn without_decodes_or_a_fitted_model_the_budget_is_the_cap() {
    let config = SchedulerConfig {
        max_num_batched_tokens: 512,
        adaptive_budget: true,
        itl_target_ms: 20,
        ..SchedulerConfig::default()
    };
    let mut s = Scheduler::new(config.clone(), 4096, 16).expect("valid");
    s.add_request(req(1, 3000, 4)).expect("queued");
    // No step time seen yet: nothing to size by.
    assert_eq!(s.step_budget(), 512);
    for n in [8, 64, 16, 256] {
        s.record_step_time(n, 2.0 + 0.5 * n as f64);
    }
    // A prompt alone has no decode to protect: the whole budget goes to it.
    assert_eq!(step(&mut s).num_batched_tokens, 512);
    // An ITL target of 0 is refused.
    let bad = SchedulerConfig {
        itl_target_ms: 0,
        ..config
    };
    assert!(Scheduler::new(bad.clone(), 4096, 16).is_err());
    assert!(s.set_config(bad).is_err());
}

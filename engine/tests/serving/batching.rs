//! Continuous batching on the real model: greedy outputs are bit-identical whether a request runs
//! alone or inside any batch mix, under knob settings that force chunked prefill, preemption
//! (tiny KV pool), small batches and prefix-cache hits; and a soak run with random cancels ends
//! with every request accounted for and the KV pool whole.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tpslab_engine::kv::KvTypes;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::sched::stop::{FinishReason, StopCriteria};
use tpslab_engine::sched::{Policy, SchedulerConfig};
use tpslab_engine::serving::engine::{
    EngineConfig, EngineHandle, Event, Knobs, KvSettings, Request,
};
use tpslab_engine::serving::logprobs::TokenLogprob;

use crate::default_model;
use default_model::model;

const PROMPTS: [&str; 6] = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village at the edge of a great forest, there lived",
    "List three colors: red,",
    "The capital of France is a city that",
    "Water boils at a temperature of 100 degrees Celsius at sea level. At higher altitudes,",
];
const MAX_TOKENS: usize = 10;

fn request(lm: &LoadedModel, text: &str, priority: i32) -> Request {
    Request {
        prompt: lm.raw_prompt(text).expect("tokenize"),
        stop: StopCriteria {
            max_tokens: Some(MAX_TOKENS),
            ignore_eos: true,
            ..Default::default()
        },
        priority,
        ..Default::default()
    }
}

/// Submits all prompts at once and collects each one's tokens (in prompt order).
fn run_all(engine: &EngineHandle, lm: &LoadedModel, texts: &[&str]) -> Vec<Vec<u32>> {
    run_scored(engine, lm, texts, texts.len()).0
}

/// As [`run_all`], the prompts from `scored_from` on asking for their prompt's
/// log-probabilities (2 alternatives), which come back second, by request.
fn run_scored(
    engine: &EngineHandle,
    lm: &LoadedModel,
    texts: &[&str],
    scored_from: usize,
) -> (Vec<Vec<u32>>, Vec<Option<Vec<TokenLogprob>>>) {
    let (tx, rx) = mpsc::channel();
    let ids: Vec<u64> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut r = request(lm, t, (i % 3) as i32);
            r.prompt_logprobs = (i >= scored_from).then_some(2);
            engine.submit(r, tx.clone())
        })
        .collect();
    let mut scored: HashMap<u64, Vec<TokenLogprob>> = HashMap::new();
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut done = 0;
    while done < ids.len() {
        match rx
            .recv_timeout(Duration::from_secs(300))
            .expect("engine answers")
        {
            Event::Token { id, token, .. } => out.entry(id).or_default().push(token),
            Event::Finished { reason, .. } => {
                assert_eq!(reason, FinishReason::Length);
                done += 1;
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::PromptLogprobs {
                id,
                prompt,
                logprobs,
            } => {
                assert!(
                    !out.contains_key(&id),
                    "prompt log-probabilities come first"
                );
                assert_eq!(prompt.len(), logprobs.len() + 1);
                assert!(scored.insert(id, logprobs).is_none(), "sent once");
            }
            Event::Started { .. } | Event::Embedding { .. } => {}
        }
    }
    let tokens = ids
        .iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect();
    (tokens, ids.iter().map(|id| scored.remove(id)).collect())
}

/// An engine on the default model with `knobs`, 2 threads (the embedding tests share it).
pub(crate) fn engine(knobs: Knobs) -> EngineHandle {
    EngineHandle::start(
        model(),
        EngineConfig {
            threads: 2,
            knobs,
            ..EngineConfig::default()
        },
        None,
    )
    .expect("engine")
}

fn kv_blocks(budget: &KvSettings) -> usize {
    KvTypes::F16.blocks_for_budget(&model().model.cfg, budget.block_size, budget.budget_bytes)
}

#[test]
fn greedy_tokens_are_identical_alone_and_in_any_batch_mix() {
    let lm = model();
    let alone_engine = engine(Knobs::default());
    let (alone, alone_scored): (Vec<Vec<u32>>, Vec<Vec<TokenLogprob>>) = PROMPTS
        .iter()
        .map(|t| {
            let (mut tokens, mut scored) = run_scored(&alone_engine, &lm, &[t], 0);
            (tokens.remove(0), scored.remove(0).expect("prompt scored"))
        })
        .unzip();
    assert!(alone.iter().all(|o| o.len() == MAX_TOKENS));
    drop(alone_engine);

    let per_block = KvTypes::F16.bytes_per_block(&lm.model.cfg, 4);
    let sched = |f: &dyn Fn(&mut SchedulerConfig)| {
        let mut c = SchedulerConfig::default();
        f(&mut c);
        c
    };
    let settings: Vec<(&str, Knobs)> = vec![
        ("default", Knobs::default()),
        (
            "tiny token budget, chunked prefill",
            Knobs {
                scheduler: sched(&|c| c.max_num_batched_tokens = 7),
                ..Knobs::default()
            },
        ),
        (
            "two sequences at a time, priority policy",
            Knobs {
                scheduler: sched(&|c| {
                    c.max_num_seqs = 2;
                    c.policy = Policy::Priority;
                }),
                ..Knobs::default()
            },
        ),
        (
            // 24 blocks of 4 tokens: the longest request alone needs 8, all together ~60.
            "tiny KV pool (preemption), block size 4, no prefix cache",
            Knobs {
                scheduler: sched(&|c| c.prefix_caching = false),
                kv: KvSettings {
                    budget_bytes: per_block * 24,
                    block_size: 4,
                    ..KvSettings::default()
                },
                ..Knobs::default()
            },
        ),
        (
            "tiny KV pool, tiny budget, no chunking of running requests' decodes",
            Knobs {
                scheduler: sched(&|c| {
                    c.max_num_batched_tokens = 32;
                    c.chunked_prefill = false;
                }),
                kv: KvSettings {
                    budget_bytes: per_block * 20,
                    block_size: 4,
                    ..KvSettings::default()
                },
                ..Knobs::default()
            },
        ),
    ];
    for (name, knobs) in settings {
        let tiny_pool = kv_blocks(&knobs.kv) < 100;
        let e = engine(knobs);
        // Each prompt twice: the repeats also exercise prefix-cache hits where caching is on,
        // and ask for their prompt's log-probabilities, which must not come from the cache:
        // every position is scored, bit-identical to the prompt alone, through chunks and
        // preemption alike.
        let texts: Vec<&str> = PROMPTS.iter().chain(PROMPTS.iter()).copied().collect();
        let (together, scored) = run_scored(&e, &lm, &texts, PROMPTS.len());
        for (i, got) in together.iter().enumerate() {
            assert_eq!(
                got,
                &alone[i % PROMPTS.len()],
                "{name}: prompt {:?}",
                texts[i]
            );
            let want = (i >= PROMPTS.len()).then(|| &alone_scored[i % PROMPTS.len()]);
            assert_eq!(scored[i].as_ref(), want, "{name}: prompt {:?}", texts[i]);
        }
        // Stats are published after each step; give the last one a moment to land.
        std::thread::sleep(Duration::from_millis(50));
        let stats = e.stats();
        if tiny_pool {
            assert!(
                stats.live.counters.preemptions > 0,
                "{name}: no preemption happened"
            );
        }
    }
}

#[test]
fn soak_with_random_cancels_loses_nothing() {
    let lm = model();
    let knobs = Knobs {
        scheduler: SchedulerConfig {
            max_num_seqs: 16,
            max_num_batched_tokens: 64,
            max_waiting: Some(64),
            ..Default::default()
        },
        kv: KvSettings {
            budget_bytes: KvTypes::F16.bytes_per_block(&lm.model.cfg, 8) * 40,
            block_size: 8,
            ..KvSettings::default()
        },
        ..Knobs::default()
    };
    let e = engine(knobs);
    let base = lm
        .raw_prompt(tpslab_engine::serving::loadgen::PROMPT_TEXT)
        .expect("tokens");
    let mut rng = StdRng::seed_from_u64(11);
    let (tx, rx) = mpsc::channel();
    let n = 500;
    let mut ended: HashMap<u64, &'static str> = HashMap::new();
    let mut ids = Vec::new();
    for i in 0..n {
        let start = rng.random_range(0..base.len() - 40);
        let len = rng.random_range(1..24);
        let req = Request {
            prompt: base[start..start + len].to_vec(),
            stop: StopCriteria {
                max_tokens: Some(rng.random_range(1..6)),
                ..Default::default()
            },
            ..Default::default()
        };
        ids.push(e.submit(req, tx.clone()));
        if rng.random_bool(0.2) {
            e.cancel(ids[rng.random_range(0..ids.len())]);
        }
        // Drain without blocking so the queue limit is sometimes hit, sometimes not.
        if i % 50 == 49 {
            std::thread::sleep(Duration::from_millis(20));
        }
        for ev in rx.try_iter() {
            record(&mut ended, ev);
        }
    }
    while ended.len() < n {
        let ev = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("every request ends");
        record(&mut ended, ev);
    }
    assert_eq!(ended.len(), n);
    let count = |k: &str| ended.values().filter(|v| **v == k).count();
    eprintln!(
        "finished {}, cancelled {}, refused {}",
        count("finished"),
        count("cancelled"),
        count("refused")
    );
    assert!(count("finished") > 0 && count("cancelled") > 0);
    std::thread::sleep(Duration::from_millis(300));
    let s = e.stats();
    assert!(s.steps > 0);
    assert_eq!(s.kv_used_blocks, 0, "KV blocks leaked");
    assert_eq!((s.running, s.waiting), (0, 0));
}

fn record(ended: &mut HashMap<u64, &'static str>, ev: Event) {
    let kind = match &ev {
        Event::Finished {
            reason: FinishReason::Abort,
            ..
        } => "cancelled",
        Event::Finished { .. } => "finished",
        Event::Refused { .. } => "refused",
        _ => return,
    };
    assert!(
        ended.insert(ev.id(), kind).is_none(),
        "request {} ended twice",
        ev.id()
    );
}

#[test]
fn kv_rebuild_while_running_loses_nothing() {
    let lm = model();
    let alone_engine = engine(Knobs::default());
    let alone: Vec<Vec<u32>> = PROMPTS
        .iter()
        .map(|t| run_all(&alone_engine, &lm, &[t]).remove(0))
        .collect();
    drop(alone_engine);

    let e = engine(Knobs::default());
    let (tx, rx) = mpsc::channel();
    let ids: Vec<u64> = PROMPTS
        .iter()
        .map(|t| e.submit(request(&lm, t, 0), tx.clone()))
        .collect();
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut done = 0;
    let mut rebuilt = false;
    while done < ids.len() {
        match rx
            .recv_timeout(Duration::from_secs(300))
            .expect("engine answers")
        {
            Event::Token { id, token, .. } => {
                out.entry(id).or_default().push(token);
                // Mid-generation: a new pool with another block size; running requests are
                // recomputed in it.
                if !rebuilt && out.values().map(Vec::len).sum::<usize>() >= 8 {
                    e.set_knobs(Knobs {
                        kv: KvSettings {
                            budget_bytes: 64 << 20,
                            block_size: 8,
                            ..KvSettings::default()
                        },
                        ..Knobs::default()
                    });
                    rebuilt = true;
                }
            }
            Event::Finished { reason, .. } => {
                assert_eq!(reason, FinishReason::Length);
                done += 1;
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
        }
    }
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(out.get(id), Some(&alone[i]), "prompt {:?}", PROMPTS[i]);
    }
    std::thread::sleep(Duration::from_millis(100));
    let s = e.stats();
    assert_eq!(
        s.knobs.kv.block_size, 8,
        "the rebuild did not take: {:?}",
        s.last_error
    );
    assert_eq!(s.kv_used_blocks, 0);
}

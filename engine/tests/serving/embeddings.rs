//! Embedding requests in the engine on the real default model: a vector pooled from a prompt's
//! states is the same whether the prompt runs alone or batched beside generating requests, in
//! chunks of a tiny token budget, or preempted out of a tiny KV pool and computed again; each
//! rule pools what it says (mean, first, last); a cancelled one sends no vector; and the prefix
//! cache never stands in for the states `mean` needs.

use std::collections::HashMap;
use std::sync::mpsc;
use std::time::Duration;

use tpslab_engine::kv::KvTypes;
use tpslab_engine::model::pooling::Pooling;
use tpslab_engine::sched::RequestId;
use tpslab_engine::sched::SchedulerConfig;
use tpslab_engine::sched::stop::{FinishReason, StopCriteria};
use tpslab_engine::serving::engine::{EngineHandle, Event, Knobs, KvSettings, Request};
use tpslab_engine::serving::sampler::SamplingParams;

use crate::batching::engine;
use crate::default_model::model;

const TEXTS: [&str; 3] = [
    "Paged attention keeps the KV cache in blocks, so memory is not wasted on padding.",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors that a search index can compare.",
];

fn embed(text: &str, rule: Pooling) -> Request {
    Request {
        prompt: model().raw_prompt(text).expect("tokenize"),
        stop: StopCriteria {
            max_tokens: Some(1),
            ..StopCriteria::default()
        },
        embed: Some(rule),
        ..Request::default()
    }
}

fn generate(text: &str, n: usize) -> Request {
    Request {
        prompt: model().raw_prompt(text).expect("tokenize"),
        sampling: SamplingParams::greedy(),
        stop: StopCriteria {
            max_tokens: Some(n),
            ignore_eos: true,
            ..StopCriteria::default()
        },
        ..Request::default()
    }
}

/// What came back for each request: its vector (if any), the tokens it generated and how it
/// ended.
#[derive(Default, Debug)]
struct Outcome {
    vector: Option<Vec<f32>>,
    tokens: usize,
    reason: Option<FinishReason>,
    prompt_tokens: usize,
}

/// Submits every request at once and waits for all to end; the requests at `cancel` are
/// cancelled right after they are submitted.
fn run(e: &EngineHandle, reqs: Vec<Request>, cancel: &[usize]) -> Vec<Outcome> {
    let (tx, rx) = mpsc::channel();
    let ids: Vec<RequestId> = reqs.into_iter().map(|r| e.submit(r, tx.clone())).collect();
    for &i in cancel {
        e.cancel(ids[i]);
    }
    let mut out: HashMap<RequestId, Outcome> = HashMap::new();
    let mut ended = 0;
    while ended < ids.len() {
        let ev = rx
            .recv_timeout(Duration::from_secs(300))
            .expect("the engine answers");
        let o = out.entry(ev.id()).or_default();
        match ev {
            Event::Embedding { vector, .. } => {
                assert!(o.vector.is_none(), "one vector per request");
                o.vector = Some(vector);
            }
            Event::Token { .. } => o.tokens += 1,
            Event::Finished { reason, usage, .. } => {
                o.reason = Some(reason);
                o.prompt_tokens = usage.prompt_tokens;
                assert_eq!(usage.completion_tokens, o.tokens);
                ended += 1;
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } => {}
        }
    }
    ids.iter()
        .map(|id| out.remove(id).unwrap_or_default())
        .collect()
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| f64::from(x) * f64::from(y))
        .sum();
    let n = |v: &[f32]| v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    dot / (n(a) * n(b))
}

#[test]
fn a_vector_is_the_same_alone_batched_chunked_and_preempted() {
    let lm = model();
    let width = lm.model.cfg.hidden;
    let alone_engine = engine(Knobs::default());
    let alone: Vec<Vec<Vec<f32>>> = Pooling::ALL
        .iter()
        .map(|&rule| {
            TEXTS
                .iter()
                .map(|t| {
                    let o = run(&alone_engine, vec![embed(t, rule)], &[]).remove(0);
                    assert_eq!(o.tokens, 0, "an embedding generates nothing");
                    assert_eq!(o.reason, Some(FinishReason::Stop));
                    assert_eq!(o.prompt_tokens, lm.raw_prompt(t).expect("tokenize").len());
                    let v = o.vector.expect("a vector");
                    assert_eq!(v.len(), width);
                    let norm: f64 = v.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
                    assert!((norm - 1.0).abs() < 1e-5, "unit length: {norm}");
                    v
                })
                .collect()
        })
        .collect();
    // The rules pool different states: mean, first and last vectors of one text differ.
    for t in 0..TEXTS.len() {
        for (a, b) in [(0, 1), (0, 2), (1, 2)] {
            let c = cosine(&alone[a][t], &alone[b][t]);
            assert!(
                c < 0.999,
                "text {t}: rules {a} and {b} give one vector ({c})"
            );
        }
    }
    drop(alone_engine);

    let per_block = KvTypes::F16.bytes_per_block(&lm.model.cfg, 4);
    let settings = [
        ("default", Knobs::default()),
        ("tiny token budget (chunks of 5)", {
            let mut k = Knobs::default();
            k.scheduler = SchedulerConfig {
                max_num_batched_tokens: 5,
                ..SchedulerConfig::default()
            };
            k
        }),
        ("tiny KV pool (preemption)", {
            let mut k = Knobs::default();
            k.kv = KvSettings {
                budget_bytes: per_block * 24,
                block_size: 4,
                ..KvSettings::default()
            };
            k
        }),
    ];
    for (name, knobs) in settings {
        let e = engine(knobs);
        // Every text under every rule, each beside a generating request, all at once; then the
        // same again (the prefix cache now holds the prompts).
        for round in 0..2 {
            let mut reqs = Vec::new();
            for rule in Pooling::ALL {
                for t in TEXTS {
                    reqs.push(embed(t, rule));
                    reqs.push(generate(t, 12));
                }
            }
            let out = run(&e, reqs, &[]);
            for (r, rule) in Pooling::ALL.iter().enumerate() {
                for t in 0..TEXTS.len() {
                    let o = &out[2 * (r * TEXTS.len() + t)];
                    let v = o.vector.as_ref().expect("a vector");
                    let c = cosine(v, &alone[r][t]);
                    assert!(
                        c > 1.0 - 1e-6,
                        "{name}, round {round}, {rule}, text {t}: cosine {c} to the vector alone"
                    );
                    let g = &out[2 * (r * TEXTS.len() + t) + 1];
                    assert_eq!(g.tokens, 12, "{name}: the generating request ran whole");
                    assert!(g.vector.is_none());
                }
            }
        }
    }
}

#[test]
fn a_cancelled_embedding_sends_no_vector() {
    // Chunks of 16 tokens: the long prompt takes dozens of steps, so the cancel lands in them.
    let mut knobs = Knobs::default();
    knobs.scheduler.max_num_batched_tokens = 16;
    let e = engine(knobs);
    let long = TEXTS.join(" ").repeat(20);
    let out = run(
        &e,
        vec![embed(&long, Pooling::Mean), embed(TEXTS[1], Pooling::Last)],
        &[0],
    );
    assert_eq!(out[0].reason, Some(FinishReason::Abort));
    assert!(out[0].vector.is_none());
    assert!(out[1].vector.is_some(), "the other request is untouched");
}

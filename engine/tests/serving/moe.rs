//! Mixtures of experts on the CPU device, end to end through the model forward: the tiny random
//! `qwen3moe`, `mixtral` and `gpt-oss` files of `model::tiny` load, and a sequence's logits are
//! the same bits alone as inside a batch of other sequences (prefill and decode mixed), so a
//! token's experts and output never depend on its batch mates. The step reports the share of
//! expert bytes it read. Through the engine (continuous batching, chunked prefill, a KV pool so
//! small that requests are preempted and recomputed) every request's greedy tokens are the ones
//! it gets alone, and the engine's live figures carry what each step read of the experts.
//! Hostile expert counts and gpt-oss keys are refused by name.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use tpslab_engine::device::Workspace;
use tpslab_engine::formats::gguf::Value;
use tpslab_engine::kv::{Batch, KvCache, KvTypes};
use tpslab_engine::model::precision::Precision;
use tpslab_engine::model::synthetic::synthetic_tokenizer;
use tpslab_engine::model::tiny::write_tiny;
use tpslab_engine::model::{LoadedModel, Model};
use tpslab_engine::sched::SchedulerConfig;
use tpslab_engine::sched::stop::{FinishReason, StopCriteria};
use tpslab_engine::serving::engine::{
    EngineConfig, EngineHandle, Event, Knobs, KvSettings, Request,
};
use tpslab_engine::serving::metrics::LiveSnapshot;
use tpslab_engine::text::chat::ChatTemplate;
use tpslab_kernels::{ThreadPool, WType};

use crate::temp_dir;
use temp_dir::TempDir;

/// The variants with experts.
const MOE: [&str; 3] = ["qwen3moe", "mixtral", "gpt-oss"];

const VOCAB: usize = 300;

/// A tokenizer of `VOCAB` placeholder tokens: the model forward needs only its size.
fn tokenizer() -> Vec<(String, Value)> {
    let tokens = (0..VOCAB).map(|i| Value::String(format!("t{i}"))).collect();
    vec![
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
    ]
}

fn tiny(variant: &str) -> (TempDir, Model) {
    let dir = TempDir::new(&format!("moe-{variant}"));
    let path = dir.0.join("m.gguf");
    write_tiny(variant, &tokenizer(), &path).unwrap();
    let (m, _) = Model::load(&path).unwrap_or_else(|e| panic!("{variant}: {e}"));
    (dir, m)
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) % VOCAB as u32)
        .collect()
}

/// Prefill then three decode steps of `seqs`, run together in one batch per step; returns each
/// sequence's logits rows (one per step) and the expert-byte share of every step.
fn run(model: &Model, seqs: &[Vec<u32>]) -> (Vec<Vec<Vec<f32>>>, Vec<f64>) {
    let pool = ThreadPool::new(2);
    let per = 4;
    let mut kv = KvCache::new(&model.cfg, 16, per * seqs.len()).unwrap();
    let mut ws = Workspace::default();
    let mut out = vec![Vec::new(); seqs.len()];
    let mut shares = Vec::new();
    let mut pos = vec![0; seqs.len()];
    let mut feed: Vec<Vec<u32>> = seqs.to_vec();
    for _ in 0..4 {
        let mut batch = Batch::default();
        for (s, f) in feed.iter().enumerate() {
            let table = (0..per as u32).map(|b| s as u32 * per as u32 + b).collect();
            batch.push_seq(table, pos[s], f, true);
        }
        let logits = model.forward(&pool, &batch, &mut kv, &mut ws).unwrap();
        for (s, row) in logits.chunks(model.cfg.vocab).enumerate() {
            out[s].push(row.to_vec());
            pos[s] += feed[s].len();
            let next = row
                .iter()
                .enumerate()
                .fold(0, |b, (i, &x)| if x > row[b] { i } else { b });
            feed[s] = vec![next as u32];
        }
        shares.push(
            ws.experts
                .share()
                .expect("a mixture of experts reports its load"),
        );
    }
    (out, shares)
}

#[test]
fn a_sequence_computes_the_same_bits_alone_and_in_a_batch() {
    for variant in MOE {
        let (_dir, model) = tiny(variant);
        let seqs = [prompt(1, 9), prompt(2, 3), prompt(3, 17), prompt(4, 1)];
        let (together, shares) = run(&model, &seqs);
        for (s, seq) in seqs.iter().enumerate() {
            let (alone, _) = run(&model, std::slice::from_ref(seq));
            assert!(
                alone[0] == together[s],
                "{variant}: sequence {s} differs in a batch"
            );
        }
        assert!(shares.iter().all(|&f| f > 0.0 && f <= 1.0), "{shares:?}");
        // A one-token decode of one sequence reads only its routed experts.
        let (_, one) = run(&model, &[prompt(5, 1)]);
        let m = model.cfg.extras.moe.unwrap();
        let want = m.router.n_used as f64 / m.n_expert as f64;
        assert!(
            (one[0] - want).abs() < 1e-9,
            "{variant}: {} vs {want}",
            one[0]
        );
    }
}

/// The tiny model as the engine holds it: the file's weights, a byte-level tokenizer of its
/// vocabulary size (prompts are token ids here).
fn loaded(variant: &str) -> (TempDir, Arc<LoadedModel>) {
    let (dir, model) = tiny(variant);
    let lm = LoadedModel {
        path: dir.0.join("m.gguf"),
        precision: Precision::built(&model.cfg, WType::F32),
        tokenizer: synthetic_tokenizer(model.cfg.vocab).unwrap(),
        template: ChatTemplate::chatml(),
        model,
    };
    (dir, Arc::new(lm))
}

const MAX_TOKENS: usize = 8;

/// Submits every prompt at once; each one's greedy tokens, in prompt order, and the engine's
/// preemption count.
fn serve(lm: &Arc<LoadedModel>, knobs: Knobs, prompts: &[Vec<u32>]) -> (Vec<Vec<u32>>, u64) {
    let (tokens, live) = serve_live(lm, knobs, prompts);
    (tokens, live.counters.preemptions)
}

/// [`serve`], with the engine's live figures once every request has ended.
fn serve_live(
    lm: &Arc<LoadedModel>,
    knobs: Knobs,
    prompts: &[Vec<u32>],
) -> (Vec<Vec<u32>>, LiveSnapshot) {
    let engine = EngineHandle::start(
        Arc::clone(lm),
        EngineConfig {
            threads: 2,
            knobs,
            ..EngineConfig::default()
        },
        None,
    )
    .expect("engine");
    let (tx, rx) = mpsc::channel();
    let ids: Vec<u64> = prompts
        .iter()
        .map(|p| {
            let req = Request {
                prompt: p.clone(),
                stop: StopCriteria {
                    max_tokens: Some(MAX_TOKENS),
                    ignore_eos: true,
                    ..Default::default()
                },
                ..Default::default()
            };
            engine.submit(req, tx.clone())
        })
        .collect();
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut done = 0;
    while done < ids.len() {
        match rx.recv_timeout(Duration::from_secs(120)).expect("answers") {
            Event::Token { id, token, .. } => out.entry(id).or_default().push(token),
            Event::Finished { reason, .. } => {
                assert_eq!(reason, FinishReason::Length);
                done += 1;
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
        }
    }
    // Stats are published after each step; give the last one a moment to land.
    std::thread::sleep(Duration::from_millis(50));
    let live = engine.stats().live;
    let tokens = ids.iter().map(|id| out.remove(id).unwrap_or_default());
    (tokens.collect(), live)
}

/// What the steps read of the experts, as the engine counts it: a decode step of one request
/// reads exactly the 4 experts of 8 its token chose in each layer (the tiny qwen3moe's experts
/// are all the same size, so half the bytes), the step's tokens per expert add up to 4 per
/// token and layer, and six requests batched read a larger share than one alone. A dense model
/// counts nothing.
#[test]
fn the_engine_counts_the_expert_weights_each_step_reads() {
    let (_dir, lm) = loaded("qwen3moe");
    let (_, alone) = serve_live(&lm, Knobs::default(), &[prompt(1, 9)]);
    let last = alone.latest_step.as_ref().expect("a step");
    assert_eq!(last.batch_size, 1);
    assert_eq!(last.expert_share, Some(0.5), "{last:?}");
    let load = alone.experts.as_ref().expect("the latest step's load");
    assert_eq!(load.layers as usize, lm.model.cfg.n_layers, "{load:?}");
    assert_eq!(load.tokens_per_expert.len(), 8);
    assert_eq!(load.tokens_per_expert.iter().sum::<u32>(), 4 * load.layers);
    let alone_share = alone.counters.expert_share().expect("a run share");
    assert!((0.5..1.0).contains(&alone_share), "{:?}", alone.counters);

    let prompts: Vec<Vec<u32>> = (1..=6).map(|seed| prompt(seed, 5)).collect();
    let (_, together) = serve_live(&lm, Knobs::default(), &prompts);
    let together_share = together.counters.expert_share().expect("a run share");
    assert!(
        together_share > alone_share && together_share <= 1.0,
        "six requests read {together_share}, one {alone_share}"
    );

    let (_dense_dir, dense) = loaded("qwen3");
    let (_, live) = serve_live(&dense, Knobs::default(), &[prompt(1, 9)]);
    assert_eq!(live.experts, None);
    assert_eq!(live.counters.expert_share(), None);
    assert_eq!(live.latest_step.and_then(|s| s.expert_share), None);
}

/// Continuous batching on the mixtures of experts: each request's greedy tokens are the same
/// alone, in one batch with the others, with a token budget that chunks every prefill, and with
/// a KV pool of 12 blocks of 4 tokens (each request alone needs at most 8, all together
/// about 40), which preempts requests and recomputes them.
#[test]
fn greedy_tokens_are_the_same_alone_batched_chunked_and_preempted() {
    let prompts: Vec<Vec<u32>> = [(1, 9), (2, 3), (3, 17), (4, 1), (5, 22), (6, 5)]
        .iter()
        .map(|&(seed, n)| prompt(seed, n))
        .collect();
    for variant in MOE {
        let (_dir, lm) = loaded(variant);
        let alone: Vec<Vec<u32>> = prompts
            .iter()
            .map(|p| {
                serve(&lm, Knobs::default(), std::slice::from_ref(p))
                    .0
                    .remove(0)
            })
            .collect();
        assert!(alone.iter().all(|t| t.len() == MAX_TOKENS), "{variant}");
        let per_block = KvTypes::F16.bytes_per_block(&lm.model.cfg, 4);
        let settings = [
            ("one batch", Knobs::default(), false),
            (
                "chunked prefill",
                Knobs {
                    scheduler: SchedulerConfig {
                        max_num_batched_tokens: 7,
                        ..SchedulerConfig::default()
                    },
                    ..Knobs::default()
                },
                false,
            ),
            (
                "preemption",
                Knobs {
                    scheduler: SchedulerConfig {
                        prefix_caching: false,
                        ..SchedulerConfig::default()
                    },
                    kv: KvSettings {
                        budget_bytes: per_block * 12,
                        block_size: 4,
                        ..KvSettings::default()
                    },
                    ..Knobs::default()
                },
                true,
            ),
        ];
        for (name, knobs, preempts) in settings {
            let (together, preempted) = serve(&lm, knobs, &prompts);
            assert_eq!(together, alone, "{variant}, {name}");
            if preempts {
                assert!(preempted > 0, "{variant}: no request was preempted");
            }
        }
    }
}

/// gpt-oss's keys that size or shape the model, hostile: a missing or zero window, expert
/// width or expert count, a window pattern of the wrong length.
#[test]
fn hostile_gpt_oss_keys_are_refused_by_name() {
    use tpslab_engine::formats::gguf::GgufFile;
    use tpslab_engine::formats::gguf_write::copy_with_metadata;
    use tpslab_engine::model::config::ModelConfig;
    let (dir, _) = tiny("gpt-oss");
    let src = dir.0.join("m.gguf");
    for (i, (key, v, what)) in [
        (
            "gpt-oss.attention.sliding_window",
            Value::U32(0),
            "sliding_window",
        ),
        (
            "gpt-oss.expert_feed_forward_length",
            Value::U32(0),
            "expert_feed_forward_length",
        ),
        (
            "gpt-oss.expert_feed_forward_length",
            Value::U32(1 << 30),
            "expert_feed_forward_length",
        ),
        ("gpt-oss.expert_count", Value::U32(0), "expert_count"),
        (
            "gpt-oss.attention.sliding_window_pattern",
            Value::Array(vec![Value::Bool(true)]),
            "sliding_window_pattern",
        ),
        (
            "gpt-oss.rope.freq_base_swa",
            Value::F32(f32::NAN),
            "freq_base_swa",
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let bad = dir.0.join(format!("bad{i}.gguf"));
        copy_with_metadata(&src, &bad, &[(key.to_string(), v.clone())]).unwrap();
        let f = GgufFile::open(&bad).unwrap();
        let err = ModelConfig::from_gguf(&f).expect_err(key).to_string();
        assert!(err.contains(what), "{key} = {v:?}: {err}");
    }
    // A file without its sinks or a bias llama.cpp requires is refused naming the tensor.
    let f = GgufFile::open(&src).unwrap();
    let md: Vec<(String, Value)> = f
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for missing in [
        "blk.1.attn_sinks.weight",
        "blk.0.ffn_down_exps.bias",
        "blk.2.attn_q.bias",
    ] {
        let tensors: Vec<_> = f
            .tensors
            .iter()
            .filter(|t| t.name != missing)
            .map(|t| {
                let desc = tpslab_engine::formats::gguf_write::TensorDesc::new(
                    t.name.clone(),
                    t.dims.clone(),
                    t.ty,
                );
                (desc, f.read_tensor(t).unwrap())
            })
            .collect();
        let bad = dir.0.join("missing.gguf");
        let out = std::fs::File::create(&bad).unwrap();
        tpslab_engine::formats::gguf_write::write_gguf(std::io::BufWriter::new(out), &md, &tensors)
            .unwrap();
        let err = Model::load(&bad).err().expect("refused").to_string();
        assert!(err.contains(missing), "{missing}: {err}");
    }
}

#[test]
fn a_hostile_expert_count_is_refused_by_name() {
    use tpslab_engine::formats::gguf_write::write_gguf;
    let (dir, _) = tiny("qwen3moe");
    let src = tpslab_engine::formats::gguf::GgufFile::open(dir.0.join("m.gguf")).unwrap();
    for (key, v, what) in [
        ("qwen3moe.expert_count", Value::U32(1 << 20), "expert_count"),
        (
            "qwen3moe.expert_used_count",
            Value::U32(9),
            "expert_used_count",
        ),
        (
            "qwen3moe.expert_used_count",
            Value::U32(0),
            "expert_used_count",
        ),
        ("qwen3moe.expert_count", Value::U32(0), "expert_count"),
    ] {
        let md: Vec<(String, Value)> = src
            .metadata
            .iter()
            .map(|(k, old)| (k.clone(), if k == key { v.clone() } else { old.clone() }))
            .collect();
        let path = dir.0.join("bad.gguf");
        let f = std::fs::File::create(&path).unwrap();
        // No tensors: the configuration must refuse before any is looked at.
        write_gguf(std::io::BufWriter::new(f), &md, &[]).unwrap();
        let err = Model::load(&path).err().expect("refused").to_string();
        assert!(err.contains(what), "{key} = {v:?}: {err}");
    }
}

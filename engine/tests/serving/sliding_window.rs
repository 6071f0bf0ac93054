//! Sliding-window attention in the paged KV cache (a model whose every layer slides, as
//! Mistral's files set it): blocks that have left the window are freed as the sequence
//! advances, as vLLM does, the pool's bookkeeping stays whole, and what the engine generates
//! is exactly what a forward pass that keeps every block computes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::llamacpp;

use std::sync::{Arc, mpsc};
use std::time::Duration;

use tpslab_engine::device::Workspace;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::tiny::{WINDOW, tokenizer_of, write_tiny};
use tpslab_engine::sched::stop::StopCriteria;
use tpslab_engine::sched::{ClientId, SchedRequest, Scheduler, SchedulerConfig};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Event, Request};
use tpslab_kernels::ThreadPool;

const BS: usize = 16;

fn mistral() -> LoadedModel {
    let dir = std::env::temp_dir().join(format!("tpslab-swa-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mistral.gguf");
    let tokenizer = tokenizer_of(&llamacpp::vocab("llama-spm")).unwrap();
    write_tiny("mistral", &tokenizer, &path).unwrap();
    let lm = LoadedModel::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    lm
}

/// Held blocks stay bounded by the window (plus the softmax block the kernel reads whole, the
/// block being filled and the one being recomputed) however long the sequence gets; finishing
/// frees the rest, and every release went through the pool's own checks.
#[test]
fn blocks_that_leave_the_window_are_freed() {
    let window = 40;
    let mut s = Scheduler::new(SchedulerConfig::default(), 64, BS).unwrap();
    s.set_window(Some(window));
    s.add_request(SchedRequest {
        id: 1,
        prompt: (0..100).collect(),
        max_tokens: 500,
        priority: 0,
        client: ClientId::LOCAL,
        prompt_rows: false,
        whole_prompt: false,
    })
    .unwrap();
    let bound = (window + 2 * tpslab_kernels::attn::BLOCK).div_ceil(BS) + 2;
    let mut most = 0;
    for step in 0..400 {
        let out = s.schedule();
        assert_eq!(out.scheduled.len(), 1, "step {step}");
        s.update(&out, &[(1, 7)]);
        let (used, _) = s.kv().usage();
        most = most.max(used);
        assert!(
            used <= bound,
            "step {step}: {used} blocks held, bound {bound}"
        );
        s.kv().pool().check().unwrap();
    }
    assert!(most >= window / BS, "the window's blocks are held");
    s.finish(&[1], tpslab_engine::sched::stop::FinishReason::Abort);
    assert_eq!(s.kv().usage().0, 0);
    s.kv().pool().check().unwrap();
}

/// Greedy tokens from the engine (which frees blocks as they leave the window) equal a plain
/// forward loop over a cache that keeps them all, past several windows.
#[test]
fn freeing_blocks_changes_nothing_the_model_computes() {
    let lm = Arc::new(mistral());
    let cfg = &lm.model.cfg;
    assert_eq!(cfg.full_window(), Some(WINDOW as usize));
    let prompt: Vec<u32> = lm
        .raw_prompt("It is a truth universally acknowledged")
        .unwrap();
    let steps = 120;

    let pool = ThreadPool::new(2);
    let blocks = (prompt.len() + steps).div_ceil(BS);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut kv = KvCache::new(cfg, BS, blocks).unwrap();
    let mut ws = Workspace::default();
    let (mut pos, mut feed, mut want) = (0, prompt.clone(), Vec::new());
    for _ in 0..steps {
        let mut b = Batch::default();
        b.push_seq(table.clone(), pos, &feed, true);
        let logits = lm.model.forward(&pool, &b, &mut kv, &mut ws).unwrap();
        let next = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        pos += feed.len();
        feed = vec![next];
        want.push(next);
    }

    let engine = EngineHandle::start(
        Arc::clone(&lm),
        EngineConfig {
            threads: 2,
            ..EngineConfig::default()
        },
        None,
    )
    .unwrap();
    let (tx, rx) = mpsc::channel();
    let req = Request {
        prompt,
        stop: StopCriteria {
            max_tokens: Some(steps),
            ignore_eos: true,
            ..Default::default()
        },
        ..Default::default()
    };
    engine.submit(req, tx);
    let mut got = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_secs(120)).unwrap() {
            Event::Token { token, .. } => got.push(token),
            Event::Finished { .. } => break,
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
        }
    }
    assert_eq!(got, want);
}

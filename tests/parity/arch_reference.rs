//! Each architecture held against llama.cpp: the tiny random model of every variant of
//! `tpslab_engine::model::tiny` (F32 weights, the tokenizer of one of llama.cpp's vocabulary
//! files) is written here byte for byte as `tests/reference/make_arch_refs.py` wrote it for
//! llama.cpp, and the engine must give
//! - the same greedy tokens over 32 steps from the recorded prompt ids,
//! - the same log-probabilities of llama.cpp's top-5 tokens at every step, within 5e-3 nats
//!   (both keep K/V in f16, llama.cpp the attention's queries too, and they sum in different
//!   orders; F32 weights),
//! - the same perplexity over the bundled text at a context of 128, within 1e-3 relative.
//!
//! The mixtures of experts (`qwen3moe`, `mixtral`: a `llama` file with expert tensors, and
//! `gpt-oss`: experts with biases, attention sinks, alternating sliding windows, YaRN,
//! GPT-2's vocabulary as llama.cpp ships no o200k one) are held to the same bounds: their
//! routing picks the same experts as llama.cpp's at every token or the greedy tokens and
//! perplexity would part. Every weight is F32 here, gpt-oss's experts too
//! (`tiny::write_tiny_f32`): with MXFP4 experts both engines quantize the experts' inputs to
//! Q8_0, and on a random router that rounding flips expert choices (llama.cpp's own answer
//! moves by 0.02 nats between the MXFP4 file and its F32 dequantization, ours by 0.1), so
//! that file cannot tell a wrong graph from rounding.
//!
//! The references (tests/data/arch_refs.json, moe_refs.json) come from llama.cpp built from the pinned sdist;
//! this test needs neither llama.cpp nor Python.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::llamacpp;

use std::path::PathBuf;

use serde_json::Value;
use tpslab_engine::device::Workspace;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::tiny::{tokenizer_of, write_tiny_f32};
use tpslab_engine::serving::perplexity::{BUNDLED_TEXT, perplexity};
use tpslab_kernels::ThreadPool;

const REFS: &str = include_str!("../data/arch_refs.json");
/// The mixture-of-experts variants' references (`make_arch_refs.py --moe`).
const MOE_REFS: &str = include_str!("../data/moe_refs.json");
/// Log-probability tolerance (nats).
const LOGPROB_TOL: f64 = 5e-3;
/// Perplexity tolerance (relative).
const PPL_TOL: f64 = 1e-3;

fn log_softmax(row: &[f32]) -> Vec<f64> {
    let max = row.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let sum: f64 = row.iter().map(|&x| (x as f64 - max).exp()).sum();
    row.iter().map(|&x| x as f64 - max - sum.ln()).collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn model_of(arch: &str, vocab: &str) -> (Tmp, LoadedModel) {
    let dir = std::env::temp_dir().join(format!("tpslab-arch-{arch}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{arch}.gguf"));
    let tokenizer = tokenizer_of(&llamacpp::vocab(vocab)).unwrap();
    write_tiny_f32(arch, &tokenizer, &path).unwrap();
    let lm = LoadedModel::load(&path).unwrap_or_else(|e| panic!("{arch}: {e}"));
    (Tmp(dir), lm)
}

/// Greedy decoding from the prompt, every step's log-probabilities checked against llama.cpp's
/// top-5; returns the worst difference seen, and what failed.
fn check_steps(arch: &str, lm: &LoadedModel, v: &Value, bad: &mut Vec<String>) -> f64 {
    let pool = ThreadPool::new(2);
    let cfg = &lm.model.cfg;
    let prompt: Vec<u32> = v["prompt_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let steps = v["steps"].as_array().unwrap();
    let blocks = (prompt.len() + steps.len()).div_ceil(16);
    let table: Vec<u32> = (0..blocks as u32).collect();
    let mut kv = KvCache::new(cfg, 16, blocks).unwrap();
    let mut ws = Workspace::default();
    let (mut pos, mut feed) = (0, prompt.clone());
    let mut worst = 0f64;
    for (i, step) in steps.iter().enumerate() {
        let mut batch = Batch::default();
        batch.push_seq(table.clone(), pos, &feed, true);
        let logits = lm.model.forward(&pool, &batch, &mut kv, &mut ws).unwrap();
        let lp = log_softmax(logits);
        for t in step["top"].as_array().unwrap() {
            let (id, want) = (t[0].as_u64().unwrap() as usize, t[1].as_f64().unwrap());
            let d = (lp[id] - want).abs();
            worst = worst.max(d);
            if d > LOGPROB_TOL {
                bad.push(format!(
                    "{arch} step {i}: log p({id}) = {} vs llama.cpp {want}",
                    lp[id]
                ));
            }
        }
        let next = argmax(logits);
        let want = step["id"].as_u64().unwrap() as u32;
        if next != want {
            bad.push(format!(
                "{arch} step {i}: greedy token {next} vs llama.cpp {want}"
            ));
            return worst;
        }
        pos += feed.len();
        feed = vec![next];
    }
    worst
}

/// The variants of a reference file that `keep` selects, against llama.cpp's outputs.
fn check_refs(refs: &Value, keep: impl Fn(&str) -> bool) {
    let ctx = refs["ctx"].as_u64().unwrap() as usize;
    let variants = refs["variants"].as_object().unwrap();
    let mut bad = Vec::new();
    for (arch, v) in variants.iter().filter(|(a, _)| keep(a)) {
        let (_tmp, lm) = model_of(arch, v["vocab"].as_str().unwrap());
        let worst = check_steps(arch, &lm, v, &mut bad);
        let got = perplexity(&lm, BUNDLED_TEXT, ctx, 2, None, &mut |_, _| {})
            .unwrap()
            .perplexity;
        let want = v["perplexity"].as_f64().unwrap();
        let rel = (got / want - 1.0).abs();
        eprintln!(
            "{arch}: worst log-prob difference {worst:.2e}, perplexity {got:.4} vs {want:.4} \
             (rel {rel:.1e})"
        );
        if rel > PPL_TOL {
            bad.push(format!("{arch}: perplexity {got} vs llama.cpp {want}"));
        }
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn every_architecture_computes_as_llama_cpp() {
    let refs: Value = serde_json::from_str(REFS).unwrap();
    let moe: Value = serde_json::from_str(MOE_REFS).unwrap();
    // Every variant llama.cpp runs (its family names a reference vocabulary; llama.cpp has no
    // `mistral` or `smollm`: those files say `llama`), the mixtures of experts in their own
    // file.
    for arch in tpslab_engine::model::tiny::variants() {
        let spec = tpslab_engine::model::tiny::spec(arch).unwrap();
        let (runs, is_moe) = (spec.reference_vocab.is_some(), spec.experts.is_some());
        let (dense, experts) = (refs["variants"].get(arch), moe["variants"].get(arch));
        assert_eq!(dense.is_some(), runs && !is_moe, "{arch}");
        assert_eq!(experts.is_some(), runs && is_moe, "{arch}: references");
    }
    check_refs(&refs, |_| true);
}

#[test]
fn every_mixture_of_experts_computes_as_llama_cpp() {
    check_refs(&serde_json::from_str(MOE_REFS).unwrap(), |_| true);
}

//! Synthetic weights: the known shapes, seeded determinism (whatever the thread count), every
//! precision through one forward pass to finite logits, and clear errors for unknown names.
//! Only smollm2-135m is ever built here (llama-3-8b in F16 is 16 GB).

use std::sync::Arc;

use tpslab_engine::device::Workspace;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::Model;
use tpslab_engine::model::config::RopeStyle;
use tpslab_engine::model::synthetic::{self, SyntheticError, arch, matrix_type, synthetic_weights};
use tpslab_engine::model::weights::Weights;
use tpslab_engine::quant::preset::weight_type;
use tpslab_engine::sched::stop::{FinishReason, StopCriteria};
use tpslab_engine::serving::generate::generate;
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_kernels::{ThreadPool, WType};

const ALL: [WType; 16] = WType::ALL;

/// Every byte of a weight set, in a fixed order.
fn bytes(w: &Weights) -> Vec<&[u8]> {
    let mut v = vec![w.embed.data.as_slice()];
    for l in &w.layers {
        v.extend([l.wqkv.data.as_slice(), l.wo.data.as_slice()]);
        v.extend(l.ffn.matrices().iter().map(|m| m.data.as_slice()));
    }
    v.extend(w.lm_head.iter().map(|l| l.data.as_slice()));
    v
}

#[test]
fn known_shapes() {
    let s = arch("SmolLM2-135M").expect("case-insensitive");
    let c = &s.config;
    assert_eq!(
        (
            c.hidden,
            c.ffn,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim
        ),
        (576, 1536, 30, 9, 3, 64)
    );
    assert_eq!(
        (c.vocab, c.context_len, c.rope_theta),
        (49152, 8192, 100_000.0)
    );
    assert_eq!((c.rope_style, c.rms_eps), (RopeStyle::Interleaved, 1e-5));
    assert!(s.tied_embeddings && !s.qkv_bias);

    let c = arch("llama-3-8b").expect("arch").config;
    assert_eq!(
        (
            c.hidden,
            c.ffn,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim
        ),
        (4096, 14336, 32, 32, 8, 128)
    );
    assert_eq!(
        (c.vocab, c.context_len, c.rope_theta),
        (128_256, 8192, 500_000.0)
    );
    // About 8.0B parameters with the untied output matrix.
    let params = c.n_params() + (c.vocab * c.hidden) as u64;
    assert!((8_000_000_000..8_100_000_000).contains(&params), "{params}");

    let s = arch("llama-3.2-1b").expect("arch");
    let c = &s.config;
    assert_eq!(
        (
            c.hidden,
            c.ffn,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab
        ),
        (2048, 8192, 16, 32, 8, 64, 128_256)
    );
    assert!(s.tied_embeddings);

    let s = arch("qwen2.5-0.5b").expect("arch");
    let c = &s.config;
    assert_eq!(
        (
            c.hidden,
            c.ffn,
            c.n_layers,
            c.n_heads,
            c.n_kv_heads,
            c.head_dim,
            c.vocab
        ),
        (896, 4864, 24, 14, 2, 64, 151_936)
    );
    assert_eq!(
        (c.rope_style, c.rms_eps, c.rope_theta),
        (RopeStyle::Neox, 1e-6, 1e6)
    );
    assert!(s.tied_embeddings && s.qkv_bias);
}

/// The table's SmolLM2 is the real default model's shape.
#[test]
fn smollm2_matches_the_default_model_file() {
    let path = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("default model");
    let f = tpslab_engine::formats::gguf::GgufFile::open(path).expect("open the default model");
    let real = tpslab_engine::model::config::ModelConfig::from_gguf(&f).expect("config");
    assert_eq!(arch("smollm2-135m").expect("arch").config, real);
}

/// Qwen3-30B-A3B's shape: 128 experts of width 768, 8 routed, QK-norm heads of 128 (so the
/// query width, 4096, is not the hidden size); about 30B parameters of which about 3B are
/// read per token. Its weights are not built here (17 GB at Q4_K).
#[test]
fn qwen3_30b_a3b_has_its_experts() {
    let c = arch("qwen3-30b-a3b").expect("arch").config;
    let m = c.extras.moe.expect("experts");
    assert_eq!((m.n_expert, m.router.n_used, m.ffn_exp), (128, 8, 768));
    assert_eq!((c.q_dim(), c.hidden, c.n_layers), (4096, 2048, 48));
    let n = c.n_params() as f64;
    assert!((29e9..31e9).contains(&n), "{n}");
    let h = c.hidden as f64;
    let active = n - (3.0 * h * 768.0) * 120.0 * 48.0;
    assert!((2.5e9..3.6e9).contains(&active), "{active}");
}

/// gpt-oss-20b's shape: 32 experts of 2880 with 4 routed (about 21B parameters, 3.6B read per
/// token), a 128-token window on every other layer, YaRN 32 over 4096. A copy of its spec
/// shrunk to two small layers builds and runs: biases on Q/K/V, the output, the router and
/// the experts, a sink per head, experts in MXFP4 whatever the precision asked.
#[test]
fn gpt_oss_20b_has_its_shape_and_a_small_copy_runs() {
    let s = arch("gpt-oss-20b").expect("arch");
    let c = &s.config;
    let m = c.extras.moe.expect("experts");
    assert_eq!((m.n_expert, m.router.n_used, m.ffn_exp), (32, 4, 2880));
    assert_eq!(m.router.gating, tpslab_kernels::moe::Gating::SoftmaxWeight);
    assert!(!m.router.norm);
    assert_eq!(
        (c.q_dim(), c.kv_dim(), c.hidden, c.n_layers),
        (4096, 512, 2880, 24)
    );
    assert_eq!(c.extras.window, Some(128));
    let sliding: Vec<usize> = (0..c.n_layers)
        .filter(|&i| c.extras.swa_layers[i])
        .collect();
    assert_eq!(sliding, (0..24).step_by(2).collect::<Vec<_>>());
    assert_eq!(
        c.rope_scaling,
        tpslab_engine::model::config::RopeScaling::Yarn {
            factor: 32.0,
            orig_ctx: 4096
        }
    );
    // n_params counts the embedding once (the output projection is its size again, 0.6B).
    let n = c.n_params() as f64;
    assert!((20.0e9..20.7e9).contains(&n), "{n}");
    let h = c.hidden as f64;
    let active = n - (3.0 * h * 2880.0) * 28.0 * 24.0;
    assert!((3.3e9..3.9e9).contains(&active), "{active}");

    let mut small = s.clone();
    let sc = &mut small.config;
    (
        sc.hidden,
        sc.n_layers,
        sc.n_heads,
        sc.n_kv_heads,
        sc.head_dim,
        sc.rope_dim,
    ) = (64, 2, 4, 2, 16, 16);
    sc.vocab = 300;
    sc.extras.swa_layers.truncate(2);
    sc.extras.window = Some(4);
    sc.extras.attn_scale = 0.25;
    if let Some(m) = &mut sc.extras.moe {
        (m.n_expert, m.ffn_exp, m.router.n_used) = (4, 32, 2);
    }
    let w = synthetic_weights(&small, WType::Q8_0, 3, 2).expect("weights");
    for l in &w.layers {
        assert!(l.wqkv.bias.is_some() && l.wo.bias.is_some());
        assert_eq!(l.attn_sinks.as_ref().map(Vec::len), Some(4));
        let tpslab_engine::model::weights::Ffn::Moe(moe) = &l.ffn else {
            panic!("experts");
        };
        assert!(moe.router.bias.is_some());
        for e in &moe.experts {
            assert_eq!((e.gate_up.ty, e.down.ty), (WType::MXFP4, WType::MXFP4));
            assert!(e.gate_up.bias.is_some() && e.down.bias.is_some());
        }
        assert_eq!(l.wo.ty, WType::Q8_0);
    }
    let model = Model {
        cfg: small.config.clone(),
        weights: w,
    };
    let pool = ThreadPool::new(2);
    // Past the window of 4, so the sliding layer masks.
    let tokens = [1u32, 50, 299, 7, 7, 30, 200, 3];
    let mut kv = KvCache::new(&model.cfg, 16, 1).expect("kv");
    let mut ws = Workspace::default();
    let mut b = Batch::default();
    b.push_seq(vec![0], 0, &tokens, true);
    let logits = model.forward(&pool, &b, &mut kv, &mut ws).expect("forward");
    assert_eq!(logits.len(), 300);
    assert!(logits.iter().all(|x| x.is_finite()));
    assert!(logits.iter().any(|&x| x != logits[0]), "the logits vary");
}

#[test]
fn weights_have_the_table_shapes() {
    let s = arch("smollm2-135m").expect("arch");
    let c = &s.config;
    let w = synthetic_weights(&s, WType::Q8_0, 1, 2).expect("weights");
    assert!(w.lm_head.is_none(), "tied embeddings");
    assert_eq!((w.embed.n, w.embed.k), (c.vocab, c.hidden));
    assert_eq!(w.layers.len(), c.n_layers);
    for l in &w.layers {
        assert_eq!((l.wqkv.n, l.wqkv.k), (c.hidden + 2 * c.kv_dim(), c.hidden));
        assert_eq!((l.wo.n, l.wo.k), (c.hidden, c.hidden));
        let [gate_up, down] = l.ffn.matrices()[..] else {
            panic!("a dense FFN");
        };
        assert_eq!((gate_up.n, gate_up.k), (2 * c.ffn, c.hidden));
        assert_eq!((down.n, down.k), (c.hidden, c.ffn));
        assert!(l.wqkv.bias.is_none());
        assert!(l.attn_norm.iter().chain(&l.ffn_norm).all(|&x| x == 1.0));
    }
    // Q8_0: 34 bytes per 32 weights.
    let expected = (c.n_params() as usize - c.hidden * (2 * c.n_layers + 1)) / 32 * 34;
    let matrices: usize = bytes(&w).iter().map(|b| b.len()).sum();
    assert_eq!(matrices, expected);
}

#[test]
fn same_seed_same_bytes_whatever_the_threads() {
    let s = arch("smollm2-135m").expect("arch");
    let a = synthetic_weights(&s, WType::Q4K, 42, 1).expect("weights");
    let b = synthetic_weights(&s, WType::Q4K, 42, 2).expect("weights");
    assert!(bytes(&a) == bytes(&b), "same seed gave different weights");
    let c = synthetic_weights(&s, WType::Q4K, 43, 2).expect("weights");
    for (x, y) in bytes(&a).iter().zip(bytes(&c)) {
        assert_ne!(*x, y, "a different seed gave a tensor the same bytes");
    }
    // Layers differ from each other too (no tensor seed reused).
    assert_ne!(a.layers[0].wo.data, a.layers[1].wo.data);
}

#[test]
fn every_precision_builds_and_gives_finite_logits() {
    let pool = ThreadPool::new(2);
    let s = arch("smollm2-135m").expect("arch");
    for ty in ALL {
        let weights = synthetic_weights(&s, ty, 7, 2).expect("weights");
        // K-quants fall back where rows aren't whole 256-element blocks (hidden 576).
        assert_eq!(weights.layers[0].wqkv.ty, matrix_type(ty, 576));
        assert_eq!(
            weights.layers[0].ffn.matrices()[1].ty,
            ty,
            "ffn 1536 keeps {ty:?}"
        );
        let model = Model {
            cfg: s.config.clone(),
            weights,
        };
        let tokens = [1u32, 500, 49151, 7, 7, 300];
        let mut kv = KvCache::new(&model.cfg, 16, 1).expect("kv");
        let mut ws = Workspace::default();
        let mut b = Batch::default();
        b.push_seq(vec![0], 0, &tokens, true);
        let logits = model.forward(&pool, &b, &mut kv, &mut ws).expect("forward");
        assert_eq!(logits.len(), model.cfg.vocab);
        assert!(logits.iter().all(|x| x.is_finite()), "{ty:?}: non-finite");
        let spread = logits.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(spread > 0.0, "{ty:?}: all-zero logits");
    }
}

#[test]
fn qwen_style_biases_are_built() {
    // Only the bias path is checked here: the real qwen2.5-0.5b is 0.5B weights, too big for a
    // fast test, so its spec is shrunk to two layers and a small vocabulary.
    let mut s = arch("qwen2.5-0.5b").expect("arch");
    s.config.n_layers = 2;
    s.config.vocab = 1024;
    let w = synthetic_weights(&s, WType::Q8_0, 0, 2).expect("weights");
    let bias = w.layers[0].wqkv.bias.as_ref().expect("qkv bias");
    assert_eq!(bias.len(), 896 + 2 * 128);
    assert!(bias.iter().all(|b| b.abs() < 0.05) && bias.iter().any(|&b| b != 0.0));
}

#[test]
fn unknown_names_are_refused_with_the_known_ones() {
    let e = arch("gpt-5").expect_err("unknown arch");
    assert!(matches!(e, SyntheticError::Arch { .. }));
    let msg = e.to_string();
    assert!(msg.contains("gpt-5") && msg.contains("llama-3-8b") && msg.contains("smollm2-135m"));

    let e = "q3_k_xl".parse::<WType>().expect_err("unknown precision");
    assert!(e.to_string().contains("q3_k_xl") && e.to_string().contains("q8_0"));
    assert!(LoadedModel::synthetic("nope", WType::F16, 0, 1).is_err());

    for (name, ty) in [
        ("F16", WType::F16),
        ("q8_0", WType::Q8_0),
        ("Q4_K_M", WType::Q4K),
        ("bf16", WType::BF16),
        ("Q6_K", WType::Q6K),
    ] {
        assert_eq!(weight_type(name).expect("precision"), ty);
    }
}

/// The bundle works through the engine: gibberish, but exactly the tokens asked for.
#[test]
fn loaded_synthetic_model_generates() {
    let lm = Arc::new(
        LoadedModel::synthetic("smollm2-135m", WType::Q4_0, 0, 2).expect("synthetic model"),
    );
    assert!(lm.is_synthetic());
    assert_eq!(lm.path.to_str(), Some("synthetic:smollm2-135m"));
    assert_eq!(lm.precision.to_string(), "Q4_0");
    assert_eq!(lm.tokenizer.vocab_size(), 49152);
    assert!(lm.tokenizer.stop_token_ids().is_empty());
    let prompt = lm.raw_prompt("hello").expect("bytes encode");
    assert_eq!(prompt.len(), 5);
    let prompt = synthetic::random_tokens(lm.model.cfg.vocab, 20, 1);
    let stop = StopCriteria {
        max_tokens: Some(6),
        ..StopCriteria::default()
    };
    let out = generate(
        &lm,
        2,
        &prompt,
        &SamplingParams::greedy(),
        stop,
        &mut |_| {},
    )
    .expect("generate");
    assert_eq!(out.output_token_ids.len(), 6);
    assert_eq!(out.finish_reason, FinishReason::Length);
}

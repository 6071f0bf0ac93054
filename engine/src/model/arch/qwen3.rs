//! Qwen3 and Qwen3-MoE: the Llama block with per-head Q and K norms before RoPE (read from the
//! file), NeoX-style RoPE, and for `qwen3moe` a mixture of experts in every layer, each expert
//! `expert_feed_forward_length` wide (else the FFN's share per routed expert).

use serde_json::{Map, Value as Json};

use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{PRE_NORM, QK_NORMS, default_theta, gguf_name};
use crate::model::arch::family::{ExpertRule, ExpertWidth, FamilyDef, GgufArch, HfClass, KnownShape, TinySpec, TinyValue};
use crate::model::config::RopeStyle;

pub use crate::model::arch::llama::block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[
            GgufArch {
                name: "qwen3",
                rope_style: RopeStyle::Neox,
            },
            GgufArch {
                name: "qwen3moe",
                rope_style: RopeStyle::Neox,
            },
        ]
    }


    fn experts(&self, arch: &str) -> ExpertRule {
        match arch {
            "qwen3moe" => ExpertRule {
                required: true,
                width: ExpertWidth::KeyOrShare,
                ..ExpertRule::SOFTMAX
            },
            _ => ExpertRule::SOFTMAX,
        }
    }

    fn known_shapes(&self) -> &'static [KnownShape] {
        &SHAPES
    }

    fn hf_classes(&self) -> &'static [HfClass] {
        &[HfClass {
            class: "Qwen3ForCausalLM",
            model_types: &["qwen3"],
            gguf_arch: "qwen3",
        }]
    }

    /// transformers' `Qwen3Config`: heads of 128.
    fn hf_defaults(&self, _: &HfClass, cfg: &mut HfConfig, j: &mut Map<String, Json>) {
        cfg.head_dim = cfg.head_dim.or(Some(128));
        default_theta(j, 10_000.0);
    }

    fn hf_tensor_name(&self, _: &HfClass, hf: &str) -> Option<Option<String>> {
        gguf_name(&[&PRE_NORM, &QK_NORMS], hf)
    }

    /// QK-norm with a head size that is not `hidden / heads`; Qwen3-30B-A3B routes 8 of 128
    /// experts, each narrower than the dense FFN (here 4 of 8).
    fn tiny(&self) -> &'static [TinySpec] {
        &[
            TinySpec {
                variant: "qwen3",
                reference_vocab: Some("qwen2"),
                arch: "qwen3",
                layers: 4,
                head_dim: Some(32),
                qk_norm: true,
                ..TinySpec::PLAIN
            },
            TinySpec {
                variant: "qwen3moe",
                reference_vocab: Some("qwen2"),
                arch: "qwen3moe",
                layers: 4,
                head_dim: Some(32),
                qk_norm: true,
                experts: Some((8, 4, 32)),
                expert_width_key: true,
                metadata: &[("rope.freq_base", TinyValue::F32(1_000_000.0))],
                ..TinySpec::PLAIN
            },
        ]
    }
}

/// The shapes of the real models, from their `config.json`.
const SHAPES: [KnownShape; 3] = [
    // Qwen3-30B-A3B: 128 experts of width 768, 8 routed per token (about 3B of 30B active).
    KnownShape {
        name: "qwen3-30b-a3b",
        arch: "qwen3moe",
        hidden: 2048,
        ffn: 6144,
        n_layers: 48,
        n_heads: 32,
        n_kv_heads: 4,
        head_dim: 128,
        vocab: 151_936,
        context_len: 40_960,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: false,
        experts: Some((128, 8, 768)),
        qk_norm: true,
        sinks_and_biases: false,
    },
    // Qwen3-235B-A22B: 94 layers of 4096, 64 query heads of 128 over 4 K/V heads, 128 experts
    // of width 1536 (moe_intermediate_size), 8 routed per token (about 22B of 235B active).
    KnownShape {
        name: "qwen3-235b-a22b",
        arch: "qwen3moe",
        hidden: 4096,
        ffn: 12288,
        n_layers: 94,
        n_heads: 64,
        n_kv_heads: 4,
        head_dim: 128,
        vocab: 151_936,
        context_len: 40_960,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: false,
        experts: Some((128, 8, 1536)),
        qk_norm: true,
        sinks_and_biases: false,
    },
    // Qwen3-8B (dense): 36 layers of 4096, FFN 12288, 32 heads over 8 K/V heads, untied.
    KnownShape {
        name: "qwen3-8b",
        arch: "qwen3",
        hidden: 4096,
        ffn: 12288,
        n_layers: 36,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 151_936,
        context_len: 40_960,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: false,
        experts: None,
        qk_norm: true,
        sinks_and_biases: false,
    },
];

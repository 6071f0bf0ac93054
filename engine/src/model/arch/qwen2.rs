//! Qwen2 and Qwen2.5: the Llama block with biases on Q, K and V (read from the file) and
//! NeoX-style RoPE.

use crate::model::arch::family::{FamilyDef, GgufArch, HfClass, KnownShape, TinySpec, TinyValue};
use crate::model::config::RopeStyle;

pub use crate::model::arch::llama::block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[GgufArch {
            name: "qwen2",
            rope_style: RopeStyle::Neox,
        }]
    }


    fn known_shapes(&self) -> &'static [KnownShape] {
        &SHAPES
    }

    fn hf_classes(&self) -> &'static [HfClass] {
        &[HfClass {
            class: "Qwen2ForCausalLM",
            model_types: &["qwen2"],
            gguf_arch: "qwen2",
        }]
    }

    /// Biases, with YaRN scaling (a trained context of 64, so the ramp falls inside the tiny
    /// head).
    fn tiny(&self) -> &'static [TinySpec] {
        &[TinySpec {
            variant: "qwen2",
            reference_vocab: Some("qwen2"),
            arch: "qwen2",
            qkv_bias: true,
            metadata: &[
                ("rope.freq_base", TinyValue::F32(1_000_000.0)),
                ("rope.scaling.type", TinyValue::Str("yarn")),
                ("rope.scaling.factor", TinyValue::F32(4.0)),
                ("rope.scaling.original_context_length", TinyValue::U32(64)),
            ],
            ..TinySpec::PLAIN
        }]
    }
}

/// The shapes of the real models, from their `config.json` (the 14B, 32B and 72B for the
/// planner's multi-GPU rows).
const SHAPES: [KnownShape; 4] = [
    // Qwen2.5-0.5B.
    KnownShape {
        name: "qwen2.5-0.5b",
        arch: "qwen2",
        hidden: 896,
        ffn: 4864,
        n_layers: 24,
        n_heads: 14,
        n_kv_heads: 2,
        head_dim: 64,
        vocab: 151_936,
        context_len: 32_768,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: true,
        qkv_bias: true,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
    // Qwen2.5-14B(-Instruct): 48 layers of 5120, FFN 13824, 40 heads over 8 K/V heads.
    KnownShape {
        name: "qwen2.5-14b",
        arch: "qwen2",
        hidden: 5120,
        ffn: 13824,
        n_layers: 48,
        n_heads: 40,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 152_064,
        context_len: 32_768,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: true,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
    // Qwen2.5-32B(-Instruct): 64 layers of 5120, FFN 27648, 40 heads over 8 K/V heads.
    KnownShape {
        name: "qwen2.5-32b",
        arch: "qwen2",
        hidden: 5120,
        ffn: 27648,
        n_layers: 64,
        n_heads: 40,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 152_064,
        context_len: 32_768,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: true,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
    // Qwen2.5-72B(-Instruct): 80 layers of 8192, FFN 29568, 64 heads over 8 K/V heads.
    KnownShape {
        name: "qwen2.5-72b",
        arch: "qwen2",
        hidden: 8192,
        ffn: 29568,
        n_layers: 80,
        n_heads: 64,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 152_064,
        context_len: 32_768,
        rope_theta: 1_000_000.0,
        rms_eps: 1e-6,
        tied_embeddings: false,
        qkv_bias: true,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
];

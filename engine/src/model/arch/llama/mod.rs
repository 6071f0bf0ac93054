//! The Llama family: Llama 2 and 3, Mistral (a window on every layer), SmolLM 1-2 (files that
//! say `smollm` too), and Mixtral-style mixtures of experts (`llama` files with expert
//! tensors). Its recipe is the pre-norm block the other Llama-like families run.
//!
//! Modules: this file, the family's facts; [`block`], the Llama block recipe and its loader;
//! [`hf`], its Hugging Face mapping (shared with SmolLM3, a `LlamaModel` to the converter).

use serde_json::{Map, Value as Json};

use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{Bad, Change, Md, Shape};
use crate::model::arch::family::{FamilyDef, GgufArch, HfClass, HfInput, KnownShape, TINY_FFN, TINY_WINDOW, TinySpec, TinyValue};
use crate::model::config::RopeStyle;

pub mod block;
pub mod hf;

pub use block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[
            GgufArch {
                name: "llama",
                rope_style: RopeStyle::Interleaved,
            },
            GgufArch {
                name: "mistral",
                rope_style: RopeStyle::Interleaved,
            },
            GgufArch {
                name: "smollm",
                rope_style: RopeStyle::Interleaved,
            },
        ]
    }

    fn known_shapes(&self) -> &'static [KnownShape] {
        &SHAPES
    }

    fn hf_classes(&self) -> &'static [HfClass] {
        &hf::CLASSES
    }

    fn hf_defaults(&self, _: &HfClass, cfg: &mut HfConfig, j: &mut Map<String, Json>) {
        hf::head_dim_default(cfg);
        crate::formats::hf_map::default_theta(j, 10_000.0);
    }

    fn hf_metadata(&self, c: &HfClass, md: &mut Md, x: &HfInput<'_>) -> Result<(), Bad> {
        hf::llama_model_keys(md, x)?;
        if c.class == "MistralForCausalLM" {
            hf::mistral_window(md, x.j)?;
        }
        Ok(())
    }

    fn hf_computed(&self, _: &HfClass, x: &HfInput<'_>) -> Result<Vec<(String, Vec<f32>)>, Bad> {
        hf::llama3_tensors(x)
    }

    fn hf_change(&self, _: &HfClass, name: &str, s: &Shape) -> Change {
        hf::permute(name, s)
    }

    fn tiny(&self) -> &'static [TinySpec] {
        &[
            TinySpec {
                variant: "llama",
                reference_vocab: Some("llama-bpe"),
                arch: "llama",
                rope_freqs: true,
                metadata: &[("rope.freq_base", TinyValue::F32(500_000.0))],
                ..TinySpec::PLAIN
            },
            TinySpec {
                variant: "mistral",
                arch: "mistral",
                metadata: &[
                    ("rope.freq_base", TinyValue::F32(10_000.0)),
                    ("attention.sliding_window", TinyValue::U32(TINY_WINDOW)),
                ],
                ..TinySpec::PLAIN
            },
            TinySpec {
                variant: "smollm",
                arch: "smollm",
                ..TinySpec::PLAIN
            },
            // Mixtral routes 2 of 8, each as wide as the dense FFN.
            TinySpec {
                variant: "mixtral",
                reference_vocab: Some("llama-spm"),
                arch: "llama",
                experts: Some((4, 2, TINY_FFN)),
                metadata: &[("rope.freq_base", TinyValue::F32(1_000_000.0))],
                ..TinySpec::PLAIN
            },
        ]
    }
}

/// The shapes of the real models (from their `config.json` / GGUF metadata).
const SHAPES: [KnownShape; 4] = [
    KnownShape {
        name: "smollm2-135m",
        arch: "llama",
        hidden: 576,
        ffn: 1536,
        n_layers: 30,
        n_heads: 9,
        n_kv_heads: 3,
        head_dim: 64,
        vocab: 49152,
        context_len: 8192,
        rope_theta: 100_000.0,
        rms_eps: 1e-5,
        tied_embeddings: true,
        qkv_bias: false,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
    KnownShape {
        name: "llama-3.2-1b",
        arch: "llama",
        hidden: 2048,
        ffn: 8192,
        n_layers: 16,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 64,
        vocab: 128_256,
        context_len: 131_072,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied_embeddings: true,
        qkv_bias: false,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
    KnownShape {
        name: "llama-3-8b",
        arch: "llama",
        hidden: 4096,
        ffn: 14336,
        n_layers: 32,
        n_heads: 32,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 128_256,
        context_len: 8192,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied_embeddings: false,
        qkv_bias: false,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
    // Llama-3.1-70B(-Instruct)'s config.json: 80 layers of 8192, FFN 28672, 64 query heads of
    // 128 over 8 K/V heads, vocabulary 128256, untied output (the planner's multi-GPU shape).
    KnownShape {
        name: "llama-3.1-70b",
        arch: "llama",
        hidden: 8192,
        ffn: 28672,
        n_layers: 80,
        n_heads: 64,
        n_kv_heads: 8,
        head_dim: 128,
        vocab: 128_256,
        context_len: 131_072,
        rope_theta: 500_000.0,
        rms_eps: 1e-5,
        tied_embeddings: false,
        qkv_bias: false,
        experts: None,
        qk_norm: false,
        sinks_and_biases: false,
    },
];

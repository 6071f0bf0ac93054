//! gpt-oss (llama.cpp's `LLM_ARCH_OPENAI_MOE`): its recipe ([`block`]) and what it resolves
//! from its metadata: a required window on every other layer (the first slides), the sliding
//! layers keeping the base and the YaRN scaling unless the file gives them a base of their
//! own, queries scaled by the rotated size, experts that must say their width, routed by the
//! top-k logits softmaxed; experts in MXFP4 in every released file.
//!
//! Modules: this file, the family's facts; [`block`], its recipe and loader.

use tpslab_kernels::WType;
use tpslab_kernels::moe::Gating;

use crate::formats::gguf::GgufFile;
use crate::model::arch::family::{ExpertRule, ExpertWidth, FamilyDef, GgufArch, KnownShape, TinySpec, TinyValue, TINY_WINDOW};
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeScaling, RopeStyle};
use crate::model::weights::{WeightError, Weights};

pub mod block;

pub use block::forward;

pub struct Def;

/// gpt-oss's trained context under YaRN and its scaling factor, and its window: what its
/// released files say.
const YARN: (f32, usize) = (32.0, 4096);
const WINDOW: usize = 128;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[GgufArch {
            name: "gpt-oss",
            rope_style: RopeStyle::Neox,
        }]
    }

    fn load(&self, f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
        block::load(f, cfg)
    }

    /// llama.cpp's `llama_model_openai_moe::load_arch_hparams`.
    fn extras(
        &self,
        k: &Keys<'_>,
        c: &ModelConfig,
        window: usize,
        e: &mut Extras,
    ) -> Result<(), ConfigError> {
        if window == 0 {
            return Err(ConfigError::Shape(format!(
                "{} must be set for gpt-oss",
                k.key("attention.sliding_window")
            )));
        }
        let theta_swa = k.float_or("rope.freq_base_swa", c.rope_theta, false)?;
        layers(e, c, window, k.swa_pattern(c.n_layers, 2)?, theta_swa);
        Ok(())
    }

    fn experts(&self, _: &str) -> ExpertRule {
        ExpertRule {
            required: true,
            width: ExpertWidth::Key,
            gating: Gating::SoftmaxWeight,
            norm: false,
        }
    }

    fn released_expert_type(&self) -> Option<WType> {
        Some(WType::MXFP4)
    }

    fn known_shapes(&self) -> &'static [KnownShape] {
        // gpt-oss-20b: 32 experts of width 2880, 4 routed per token (about 3.6B of 21B
        // active), 64 query heads of 64 over 8 K/V heads, biases everywhere and a sink per
        // head.
        &[KnownShape {
            name: "gpt-oss-20b",
            arch: "gpt-oss",
            hidden: 2880,
            ffn: 2880,
            n_layers: 24,
            n_heads: 64,
            n_kv_heads: 8,
            head_dim: 64,
            vocab: 201_088,
            context_len: 131_072,
            rope_theta: 150_000.0,
            rms_eps: 1e-5,
            tied_embeddings: false,
            qkv_bias: true,
            experts: Some((32, 4, 2880)),
            qk_norm: false,
            sinks_and_biases: true,
        }]
    }

    /// As [`Def::extras`] reads a released file: the even layers slide, keeping the base and
    /// the scaling.
    fn known_settings(&self, c: &mut ModelConfig) {
        let mut e = c.extras.clone();
        let swa = (0..c.n_layers).map(|i| i % 2 == 0).collect();
        layers(&mut e, c, WINDOW, swa, c.rope_theta);
        c.extras = e;
        let (factor, orig_ctx) = YARN;
        c.rope_scaling = RopeScaling::Yarn { factor, orig_ctx };
    }

    /// Biases everywhere, sinks, its window every other layer with YaRN (a trained context of
    /// 4096 in the real files; 64 here, so the ramp falls inside the tiny head), gpt-oss-20b's
    /// routing of 4 experts (of 8 here).
    fn tiny(&self) -> &'static [TinySpec] {
        &[TinySpec {
            variant: "gpt-oss",
            // llama.cpp ships no o200k (gpt-oss) vocabulary: GPT-2's byte-level BPE is the closest.
            reference_vocab: Some("gpt-2"),
            arch: "gpt-oss",
            layers: 4,
            head_dim: Some(32),
            qkv_bias: true,
            sinks_and_biases: true,
            experts: Some((8, 4, 32)),
            expert_width_key: true,
            metadata: &[
                ("rope.freq_base", TinyValue::F32(150_000.0)),
                ("attention.sliding_window", TinyValue::U32(TINY_WINDOW)),
                ("rope.scaling.type", TinyValue::Str("yarn")),
                ("rope.scaling.factor", TinyValue::F32(4.0)),
                ("rope.scaling.original_context_length", TinyValue::U32(64)),
            ],
            ..TinySpec::PLAIN
        }]
    }
}

/// The window on the layers `swa` marks, their RoPE base, the scaling kept on them, and the
/// queries scaled by the rotated size: what a file's keys and a known shape both resolve to.
fn layers(e: &mut Extras, c: &ModelConfig, window: usize, swa: Vec<bool>, theta_swa: f32) {
    e.window = Some(window);
    e.swa_layers = swa;
    e.rope_theta_swa = theta_swa;
    e.rope_scaled_swa = true;
    e.attn_scale = 1.0 / (c.rope_dim as f32).sqrt();
}

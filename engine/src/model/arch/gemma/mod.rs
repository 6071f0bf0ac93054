//! The Gemma family, Gemma 2 and 3: its own recipe ([`block`]) over the sandwich norms, and
//! what it resolves from its metadata: the embedding scale, local (sliding-window) and global
//! layers with their own RoPE base, soft-caps (Gemma 2's defaults, Gemma 3's only where its
//! file sets one), and the 27B models' query scale.
//!
//! Modules: this file, the family's facts; [`block`], its recipe and loader; [`hf`], its
//! Hugging Face mapping.

use serde_json::{Map, Value as Json};

use crate::formats::gguf::GgufFile;
use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{
    Bad, Change, Md, QK_NORMS, Shape, ShapeDefaults, default_theta, gguf_name, set, text_model,
};
use crate::model::arch::family::{FamilyDef, GgufArch, HfClass, HfInput, TinySpec, TinyValue, TINY_WINDOW};
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};
use crate::model::weights::{WeightError, Weights};

pub mod block;
pub mod hf;

pub use block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[
            GgufArch {
                name: "gemma2",
                rope_style: RopeStyle::Neox,
            },
            GgufArch {
                name: "gemma3",
                rope_style: RopeStyle::Neox,
            },
        ]
    }

    fn load(&self, f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
        block::load(f, cfg)
    }

    /// llama.cpp's `load_arch_hparams` for `gemma2` and `gemma3`.
    fn extras(
        &self,
        k: &Keys<'_>,
        c: &ModelConfig,
        window: usize,
        e: &mut Extras,
    ) -> Result<(), ConfigError> {
        let gemma2 = k.arch == "gemma2";
        if gemma2 {
            e.window = Some(if window > 0 { window } else { 4096 });
            e.swa_layers = k.swa_pattern(c.n_layers, 2)?;
            e.attn_softcap = Some(k.float_or("attn_logit_softcapping", 50.0, false)?);
            e.final_softcap = Some(k.float_or("final_logit_softcapping", 30.0, false)?);
        } else {
            if window > 0 {
                e.window = Some(window);
                e.swa_layers = k.swa_pattern(c.n_layers, 6)?;
            }
            let cap = k.float_or("final_logit_softcapping", 0.0, true)?;
            e.final_softcap = (cap > 0.0).then_some(cap);
        }
        // Gemma 2's local layers share the global base unless the file says otherwise; Gemma
        // 3's default to 10 000 (llama.cpp's `rope_freq_base_train_swa`).
        let swa_default = if gemma2 { c.rope_theta } else { 10_000.0 };
        e.rope_theta_swa = k.float_or("rope.freq_base_swa", swa_default, false)?;
        e.embed_scale = Some((c.hidden as f32).sqrt());
        // The 27B models (46 and 62 layers) scale queries by hidden / heads, not the head size.
        if matches!((k.arch, c.n_layers), ("gemma2", 46) | ("gemma3", 62)) {
            e.attn_scale = 1.0 / ((c.hidden / c.n_heads) as f32).sqrt();
        }
        Ok(())
    }

    fn hf_classes(&self) -> &'static [HfClass] {
        &[
            HfClass {
                class: "Gemma2ForCausalLM",
                model_types: &["gemma2"],
                gguf_arch: "gemma2",
            },
            HfClass {
                class: "Gemma3ForCausalLM",
                model_types: &["gemma3_text", "gemma3"],
                gguf_arch: "gemma3",
            },
        ]
    }

    /// transformers' `Gemma2Config` / `Gemma3TextConfig`: heads of 256; Gemma 3's bases
    /// 1 000 000 global and 10 000 local.
    fn hf_defaults(&self, c: &HfClass, cfg: &mut HfConfig, j: &mut Map<String, Json>) {
        cfg.head_dim = cfg.head_dim.or(Some(256));
        if c.gguf_arch != "gemma3" {
            default_theta(j, 10_000.0);
            return;
        }
        let rope_set = set(j, "rope_parameters");
        default_theta(j, 1_000_000.0);
        if !rope_set && !set(j, "rope_local_base_freq") {
            j.insert("rope_local_base_freq".into(), Json::from(10_000.0));
        }
    }

    /// The converter's Gemma 3 defaults where its config leaves the shape out.
    fn hf_shape_defaults(&self, c: &HfClass) -> ShapeDefaults {
        match c.gguf_arch {
            "gemma3" => ShapeDefaults {
                heads: Some(8),
                kv_heads: Some(4),
                head_dim: Some(256),
            },
            _ => ShapeDefaults::default(),
        }
    }

    fn hf_metadata(&self, c: &HfClass, md: &mut Md, x: &HfInput<'_>) -> Result<(), Bad> {
        if c.gguf_arch == "gemma2" {
            return hf::gemma2(md, x.cfg, x.j, x.shape);
        }
        text_model(md, x.cfg, x.j, x.rope)?;
        hf::gemma3(md, x.cfg, x.j, x.rope, x.shape)
    }

    /// Gemma's `lm_head` is the embedding (skipped); Gemma 3 norms Q and K.
    fn hf_tensor_name(&self, c: &HfClass, hf: &str) -> Option<Option<String>> {
        if hf == "lm_head.weight" {
            return Some(None);
        }
        match c.gguf_arch {
            "gemma3" => gguf_name(&[&hf::NORMS, &QK_NORMS], hf),
            _ => gguf_name(&[&hf::NORMS], hf),
        }
    }

    fn hf_change(&self, _: &HfClass, name: &str, _: &Shape) -> Change {
        if name.ends_with("norm.weight") {
            Change::PlusOne
        } else {
            Change::None
        }
    }

    fn hf_vocab_rows(
        &self,
        c: &HfClass,
        tokenizer: &dyn Fn() -> Result<Json, Bad>,
    ) -> Result<Option<u64>, Bad> {
        if c.gguf_arch != "gemma3" {
            return Ok(None);
        }
        Ok(hf::gemma3_vocab(&tokenizer()?))
    }

    /// Sandwich norms, soft-caps (Gemma 2) and sliding windows; Gemma 3 with QK-norm, its own
    /// local base and linear scaling, over six layers so one is global.
    fn tiny(&self) -> &'static [TinySpec] {
        &[
            TinySpec {
                variant: "gemma2",
                reference_vocab: Some("llama-bpe"),
                arch: "gemma2",
                layers: 4,
                head_dim: Some(32),
                sandwich: true,
                metadata: &[
                    ("rope.freq_base", TinyValue::F32(10_000.0)),
                    ("attention.sliding_window", TinyValue::U32(TINY_WINDOW)),
                    ("attn_logit_softcapping", TinyValue::F32(20.0)),
                    ("final_logit_softcapping", TinyValue::F32(10.0)),
                ],
                ..TinySpec::PLAIN
            },
            TinySpec {
                variant: "gemma3",
                reference_vocab: Some("llama-bpe"),
                arch: "gemma3",
                layers: 6,
                head_dim: Some(32),
                sandwich: true,
                qk_norm: true,
                metadata: &[
                    ("rope.freq_base", TinyValue::F32(1_000_000.0)),
                    ("rope.freq_base_swa", TinyValue::F32(10_000.0)),
                    ("attention.sliding_window", TinyValue::U32(TINY_WINDOW)),
                    ("rope.scaling.type", TinyValue::Str("linear")),
                    ("rope.scaling.factor", TinyValue::F32(8.0)),
                ],
                ..TinySpec::PLAIN
            },
        ]
    }
}

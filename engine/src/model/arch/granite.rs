//! IBM Granite 3.x (llama.cpp's `src/models/granite.cpp`, `LLM_ARCH_GRANITE`): the Llama block
//! with four scales its metadata sets: the embedding (`embedding_scale`), the attention's
//! queries (`attention.scale`, else `1 / sqrt(head size)`), each block's attention and FFN
//! outputs before their residual add (`residual_scale`), and the logits, divided by
//! `logit_scale` (which the file must set). Interleaved RoPE, an optional bias on the attention
//! output. Granite's mixtures of experts (`granitemoe`) and hybrids are other architectures.
//! From a Hugging Face folder it is `GraniteForCausalLM`, converted as llama.cpp's
//! `GraniteModel` converts it: Llama's mapping with the four `*_multiplier`/`logits_scaling`
//! settings as the scales, and no `head_dim`.

use serde_json::{Map, Value as Json};

use crate::formats::gguf::GgufFile;
use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{Bad, Change, Md, Shape, default_theta, num};
use crate::model::arch::family::{FamilyDef, GgufArch, HfClass, HfInput, TinySpec, TinyValue};
use crate::model::arch::llama::block::{self, attention_block, ffn_block, output};
use crate::model::arch::llama::hf;
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};
use crate::model::ops::{Activation, Buf, Ops};
use crate::model::weights::{WeightError, Weights, optional_vector};

pub struct Def;

/// config.json's settings and the GGUF keys `GraniteModel.set_gguf_parameters` writes them as
/// (each where it is set and not 0; transformers' `GraniteConfig` defaults each to 1).
const SCALES: [(&str, &str); 4] = [
    ("attention_multiplier", "attention.scale"),
    ("embedding_multiplier", "embedding_scale"),
    ("residual_multiplier", "residual_scale"),
    ("logits_scaling", "logit_scale"),
];

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[GgufArch {
            name: "granite",
            rope_style: RopeStyle::Interleaved,
        }]
    }

    /// The Llama block's weights, with the attention output's bias where the file has one.
    fn load(&self, f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
        let mut w = block::load(f, cfg)?;
        for (i, l) in w.layers.iter_mut().enumerate() {
            let name = format!("blk.{i}.attn_output.bias");
            l.wo.bias = optional_vector(f, &name, cfg.hidden as u64)?;
        }
        Ok(w)
    }

    /// llama.cpp's `llama_model_granite::load_arch_hparams`: the scales (0 or absent is none,
    /// as there), no sliding window.
    fn extras(
        &self,
        k: &Keys<'_>,
        _: &ModelConfig,
        _window: usize,
        e: &mut Extras,
    ) -> Result<(), ConfigError> {
        let scale = |key: &str| -> Result<Option<f32>, ConfigError> {
            let v = k.float_or(key, 0.0, true)?;
            Ok((v != 0.0).then_some(v))
        };
        if !k.has("logit_scale") {
            return Err(ConfigError::Shape(format!(
                "{} must be set for granite",
                k.key("logit_scale")
            )));
        }
        e.logit_scale = Some(k.float_or("logit_scale", 1.0, false)?);
        e.residual_scale = scale("residual_scale")?;
        e.embed_scale = scale("embedding_scale")?;
        if let Some(s) = scale("attention.scale")? {
            e.attn_scale = s;
        }
        // The FFN biases llama.cpp reads are not in this recipe: refused, not ignored.
        if k.f.tensor("blk.0.ffn_up.bias").is_some() || k.f.tensor("blk.0.ffn_down.bias").is_some()
        {
            return Err(ConfigError::Shape(
                "granite files with FFN biases are not supported".into(),
            ));
        }
        Ok(())
    }

    fn hf_classes(&self) -> &'static [HfClass] {
        &[HfClass {
            class: "GraniteForCausalLM",
            model_types: &["granite"],
            gguf_arch: "granite",
        }]
    }

    /// `GraniteConfig`'s defaults; the converter drops `head_dim` (the head is `hidden / heads`,
    /// and no `key_length` is written).
    fn hf_defaults(&self, _: &HfClass, cfg: &mut HfConfig, j: &mut Map<String, Json>) {
        cfg.head_dim = None;
        j.remove("head_dim");
        default_theta(j, 10_000.0);
        for (key, _) in SCALES {
            if j.get(key).is_none_or(Json::is_null) {
                j.insert(key.into(), Json::from(1.0));
            }
        }
    }

    fn hf_metadata(&self, _: &HfClass, md: &mut Md, x: &HfInput<'_>) -> Result<(), Bad> {
        hf::llama_model_keys(md, x)?;
        for (key, gguf) in SCALES {
            if let Some(v) = num(x.j, key)?.filter(|&v| v != 0.0) {
                md.f32(gguf, v)?;
            }
        }
        Ok(())
    }

    fn hf_computed(&self, _: &HfClass, x: &HfInput<'_>) -> Result<Vec<(String, Vec<f32>)>, Bad> {
        hf::llama3_tensors(x)
    }

    fn hf_change(&self, _: &HfClass, name: &str, s: &Shape) -> Change {
        hf::permute(name, s)
    }

    /// Every scale set, none of them 1.
    fn tiny(&self) -> &'static [TinySpec] {
        &[TinySpec {
            variant: "granite",
            arch: "granite",
            reference_vocab: Some("llama-bpe"),
            metadata: &[
                ("rope.freq_base", TinyValue::F32(10_000.0)),
                ("logit_scale", TinyValue::F32(4.0)),
                ("residual_scale", TinyValue::F32(0.5)),
                ("embedding_scale", TinyValue::F32(3.0)),
                ("attention.scale", TinyValue::F32(0.2)),
            ],
            ..TinySpec::PLAIN
        }]
    }
}

/// The recipe: the Llama block with the embedding, each residual branch and the logits scaled.
pub fn forward<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    o: &mut O,
) -> Result<(), O::Error> {
    let e = &c.extras;
    let residual = |o: &mut O| match e.residual_scale {
        Some(s) => o.scale(Buf::Tmp, s),
        None => Ok(()),
    };
    o.embed(&w.embed, Buf::X)?;
    if let Some(s) = e.embed_scale {
        o.scale(Buf::X, s)?;
    }
    // `c.n_layers` below the file's: an early exit (self-speculative drafting).
    for (li, l) in w.layers.iter().enumerate().take(c.n_layers) {
        attention_block(c, w, l, li, o)?;
        residual(o)?;
        o.add_rms_norm(Buf::X, Buf::Tmp, &l.ffn_norm, c.rms_eps, Buf::H)?;
        ffn_block(&l.ffn, Activation::Silu, o)?;
        residual(o)?;
    }
    output(c, w, o)?;
    if let Some(s) = e.logit_scale {
        o.scale(Buf::Logits, 1.0 / s)?;
    }
    Ok(())
}

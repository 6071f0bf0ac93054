//! Phi-3: the Llama block over fused `attn_qkv` and gate-up tensors (read fused), NeoX-style
//! RoPE with LongRoPE's per-dimension factors, and no sliding window (llama.cpp leaves it off;
//! Phi-3's files set it wrongly).

use serde_json::{Map, Value as Json};

use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{Bad, Md, PRE_NORM, Rope, Shape, gguf_name, required, uint, own_shape_keys};
use crate::model::arch::family::{FamilyDef, GgufArch, HfClass, HfInput, TinySpec, TinyValue, TINY_CONTEXT};
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};

pub use crate::model::arch::llama::block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[GgufArch {
            name: "phi3",
            rope_style: RopeStyle::Neox,
        }]
    }


    fn extras(
        &self,
        _: &Keys<'_>,
        _: &ModelConfig,
        _window: usize,
        _: &mut Extras,
    ) -> Result<(), ConfigError> {
        Ok(())
    }

    fn hf_classes(&self) -> &'static [HfClass] {
        &[HfClass {
            class: "Phi3ForCausalLM",
            model_types: &["phi3"],
            gguf_arch: "phi3",
        }]
    }

    fn hf_metadata(&self, _: &HfClass, md: &mut Md, x: &HfInput<'_>) -> Result<(), Bad> {
        metadata(md, x.cfg, x.j, x.rope, x.shape)
    }

    fn hf_computed(&self, _: &HfClass, x: &HfInput<'_>) -> Result<Vec<(String, Vec<f32>)>, Bad> {
        longrope(x)
    }

    fn hf_tensor_name(&self, _: &HfClass, hf: &str) -> Option<Option<String>> {
        gguf_name(&[&PRE_NORM, &FUSED], hf)
    }

    /// Fused tensors and LongRoPE factors.
    fn tiny(&self) -> &'static [TinySpec] {
        &[TinySpec {
            variant: "phi3",
            reference_vocab: Some("phi-3"),
            arch: "phi3",
            longrope: true,
            fused: true,
            metadata: &[
                ("rope.freq_base", TinyValue::F32(10_000.0)),
                ("rope.scaling.attn_factor", TinyValue::F32(1.19)),
                (
                    "rope.scaling.original_context_length",
                    TinyValue::U32(TINY_CONTEXT),
                ),
            ],
            ..TinySpec::PLAIN
        }]
    }
}

/// Phi-3's fused tensors, kept fused (llama.cpp splits them at run time).
const FUSED: [(&str, &str); 2] = [
    ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
    ("mlp.gate_up_proj.weight", "ffn_up.weight"),
];


/// `Phi3MiniModel.set_gguf_parameters`: its own list, and LongRoPE's attention factor when the
/// config has long factors.
fn metadata(
    md: &mut Md,
    cfg: &HfConfig,
    j: &Map<String, Json>,
    rope: &Rope,
    s: &Shape,
) -> Result<(), Bad> {
    let ctx = required(cfg.max_position_embeddings, "max_position_embeddings")?;
    let orig = required(
        uint(&rope.global, "original_max_position_embeddings")?,
        "original_max_position_embeddings",
    )?;
    own_shape_keys(md, cfg, s)?;
    md.u32("rope.scaling.original_context_length", orig)?;
    md.u32("rope.dimension_count", rope_dims(cfg, rope, s)?)?;
    md.f32(
        "rope.freq_base",
        required(rope.num("rope_theta")?, "rope_theta")?,
    )?;
    md.u32(
        "attention.sliding_window",
        uint(j, "sliding_window")?.unwrap_or(0),
    )?;
    if rope.factors("long_factor")?.is_some_and(|f| !f.is_empty()) {
        let scale = ctx as f64 / orig.max(1) as f64;
        let ty = rope.rope_type()?.unwrap_or("").to_lowercase();
        let attn = match ty.as_str() {
            "su" | "longrope" if scale > 1.0 => (1.0 + scale.ln() / (orig as f64).ln()).sqrt(),
            "yarn" if scale > 1.0 => 0.1 * scale.ln() + 1.0,
            "su" | "longrope" | "yarn" => 1.0,
            "" => return Err("rope_scaling.type is required with long_factor".into()),
            other => return Err(format!("rope_scaling type '{other}' is not supported")),
        };
        md.f32("rope.scaling.attn_factor", attn)?;
    }
    Ok(())
}

/// Phi-3's rotary dimensions: `int(partial_rotary_factor * hidden) // heads`.
fn rope_dims(cfg: &HfConfig, rope: &Rope, s: &Shape) -> Result<u64, Bad> {
    let pct = rope.num("partial_rotary_factor")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&pct) {
        return Err(format!("partial_rotary_factor {pct} is not in 0..=1"));
    }
    Ok((pct * cfg.hidden_size as f64) as u64 / s.heads)
}


/// LongRoPE's factors as tensors, when the config has long ones
/// (`Phi3MiniModel.generate_extra_tensors`).
fn longrope(x: &HfInput<'_>) -> Result<Vec<(String, Vec<f32>)>, Bad> {
    let Some(long) = x.rope.factors("long_factor")?.filter(|f| !f.is_empty()) else {
        return Ok(Vec::new());
    };
    let short = required(x.rope.factors("short_factor")?, "rope_scaling.short_factor")?;
    let dims = rope_dims(x.cfg, x.rope, x.shape)?;
    if long.len() != short.len() || long.len() as u64 * 2 != dims {
        return Err(format!(
            "rope_scaling has {} long and {} short factors; {dims} rotary dimensions need {}",
            long.len(),
            short.len(),
            dims / 2
        ));
    }
    Ok(vec![
        ("rope_factors_long.weight".into(), long),
        ("rope_factors_short.weight".into(), short),
    ])
}

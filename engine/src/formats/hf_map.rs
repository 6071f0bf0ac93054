//! The pieces of llama.cpp's convert_hf_to_gguf.py every family's Hugging Face mapping is
//! built from (`conversion/base.py`): the config's values read as the converter reads them,
//! the RoPE parameters it resolves, the `{arch}.*` keys it writes for every text model, the
//! tensor names every family shares, and the edits it can make to a tensor. Which of them a
//! family uses, and what it adds, is the family's (`model::arch::<family>`'s `HfMap`).

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

use crate::formats::gguf::Value;
use crate::formats::hf_config::HfConfig;

/// A config value that is not what the converter expects there.
pub type Bad = String;

/// `key` of the config as a number, if set (null counts as unset, as in Python's `.get`).
pub fn num(j: &Map<String, Json>, key: &str) -> Result<Option<f64>, Bad> {
    match j.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => match v.as_f64() {
            Some(x) if x.is_finite() => Ok(Some(x)),
            _ => Err(format!("{key} = {v} is not a finite number")),
        },
    }
}

/// `key` of the config as a non-negative integer, if set.
pub fn uint(j: &Map<String, Json>, key: &str) -> Result<Option<u64>, Bad> {
    match j.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| format!("{key} = {v} is not a non-negative integer")),
    }
}

pub fn required<T>(v: Option<T>, key: &str) -> Result<T, Bad> {
    v.ok_or_else(|| format!("{key} is required for this model type"))
}

/// The first of `keys` the config has (convert_hf_to_gguf's `find_hparam`).
pub fn find_num(j: &Map<String, Json>, keys: &[&str]) -> Result<Option<f64>, Bad> {
    match keys.iter().find(|k| j.contains_key(**k)) {
        Some(k) => num(j, k),
        None => Ok(None),
    }
}

/// The RoPE parameters as the converter resolves them (`TextModel.__init__`): the
/// `rope_parameters` (or `rope_scaling`) object, with the top-level `rope_theta`,
/// `partial_rotary_factor` and `original_max_position_embeddings` mirrored into it.
pub struct Rope {
    /// The parameters of the global (full-attention) layers.
    pub global: Map<String, Json>,
    /// The RoPE base of the sliding-window layers, where the config sets one.
    pub local_theta: Option<f64>,
}

impl Rope {
    pub fn of(j: &Map<String, Json>) -> Result<Self, Bad> {
        let raw = match j.get("rope_parameters").or_else(|| j.get("rope_scaling")) {
            None | Some(Json::Null) => Map::new(),
            Some(Json::Object(m)) => m.clone(),
            Some(v) => return Err(format!("rope_scaling {v} is not an object")),
        };
        let sub = |name: &str| match raw.get(name) {
            None => Ok(None),
            Some(Json::Object(m)) => Ok(Some(m.clone())),
            Some(v) => Err(format!("rope_parameters.{name} = {v} is not an object")),
        };
        let (full, sliding) = (sub("full_attention")?, sub("sliding_attention")?);
        if full.is_some() || sliding.is_some() {
            let local_theta = match sliding {
                Some(s) => num(&s, "rope_theta")?,
                None => None,
            };
            return Ok(Self {
                global: full.unwrap_or(raw),
                local_theta,
            });
        }
        let mut g = raw;
        let local_theta = find_num(
            j,
            &[
                "local_rope_theta",
                "rope_local_theta",
                "rope_theta_local",
                "swa_rope_theta",
                "rope_local_base_freq",
            ],
        )?;
        let theta = find_num(
            j,
            &[
                "global_rope_theta",
                "rope_global_theta",
                "rope_theta_global",
                "rope_theta",
                "rotary_emb_base",
            ],
        )?;
        let partial = find_num(j, &["partial_rotary_factor", "rope_pct", "rope_percent"])?;
        // Mirrored as written (an integer stays one).
        let orig = j
            .get("original_max_position_embeddings")
            .filter(|v| !v.is_null())
            .cloned();
        let ty = g.get("type").cloned();
        for (key, v) in [
            ("rope_theta", theta.map(Json::from)),
            ("rope_type", ty),
            ("partial_rotary_factor", partial.map(Json::from)),
            ("original_max_position_embeddings", orig),
        ] {
            if let Some(v) = v.filter(|_| !g.contains_key(key)) {
                g.insert(key.into(), v);
            }
        }
        Ok(Self {
            global: g,
            local_theta,
        })
    }

    pub fn num(&self, key: &str) -> Result<Option<f64>, Bad> {
        num(&self.global, key)
    }

    pub fn rope_type(&self) -> Result<Option<&str>, Bad> {
        match self.global.get("rope_type") {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("rope_type {v} is not a string")),
        }
    }

    /// A list of finite factors (LongRoPE's `long_factor` / `short_factor`), if set.
    pub fn factors(&self, key: &str) -> Result<Option<Vec<f32>>, Bad> {
        match self.global.get(key) {
            None | Some(Json::Null) => Ok(None),
            Some(Json::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_f64()
                        .filter(|x| x.is_finite() && *x > 0.0)
                        .map(|x| x as f32)
                        .ok_or_else(|| format!("rope_scaling.{key} holds {v}, not a factor"))
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(format!("rope_scaling.{key} = {v} is not a list")),
        }
    }
}

/// The `{arch}.*` keys being written, each range-checked as it goes in.
pub struct Md {
    arch: &'static str,
    pub map: BTreeMap<String, Value>,
}

impl Md {
    /// No keys yet, for GGUF architecture `arch`.
    pub fn new(arch: &'static str) -> Self {
        Self {
            arch,
            map: BTreeMap::new(),
        }
    }

    pub fn put(&mut self, key: &str, v: Value) {
        self.map.insert(format!("{}.{key}", self.arch), v);
    }

    pub fn u32(&mut self, key: &str, v: u64) -> Result<(), Bad> {
        let v = u32::try_from(v).map_err(|_| format!("{key} {v} is out of range"))?;
        self.put(key, Value::U32(v));
        Ok(())
    }

    pub fn f32(&mut self, key: &str, v: f64) -> Result<(), Bad> {
        if !v.is_finite() || v.abs() > f64::from(f32::MAX) {
            return Err(format!("{key} {v} is out of range"));
        }
        self.put(key, Value::F32(v as f32));
        Ok(())
    }
}

/// The shape every family shares, checked before anything is sized from it.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub heads: u64,
    pub kv_heads: u64,
    /// `head_dim` when the config sets it, else `hidden_size / heads`.
    pub head_dim: u64,
}

/// What a family's config class fills in where `config.json` leaves the shape out.
#[derive(Debug, Clone, Copy, Default)]
pub struct ShapeDefaults {
    pub heads: Option<u64>,
    pub kv_heads: Option<u64>,
    pub head_dim: Option<u64>,
}

/// The shape, with the family's defaults, checked before anything is sized from it.
pub fn shape(cfg: &HfConfig, d: ShapeDefaults) -> Result<Shape, Bad> {
    let heads = match cfg.num_attention_heads.or(d.heads) {
        Some(h) => h,
        None => return Err("num_attention_heads is required".into()),
    };
    let kv_heads = cfg.num_key_value_heads.or(d.kv_heads).unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(format!(
            "{heads} attention heads do not share {kv_heads} key/value heads"
        ));
    }
    let head_dim = match cfg.head_dim.or(d.head_dim) {
        Some(d) => d,
        None if cfg.hidden_size.is_multiple_of(heads) => cfg.hidden_size / heads,
        None => {
            return Err(format!(
                "hidden_size {} does not split into {heads} heads",
                cfg.hidden_size
            ));
        }
    };
    if head_dim == 0 || !head_dim.is_multiple_of(2) {
        return Err(format!(
            "head size {head_dim} is not a positive even number"
        ));
    }
    Ok(Shape {
        heads,
        kv_heads,
        head_dim,
    })
}

/// Sets `rope_theta` where neither it nor `rope_parameters` is in the config: the default of
/// the family's transformers config class (which the converter reads it through).
pub fn default_theta(j: &mut Map<String, Json>, theta: f64) {
    if !set(j, "rope_parameters") && !set(j, "rope_theta") {
        j.insert("rope_theta".into(), Json::from(theta));
    }
}

/// Whether the config sets `key` (null counts as unset).
pub fn set(j: &Map<String, Json>, key: &str) -> bool {
    j.get(key).is_some_and(|v| !v.is_null())
}

/// The shape keys of a family that writes its own list instead of [`text_model`]'s (Gemma 2's,
/// Phi-3's): context, width, layers, FFN width, heads and the RMS epsilon, each required.
pub fn own_shape_keys(md: &mut Md, cfg: &HfConfig, s: &Shape) -> Result<(), Bad> {
    let ctx = required(cfg.max_position_embeddings, "max_position_embeddings")?;
    md.u32("context_length", ctx)?;
    md.u32("embedding_length", cfg.hidden_size)?;
    md.u32("block_count", cfg.num_hidden_layers)?;
    md.u32("feed_forward_length", cfg.intermediate_size)?;
    md.u32("attention.head_count", s.heads)?;
    md.u32("attention.head_count_kv", s.kv_heads)?;
    md.f32(
        "attention.layer_norm_rms_epsilon",
        required(cfg.rms_norm_eps, "rms_norm_eps")?,
    )
}

/// `TextModel.set_gguf_parameters`: the keys every family of `base.py` writes (most families
/// write these and add their own).
pub fn text_model(
    md: &mut Md,
    cfg: &HfConfig,
    j: &Map<String, Json>,
    rope: &Rope,
) -> Result<(), Bad> {
    md.u32("block_count", cfg.num_hidden_layers)?;
    if let Some(n) = cfg.max_position_embeddings {
        md.u32("context_length", n)?;
    }
    md.u32("embedding_length", cfg.hidden_size)?;
    md.u32("feed_forward_length", cfg.intermediate_size)?;
    if let Some(h) = cfg.num_attention_heads {
        md.u32("attention.head_count", h)?;
    }
    if let Some(h) = cfg.num_key_value_heads {
        md.u32("attention.head_count_kv", h)?;
    }
    rope_scaling(md, rope)?;
    if let Some(theta) = rope.num("rope_theta")? {
        md.f32("rope.freq_base", theta)?;
    }
    if let Some(theta) = rope.local_theta {
        md.f32("rope.freq_base_swa", theta)?;
    }
    if let Some(eps) = cfg.rms_norm_eps {
        md.f32("attention.layer_norm_rms_epsilon", eps)?;
    }
    if let Some(eps) = find_num(j, &["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])? {
        md.f32("attention.layer_norm_epsilon", eps)?;
    }
    if let Some(d) = cfg.head_dim {
        md.u32("attention.key_length", d)?;
        md.u32("attention.value_length", d)?;
    }
    Ok(())
}

/// The `rope.scaling.*` keys of `TextModel.set_gguf_parameters`. Llama 3's scaling is its
/// `rope_freqs` tensor ([`computed`]); a type the engine cannot run is refused here rather than
/// warned about and computed wrongly.
fn rope_scaling(md: &mut Md, rope: &Rope) -> Result<(), Bad> {
    let Some(ty) = rope.rope_type()? else {
        return Ok(());
    };
    let factor = rope.num("factor")?;
    let text = |s: &str| Value::String(s.into());
    match (ty, factor) {
        ("linear", Some(f)) => {
            md.put("rope.scaling.type", text("linear"));
            md.f32("rope.scaling.factor", f)?;
        }
        ("yarn", Some(f)) => {
            md.put("rope.scaling.type", text("yarn"));
            md.f32("rope.scaling.factor", f)?;
            let orig = required(
                uint(&rope.global, "original_max_position_embeddings")?,
                "rope_scaling.original_max_position_embeddings",
            )?;
            md.u32("rope.scaling.original_context_length", orig)?;
            let attn = match rope.num("attention_factor")? {
                Some(a) => Some(a),
                None => rope.num("attn_factor")?,
            };
            for (key, v) in [
                (
                    "rope.scaling.yarn_ext_factor",
                    rope.num("extrapolation_factor")?,
                ),
                ("rope.scaling.yarn_attn_factor", attn),
                ("rope.scaling.yarn_beta_fast", rope.num("beta_fast")?),
                ("rope.scaling.yarn_beta_slow", rope.num("beta_slow")?),
            ] {
                if let Some(v) = v {
                    md.f32(key, v)?;
                }
            }
        }
        ("su" | "longrope", _) => md.put("rope.scaling.type", text("longrope")),
        ("llama3" | "default", _) | ("linear" | "yarn", None) => {}
        (other, _) => return Err(format!("rope_scaling type '{other}' is not supported")),
    }
    Ok(())
}

pub const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// Layer tensors every family names alike.
pub const LAYER_NAMES: [(&str, &str); 11] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// Pre-norm blocks: the norm after attention is the FFN's input norm.
pub const PRE_NORM: [(&str, &str); 1] = [("post_attention_layernorm.weight", "ffn_norm.weight")];

pub const QK_NORMS: [(&str, &str); 2] = [
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
];

/// GGUF name of a Hugging Face tensor, given the layer names the family adds to
/// [`LAYER_NAMES`]: `None` when no such tensor is known, `Some(None)` for tensors the converter
/// skips (rotary caches).
pub fn gguf_name(extra: &[&[(&'static str, &'static str)]], hf: &str) -> Option<Option<String>> {
    if hf.ends_with(".rotary_emb.inv_freq") {
        return Some(None);
    }
    if let Some((_, g)) = GLOBAL_NAMES.iter().find(|(h, _)| *h == hf) {
        return Some(Some((*g).to_string()));
    }
    let (layer, suffix) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let (_, g) = LAYER_NAMES
        .iter()
        .chain(extra.iter().flat_map(|e| e.iter()))
        .find(|(h, _)| *h == suffix)?;
    Some(Some(format!("blk.{layer}.{g}")))
}

/// Hugging Face name of a GGUF tensor of the Llama family (the inverse of [`gguf_name`]).
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((h, _)) = GLOBAL_NAMES.iter().find(|(_, g)| *g == gguf) {
        return Some((*h).to_string());
    }
    let (layer, suffix) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let (h, _) = LAYER_NAMES
        .iter()
        .chain(&PRE_NORM)
        .find(|(_, g)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{h}"))
}

/// What the converter does to a mapped tensor's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    None,
    /// Rows permuted for interleaved RoPE over this many heads (`LlamaModel.permute`).
    Permute(u64),
    /// Gemma's RMSNorm weight `w` is applied as `1 + w`: stored so.
    PlusOne,
}

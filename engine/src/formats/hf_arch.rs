//! The Hugging Face families this engine runs from a folder, each mapped as llama.cpp's
//! convert_hf_to_gguf.py maps it (`conversion/{base,llama,qwen,gemma,phi}.py`): the
//! `architectures` that name it, the GGUF metadata its `config.json` becomes, its tensor names,
//! the edits the converter makes to tensors (Llama's Q/K permutation, Gemma's `norm + 1`,
//! Gemma 3's embedding cut to the real vocabulary) and the tensors it computes from the config
//! (Llama 3's `rope_freqs`, Phi-3's LongRoPE factors).

use std::collections::BTreeMap;

use serde_json::{Map, Value as Json};

use crate::formats::gguf::Value;
use crate::formats::hf_config::HfConfig;

/// A Hugging Face model class, as convert_hf_to_gguf registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Mistral,
    Qwen2,
    Qwen3,
    Gemma2,
    Gemma3,
    Phi3,
    SmolLM3,
}

/// (`architectures[0]`, `model_type`, family): the classes the engine runs.
const FAMILIES: [(&str, &str, Family); 8] = [
    ("LlamaForCausalLM", "llama", Family::Llama),
    ("MistralForCausalLM", "mistral", Family::Mistral),
    ("Qwen2ForCausalLM", "qwen2", Family::Qwen2),
    ("Qwen3ForCausalLM", "qwen3", Family::Qwen3),
    ("Gemma2ForCausalLM", "gemma2", Family::Gemma2),
    ("Gemma3ForCausalLM", "gemma3_text", Family::Gemma3),
    ("Phi3ForCausalLM", "phi3", Family::Phi3),
    ("SmolLM3ForCausalLM", "smollm3", Family::SmolLM3),
];

/// The class names, for messages.
pub fn supported() -> String {
    FAMILIES.map(|(a, _, _)| a).join(", ")
}

impl Family {
    /// The family of a config: its `architectures[0]` (what the converter dispatches on), else
    /// its `model_type`; the name found when the engine does not run it.
    pub fn of(model_type: Option<&str>, architectures: &[String]) -> Result<Self, String> {
        if let Some(a) = architectures.first() {
            return FAMILIES
                .iter()
                .find(|(name, _, _)| name == a)
                .map(|f| f.2)
                .ok_or_else(|| a.clone());
        }
        let ty = model_type.unwrap_or_default();
        FAMILIES
            .iter()
            .find(|(_, t, _)| *t == ty || (ty == "gemma3" && *t == "gemma3_text"))
            .map(|f| f.2)
            .ok_or_else(|| ty.to_string())
    }

    /// The GGUF `general.architecture` the converter writes.
    pub fn gguf_arch(self) -> &'static str {
        match self {
            Self::Llama | Self::Mistral => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
            Self::Gemma2 => "gemma2",
            Self::Gemma3 => "gemma3",
            Self::Phi3 => "phi3",
            Self::SmolLM3 => "smollm3",
        }
    }

    /// The converter's `LlamaModel` and its subclasses: Q/K permuted for interleaved RoPE,
    /// `vocab_size` and `rope.dimension_count` written, Llama 3 `rope_freqs` computed.
    fn llama_model(self) -> bool {
        matches!(self, Self::Llama | Self::Mistral | Self::SmolLM3)
    }

    fn gemma(self) -> bool {
        matches!(self, Self::Gemma2 | Self::Gemma3)
    }
}

/// A config value that is not what the converter expects there.
type Bad = String;

/// `key` of the config as a number, if set (null counts as unset, as in Python's `.get`).
fn num(j: &Map<String, Json>, key: &str) -> Result<Option<f64>, Bad> {
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

fn required<T>(v: Option<T>, key: &str) -> Result<T, Bad> {
    v.ok_or_else(|| format!("{key} is required for this model type"))
}

/// The first of `keys` the config has (convert_hf_to_gguf's `find_hparam`).
fn find_num(j: &Map<String, Json>, keys: &[&str]) -> Result<Option<f64>, Bad> {
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

    fn num(&self, key: &str) -> Result<Option<f64>, Bad> {
        num(&self.global, key)
    }

    fn rope_type(&self) -> Result<Option<&str>, Bad> {
        match self.global.get("rope_type") {
            None | Some(Json::Null) => Ok(None),
            Some(Json::String(s)) => Ok(Some(s)),
            Some(v) => Err(format!("rope_type {v} is not a string")),
        }
    }

    /// A list of finite factors (LongRoPE's `long_factor` / `short_factor`), if set.
    fn factors(&self, key: &str) -> Result<Option<Vec<f32>>, Bad> {
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
struct Md {
    arch: &'static str,
    map: BTreeMap<String, Value>,
}

impl Md {
    fn put(&mut self, key: &str, v: Value) {
        self.map.insert(format!("{}.{key}", self.arch), v);
    }

    fn u32(&mut self, key: &str, v: u64) -> Result<(), Bad> {
        let v = u32::try_from(v).map_err(|_| format!("{key} {v} is out of range"))?;
        self.put(key, Value::U32(v));
        Ok(())
    }

    fn f32(&mut self, key: &str, v: f64) -> Result<(), Bad> {
        if !v.is_finite() || v.abs() > f64::from(f32::MAX) {
            return Err(format!("{key} {v} is out of range"));
        }
        self.put(key, Value::F32(v as f32));
        Ok(())
    }
}

/// The defaults transformers' config classes (5.x) fill in when config.json leaves a field
/// out, which the converter then writes (it reads the config through `AutoConfig`): the head
/// size (Llama and Mistral `hidden / heads`, Qwen3 128, Gemma 256) and the RoPE bases
/// (SmolLM3 2e6, Gemma 3 1e6 global and 1e4 local, else 1e4).
pub fn transformers_defaults(family: Family, cfg: &mut HfConfig, j: &mut Map<String, Json>) {
    let heads = cfg.num_attention_heads.filter(|&h| h > 0);
    let head_dim = match family {
        Family::Llama | Family::Mistral => heads.map(|h| cfg.hidden_size / h),
        Family::Qwen3 => Some(128),
        Family::Gemma2 | Family::Gemma3 => Some(256),
        _ => None,
    };
    if cfg.head_dim.is_none() {
        cfg.head_dim = head_dim;
    }
    let has = |j: &Map<String, Json>, k: &str| j.get(k).is_some_and(|v| !v.is_null());
    let rope_set = has(j, "rope_parameters");
    let theta = match family {
        Family::SmolLM3 => 2_000_000.0,
        Family::Gemma3 => 1_000_000.0,
        _ => 10_000.0,
    };
    if !rope_set && !has(j, "rope_theta") {
        j.insert("rope_theta".into(), Json::from(theta));
    }
    if family == Family::Gemma3 && !rope_set && !has(j, "rope_local_base_freq") {
        j.insert("rope_local_base_freq".into(), Json::from(10_000.0));
    }
}

/// The shape every family shares, checked before anything is sized from it.
pub struct Shape {
    pub heads: u64,
    pub kv_heads: u64,
    /// `head_dim` when the config sets it, else `hidden_size / heads`.
    pub head_dim: u64,
}

/// Gemma 3's defaults where its config leaves a field out (the converter's).
fn heads_default(family: Family) -> Option<u64> {
    (family == Family::Gemma3).then_some(8)
}

pub fn shape(family: Family, cfg: &HfConfig) -> Result<Shape, Bad> {
    let heads = match cfg.num_attention_heads.or(heads_default(family)) {
        Some(h) => h,
        None => return Err("num_attention_heads is required".into()),
    };
    let kv_default = if family == Family::Gemma3 { 4 } else { heads };
    let kv_heads = cfg.num_key_value_heads.unwrap_or(kv_default);
    if heads == 0 || kv_heads == 0 || !heads.is_multiple_of(kv_heads) {
        return Err(format!(
            "{heads} attention heads do not share {kv_heads} key/value heads"
        ));
    }
    let head_dim = match cfg.head_dim {
        Some(d) => d,
        None if family == Family::Gemma3 => 256,
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

/// The `{arch}.*` metadata convert_hf_to_gguf writes for this config (besides `general.*`,
/// which the caller adds).
pub fn metadata(
    family: Family,
    cfg: &HfConfig,
    j: &Map<String, Json>,
    rope: &Rope,
    s: &Shape,
) -> Result<BTreeMap<String, Value>, Bad> {
    let mut md = Md {
        arch: family.gguf_arch(),
        map: BTreeMap::new(),
    };
    match family {
        Family::Gemma2 => gemma2(&mut md, cfg, j, s)?,
        Family::Phi3 => phi3(&mut md, cfg, j, rope, s)?,
        _ => {
            text_model(&mut md, cfg, j, rope)?;
            if family.llama_model() {
                md.u32("vocab_size", cfg.vocab_size)?;
                md.u32("rope.dimension_count", s.head_dim)?;
            }
            if family == Family::Gemma3 {
                gemma3(&mut md, cfg, j, rope, s)?;
            }
            // The converter drops Mistral's window (llama.cpp then attends over everything);
            // transformers slides it, so the window is kept, as the engine's GGUF Mistral does.
            if family == Family::Mistral
                && let Some(w) = uint(j, "sliding_window")?.filter(|&w| w > 0)
            {
                md.u32("attention.sliding_window", w)?;
            }
        }
    }
    if family == Family::SmolLM3 {
        check_no_rope(j, cfg.num_hidden_layers)?;
    }
    Ok(md.map)
}

/// `TextModel.set_gguf_parameters`: the keys every family of `base.py` writes.
fn text_model(md: &mut Md, cfg: &HfConfig, j: &Map<String, Json>, rope: &Rope) -> Result<(), Bad> {
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

/// `Gemma2Model.set_gguf_parameters`: its own list, no RoPE keys.
fn gemma2(md: &mut Md, cfg: &HfConfig, j: &Map<String, Json>, s: &Shape) -> Result<(), Bad> {
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
    )?;
    let head_dim = required(cfg.head_dim, "head_dim")?;
    md.u32("attention.key_length", head_dim)?;
    md.u32("attention.value_length", head_dim)?;
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        md.f32(key, required(num(j, key)?, key)?)?;
    }
    let window = required(uint(j, "sliding_window")?, "sliding_window")?;
    md.u32("attention.sliding_window", window)
}

/// `Gemma3Model.set_gguf_parameters`, over [`text_model`]'s keys: its defaults, the global
/// base, the final soft-cap and the window.
fn gemma3(
    md: &mut Md,
    cfg: &HfConfig,
    j: &Map<String, Json>,
    rope: &Rope,
    s: &Shape,
) -> Result<(), Bad> {
    md.u32(
        "context_length",
        cfg.max_position_embeddings.unwrap_or(131_072),
    )?;
    md.u32("attention.head_count", s.heads)?;
    md.f32(
        "attention.layer_norm_rms_epsilon",
        cfg.rms_norm_eps.unwrap_or(1e-6),
    )?;
    md.u32("attention.key_length", s.head_dim)?;
    md.u32("attention.value_length", s.head_dim)?;
    md.f32(
        "rope.freq_base",
        rope.num("rope_theta")?.unwrap_or(1_000_000.0),
    )?;
    if num(j, "attn_logit_softcapping")?.is_some() {
        return Err("attn_logit_softcapping is set, but Gemma 3 has none".into());
    }
    if let Some(cap) = num(j, "final_logit_softcapping")?.filter(|&c| c != 0.0) {
        md.f32("final_logit_softcapping", cap)?;
    }
    if uint(j, "sliding_window_pattern")? != Some(1) {
        let window = required(uint(j, "sliding_window")?, "sliding_window")?;
        md.u32("attention.sliding_window", window)?;
    }
    md.u32("attention.head_count_kv", s.kv_heads)
}

/// `Phi3MiniModel.set_gguf_parameters`: its own list, and LongRoPE's attention factor when the
/// config has long factors.
fn phi3(
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
    md.u32("context_length", ctx)?;
    md.u32("rope.scaling.original_context_length", orig)?;
    md.u32("embedding_length", cfg.hidden_size)?;
    md.u32("feed_forward_length", cfg.intermediate_size)?;
    md.u32("block_count", cfg.num_hidden_layers)?;
    md.u32("attention.head_count", s.heads)?;
    md.u32("attention.head_count_kv", s.kv_heads)?;
    md.f32(
        "attention.layer_norm_rms_epsilon",
        required(cfg.rms_norm_eps, "rms_norm_eps")?,
    )?;
    md.u32("rope.dimension_count", phi3_rope_dims(cfg, rope, s)?)?;
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
fn phi3_rope_dims(cfg: &HfConfig, rope: &Rope, s: &Shape) -> Result<u64, Bad> {
    let pct = rope.num("partial_rotary_factor")?.unwrap_or(1.0);
    if !(0.0..=1.0).contains(&pct) {
        return Err(format!("partial_rotary_factor {pct} is not in 0..=1"));
    }
    Ok((pct * cfg.hidden_size as f64) as u64 / s.heads)
}

/// SmolLM3's `no_rope_layers` (1: the layer rotates): llama.cpp, and so the engine, leave out
/// RoPE on every 4th layer, so a config that says otherwise is refused, not run wrongly.
fn check_no_rope(j: &Map<String, Json>, layers: u64) -> Result<(), Bad> {
    let Some(v) = j.get("no_rope_layers").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let want: Vec<u64> = (0..layers).map(|i| u64::from((i + 1) % 4 != 0)).collect();
    let got: Option<Vec<u64>> = v
        .as_array()
        .map(|a| a.iter().filter_map(Json::as_u64).collect());
    if got.as_ref() != Some(&want) {
        return Err(format!(
            "no_rope_layers {v} is not the pattern llama.cpp runs (RoPE left out of every 4th \
             layer: {want:?})"
        ));
    }
    Ok(())
}

/// Tensors the converter computes from the config (`generate_extra_tensors`): (GGUF name,
/// F32 values).
pub fn computed(
    family: Family,
    cfg: &HfConfig,
    rope: &Rope,
    s: &Shape,
) -> Result<Vec<(String, Vec<f32>)>, Bad> {
    let mut out = Vec::new();
    if family.llama_model()
        && rope
            .rope_type()?
            .is_some_and(|t| t.eq_ignore_ascii_case("llama3"))
    {
        out.push((
            "rope_freqs.weight".into(),
            llama3_factors(rope, s.head_dim)?,
        ));
    }
    if family == Family::Phi3
        && let Some(long) = rope.factors("long_factor")?.filter(|f| !f.is_empty())
    {
        let short = required(rope.factors("short_factor")?, "rope_scaling.short_factor")?;
        let dims = phi3_rope_dims(cfg, rope, s)?;
        if long.len() != short.len() || long.len() as u64 * 2 != dims {
            return Err(format!(
                "rope_scaling has {} long and {} short factors; {dims} rotary dimensions need {}",
                long.len(),
                short.len(),
                dims / 2
            ));
        }
        out.push(("rope_factors_long.weight".into(), long));
        out.push(("rope_factors_short.weight".into(), short));
    }
    Ok(out)
}

/// Llama 3's per-dimension RoPE factors, as `LlamaModel.generate_extra_tensors` computes them,
/// in f32 as its torch code does (`a / t` on a tensor is `t.reciprocal() * a` there).
fn llama3_factors(rope: &Rope, dim: u64) -> Result<Vec<f32>, Bad> {
    let base = rope.num("rope_theta")?.unwrap_or(10_000.0);
    let factor = rope.num("factor")?.unwrap_or(8.0) as f32;
    let low = rope.num("low_freq_factor")?.unwrap_or(1.0) as f32;
    let high = rope.num("high_freq_factor")?.unwrap_or(4.0) as f32;
    let old_ctx = rope
        .num("original_max_position_embeddings")?
        .unwrap_or(8192.0) as f32;
    if base <= 0.0 || factor <= 0.0 || low <= 0.0 || high <= 0.0 || low == high {
        return Err(format!(
            "rope_scaling llama3: theta {base}, factor {factor}, low {low} and high {high} \
             frequency factors do not make a scaling"
        ));
    }
    let (low_wavelen, high_wavelen) = (old_ctx / low, old_ctx / high);
    let two_pi = (2.0 * std::f64::consts::PI) as f32;
    Ok((0..dim / 2)
        .map(|i| {
            let freq = 1.0 / (base as f32).powf((2 * i) as f32 / dim as f32);
            let wavelen = (1.0 / freq) * two_pi;
            if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = ((1.0 / wavelen) * old_ctx - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect())
}

const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// Layer tensors every family names alike.
const LAYER_NAMES: [(&str, &str); 11] = [
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
const PRE_NORM: [(&str, &str); 1] = [("post_attention_layernorm.weight", "ffn_norm.weight")];

/// Gemma's sandwich norms.
const GEMMA_NORMS: [(&str, &str); 3] = [
    (
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
];

const QK_NORMS: [(&str, &str); 2] = [
    ("self_attn.q_norm.weight", "attn_q_norm.weight"),
    ("self_attn.k_norm.weight", "attn_k_norm.weight"),
];

/// Phi-3's fused tensors, kept fused (llama.cpp splits them at run time).
const PHI3_FUSED: [(&str, &str); 2] = [
    ("self_attn.qkv_proj.weight", "attn_qkv.weight"),
    ("mlp.gate_up_proj.weight", "ffn_up.weight"),
];

fn layer_names(family: Family) -> impl Iterator<Item = &'static (&'static str, &'static str)> {
    let norms: &[_] = if family.gemma() {
        &GEMMA_NORMS
    } else {
        &PRE_NORM
    };
    let qk: &[_] = if matches!(family, Family::Qwen3 | Family::Gemma3) {
        &QK_NORMS
    } else {
        &[]
    };
    let fused: &[_] = if family == Family::Phi3 {
        &PHI3_FUSED
    } else {
        &[]
    };
    LAYER_NAMES.iter().chain(norms).chain(qk).chain(fused)
}

/// GGUF name of a Hugging Face tensor of `family`: `None` when no such tensor is known,
/// `Some(None)` for tensors the converter skips (rotary caches; Gemma's `lm_head`, tied).
pub fn gguf_name(family: Family, hf: &str) -> Option<Option<String>> {
    if hf.ends_with(".rotary_emb.inv_freq") || (family.gemma() && hf == "lm_head.weight") {
        return Some(None);
    }
    if let Some((_, g)) = GLOBAL_NAMES.iter().find(|(h, _)| *h == hf) {
        return Some(Some((*g).to_string()));
    }
    let (layer, suffix) = hf.strip_prefix("model.layers.")?.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let (_, g) = layer_names(family).find(|(h, _)| *h == suffix)?;
    Some(Some(format!("blk.{layer}.{g}")))
}

/// Hugging Face name of a GGUF tensor of the Llama family (the inverse of [`gguf_name`]).
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some((h, _)) = GLOBAL_NAMES.iter().find(|(_, g)| *g == gguf) {
        return Some((*h).to_string());
    }
    let (layer, suffix) = gguf.strip_prefix("blk.")?.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let (h, _) = layer_names(Family::Llama).find(|(_, g)| *g == suffix)?;
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

/// The change the converter makes to the GGUF tensor `name` of `family`.
pub fn change(family: Family, name: &str, s: &Shape) -> Change {
    let kind = name.rsplit('.').nth(1);
    if family.llama_model() {
        return match kind {
            Some("attn_q") => Change::Permute(s.heads),
            Some("attn_k") => Change::Permute(s.kv_heads),
            _ => Change::None,
        };
    }
    if family.gemma() && name.ends_with("norm.weight") {
        return Change::PlusOne;
    }
    Change::None
}

/// Gemma 3's real vocabulary (`len(model.vocab) + len(added_tokens)` of tokenizer.json): the
/// converter keeps only that many embedding rows.
pub fn gemma3_vocab(tokenizer: &Json) -> Option<u64> {
    let vocab = tokenizer.get("model")?.get("vocab")?.as_object()?.len();
    let added = tokenizer
        .get("added_tokens")
        .and_then(Json::as_array)
        .map_or(0, Vec::len);
    Some((vocab + added) as u64)
}

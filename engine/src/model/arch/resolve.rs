//! A file's configuration resolved from its GGUF metadata: the keys every architecture shares,
//! read here with range checks, then what its family adds (`FamilyDef::extras`,
//! `FamilyDef::experts`).

use crate::formats::gguf::GgufFile;
use crate::model::arch::family::ExpertWidth;
use crate::model::arch::{Family, lookup, unsupported};
use crate::model::config::{
    ConfigError, Extras, Keys, MAX_CONTEXT, MAX_DIM, MAX_EXPERTS, MAX_LAYERS, ModelConfig,
    MoeConfig, RopeScaling,
};
use crate::model::pooling::Pooling;

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let arch = f.get_str("general.architecture")?.to_string();
        let (family, known) = lookup(&arch).ok_or_else(|| unsupported(&arch))?;
        let k = Keys { f, arch: &arch };
        let n_layers = k.count("block_count", MAX_LAYERS)?;
        let hidden = k.count("embedding_length", MAX_DIM)?;
        let ffn = k.count("feed_forward_length", MAX_DIM)?;
        let n_heads = k.count("attention.head_count", MAX_DIM)?;
        let n_kv_heads = k.count_or("attention.head_count_kv", MAX_DIM, n_heads)?;
        let context_len = k.count("context_length", MAX_CONTEXT)?;
        let head_dim = if k.has("attention.key_length") {
            k.count("attention.key_length", MAX_DIM)?
        } else if hidden.is_multiple_of(n_heads) {
            hidden / n_heads
        } else {
            return Err(ConfigError::Shape(format!(
                "hidden {hidden} is not a multiple of {n_heads} heads"
            )));
        };
        if !n_heads.is_multiple_of(n_kv_heads) {
            return Err(ConfigError::Shape(format!(
                "{n_heads} heads and {n_kv_heads} kv heads do not divide"
            )));
        }
        if k.count_or("attention.value_length", MAX_DIM, head_dim)? != head_dim {
            return Err(ConfigError::Shape(
                "keys and values of different sizes".into(),
            ));
        }
        if head_dim > tpslab_kernels::attn::MAX_HEAD_DIM {
            return Err(ConfigError::Shape(format!(
                "head dimension {head_dim} is over 256"
            )));
        }
        let rope_dim = k.count_or("rope.dimension_count", MAX_DIM, head_dim)?;
        if rope_dim > head_dim || !rope_dim.is_multiple_of(2) {
            return Err(ConfigError::Shape(format!(
                "rope dimension {rope_dim} for head {head_dim}"
            )));
        }
        let vocab = match f.get(&k.key("vocab_size")) {
            Some(_) => k.count("vocab_size", 1 << 22)?,
            None => f.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_theta = k.float_or("rope.freq_base", 10_000.0, false)?;
        let rms_eps = k.float_or("attention.layer_norm_rms_epsilon", 1e-5, true)?;
        let rope_scaling = rope_scaling(&k, context_len)?;
        let mut cfg = Self {
            arch: arch.clone(),
            family,
            n_layers,
            hidden,
            ffn,
            n_heads,
            n_kv_heads,
            head_dim,
            vocab,
            context_len,
            rope_theta,
            rope_dim,
            rope_style: known.rope_style,
            rope_scaling,
            rms_eps,
            extras: Extras::plain(head_dim),
        };
        cfg.extras = extras(&k, family, &cfg)?;
        cfg.extras.moe = moe(&k, family, ffn)?;
        Ok(cfg)
    }
}

/// The `rope.scaling.*` keys, as llama.cpp reads them (`linear` when a factor is given without
/// a type; `none` or a factor of 1 is no scaling).
fn rope_scaling(k: &Keys<'_>, context_len: usize) -> Result<RopeScaling, ConfigError> {
    let factor = if k.has("rope.scaling.factor") {
        k.float_or("rope.scaling.factor", 0.0, true)?
    } else {
        k.float_or("rope.scale_linear", 0.0, true)?
    };
    let kind = k.str_or("rope.scaling.type", "linear")?;
    if factor == 0.0 || factor == 1.0 || kind == "none" {
        return Ok(RopeScaling::None);
    }
    Ok(match kind {
        "linear" => RopeScaling::Linear { factor },
        "yarn" => RopeScaling::Yarn {
            factor,
            orig_ctx: k.count_or(
                "rope.scaling.original_context_length",
                MAX_CONTEXT,
                context_len,
            )?,
        },
        // LongRoPE's scaling is its factor tensors (and attn_factor), read elsewhere.
        "longrope" => RopeScaling::None,
        other => {
            return Err(ConfigError::Shape(format!(
                "RoPE scaling type '{other}' is not supported"
            )));
        }
    })
}

/// The keys any architecture may carry (`rope.scaling.attn_factor`, the window), then the
/// family's own (llama.cpp's `load_arch_hparams`).
fn extras(k: &Keys<'_>, family: Family, c: &ModelConfig) -> Result<Extras, ConfigError> {
    let mut e = Extras::plain(c.head_dim);
    e.rope_attn_factor = k.float_or("rope.scaling.attn_factor", 1.0, false)?;
    if k.has("pooling_type") {
        e.pooling = Pooling::from_gguf(k.f.get_u64(&k.key("pooling_type"))?);
    }
    // 0 (or no key) is no window.
    let window = match k.f.get(&k.key("attention.sliding_window")) {
        Some(_) => {
            k.f.get_u64(&k.key("attention.sliding_window"))?
                .min(MAX_CONTEXT) as usize
        }
        None => 0,
    };
    family.def().extras(k, c, window, &mut e)?;
    Ok(e)
}

/// The experts, when the file has them (`expert_count` > 0), counts checked before anything is
/// sized from them: at most llama.cpp's 1024 experts, 1..=n_expert used per token, each as
/// wide as the family's rule says ([`ExpertWidth`]) and routed by it.
fn moe(k: &Keys<'_>, family: Family, ffn: usize) -> Result<Option<MoeConfig>, ConfigError> {
    let rule = family.def().experts(k.arch);
    let n_expert = match k.f.get(&k.key("expert_count")) {
        Some(_) => k.f.get_u64(&k.key("expert_count"))?,
        None => 0,
    };
    if n_expert == 0 {
        if rule.required {
            return Err(ConfigError::Shape(format!(
                "{} must be set for {}",
                k.key("expert_count"),
                k.arch
            )));
        }
        return Ok(None);
    }
    if n_expert > MAX_EXPERTS {
        return Err(ConfigError::Shape(format!(
            "{} = {n_expert} is past {MAX_EXPERTS}",
            k.key("expert_count")
        )));
    }
    let n_used = k.count("expert_used_count", n_expert)?;
    let ffn_exp = match rule.width {
        ExpertWidth::Dense => ffn,
        ExpertWidth::KeyOrShare => {
            k.count_or("expert_feed_forward_length", MAX_DIM, ffn / n_used)?
        }
        ExpertWidth::Key => k.count("expert_feed_forward_length", MAX_DIM)?,
    };
    if ffn_exp == 0 {
        return Err(ConfigError::Shape("experts of width 0".into()));
    }
    Ok(Some(MoeConfig {
        n_expert: n_expert as usize,
        ffn_exp,
        router: rule.router(n_used),
    }))
}

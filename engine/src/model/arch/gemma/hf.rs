//! The Gemma family's Hugging Face mapping, convert_hf_to_gguf's `Gemma2Model` and
//! `Gemma3Model`: their keys and defaults, the sandwich norms' names, norm weights stored as
//! `1 + w`, the tied `lm_head` skipped, Gemma 3's embedding cut to the real vocabulary.

use serde_json::{Map, Value as Json};

use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{Bad, Md, Rope, Shape, num, own_shape_keys, required, uint};

/// Gemma's sandwich norms.
pub const NORMS: [(&str, &str); 3] = [
    (
        "post_attention_layernorm.weight",
        "post_attention_norm.weight",
    ),
    ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
    ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
];


/// `Gemma2Model.set_gguf_parameters`: its own list, no RoPE keys.
pub fn gemma2(md: &mut Md, cfg: &HfConfig, j: &Map<String, Json>, s: &Shape) -> Result<(), Bad> {
    own_shape_keys(md, cfg, s)?;
    let head_dim = required(cfg.head_dim, "head_dim")?;
    md.u32("attention.key_length", head_dim)?;
    md.u32("attention.value_length", head_dim)?;
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        md.f32(key, required(num(j, key)?, key)?)?;
    }
    let window = required(uint(j, "sliding_window")?, "sliding_window")?;
    md.u32("attention.sliding_window", window)
}

/// `Gemma3Model.set_gguf_parameters`, over the keys every text model writes: its defaults, the global
/// base, the final soft-cap and the window.
pub fn gemma3(
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

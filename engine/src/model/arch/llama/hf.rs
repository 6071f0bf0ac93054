//! The Llama family's Hugging Face mapping, convert_hf_to_gguf's `LlamaModel` (which SmolLM3
//! subclasses): Q and K rows permuted into GGUF's interleaved RoPE layout, `vocab_size` and
//! `rope.dimension_count` written, Mistral's window kept, Llama 3's `rope_freqs` computed.

use serde_json::{Map, Value as Json};

use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{Bad, Change, Md, Rope, Shape, text_model, uint};
use crate::model::arch::family::{HfClass, HfInput};

/// The classes, and the GGUF architecture both are written as.
pub const CLASSES: [HfClass; 2] = [
    HfClass {
        class: "LlamaForCausalLM",
        model_types: &["llama"],
        gguf_arch: "llama",
    },
    HfClass {
        class: "MistralForCausalLM",
        model_types: &["mistral"],
        gguf_arch: "llama",
    },
];

/// transformers' `LlamaConfig` / `MistralConfig`: the head size is `hidden / heads`.
pub fn head_dim_default(cfg: &mut HfConfig) {
    if cfg.head_dim.is_none() {
        cfg.head_dim = cfg
            .num_attention_heads
            .filter(|&h| h > 0)
            .map(|h| cfg.hidden_size / h);
    }
}

/// `LlamaModel.set_gguf_parameters`: the text model's keys, the vocabulary and the rotary
/// dimensions.
pub fn llama_model_keys(md: &mut Md, x: &HfInput<'_>) -> Result<(), Bad> {
    text_model(md, x.cfg, x.j, x.rope)?;
    md.u32("vocab_size", x.cfg.vocab_size)?;
    md.u32("rope.dimension_count", x.shape.head_dim)
}

/// The converter drops Mistral's window (llama.cpp then attends over everything);
/// transformers slides it, so the window is kept, as the engine's GGUF Mistral does.
pub fn mistral_window(md: &mut Md, j: &Map<String, Json>) -> Result<(), Bad> {
    if let Some(w) = uint(j, "sliding_window")?.filter(|&w| w > 0) {
        md.u32("attention.sliding_window", w)?;
    }
    Ok(())
}

/// `LlamaModel.permute`: Q and K rows into GGUF's interleaved RoPE layout.
pub fn permute(name: &str, s: &Shape) -> Change {
    match name.rsplit('.').nth(1) {
        Some("attn_q") => Change::Permute(s.heads),
        Some("attn_k") => Change::Permute(s.kv_heads),
        _ => Change::None,
    }
}

/// `LlamaModel.generate_extra_tensors`: Llama 3's `rope_freqs` when the scaling says `llama3`.
pub fn llama3_tensors(x: &HfInput<'_>) -> Result<Vec<(String, Vec<f32>)>, Bad> {
    let llama3 = x
        .rope
        .rope_type()?
        .is_some_and(|t| t.eq_ignore_ascii_case("llama3"));
    if !llama3 {
        return Ok(Vec::new());
    }
    Ok(vec![(
        "rope_freqs.weight".into(),
        llama3_factors(x.rope, x.shape.head_dim)?,
    )])
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

//! The Llama block, the recipe most families run (llama.cpp's `src/models/llama.cpp`,
//! `qwen2.cpp`, `qwen3.cpp`, `smollm3.cpp`, `phi3.cpp`): pre-norm blocks of grouped-query
//! attention with RoPE and a SwiGLU feed-forward block, and its loader. What the families that
//! run it add, each read from the file when it is there:
//! - Q/K/V biases (Qwen2); per-head Q and K norms before RoPE (Qwen3);
//! - layers without RoPE (SmolLM3: every fourth);
//! - fused `attn_qkv` and gate-up (`ffn_up` of twice the width, no `ffn_gate`) tensors (Phi-3);
//! - RoPE frequency factors: Llama 3's `rope_freqs`, Phi-3's LongRoPE short / long factors;
//! - a sliding window where the metadata sets one (Mistral);
//! - a mixture of experts in place of the FFN (Mixtral-style `llama` files with
//!   `ffn_gate_inp` and `ffn_{gate,up,down}_exps`; `qwen3moe`, which is Qwen3 with experts).
//!
//! The output projection is tied to the embedding when the file has no `output.weight`.

use crate::formats::gguf::GgufFile;
use crate::model::config::ModelConfig;
use crate::model::ops::{Activation, AttnOpts, Buf, Heads, Ops, Rope};
use crate::model::weights::{
    Expert, Ffn, LayerWeights, Linear, MoeWeights, WeightError, Weights, experts, linear,
    optional_vector, vector,
};

/// Stacks `parts` into one matrix (Q/K/V, gate/up), or errs naming the tensor.
fn stack(parts: &[&Linear], name: String) -> Result<Linear, WeightError> {
    Linear::concat(parts).ok_or(WeightError::Stack(name))
}

/// `blk.{i}.attn_qkv.weight` when the file fuses Q, K and V (Phi-3), else the three stacked,
/// with their biases where the file has them (Qwen2, gpt-oss).
pub(crate) fn qkv(f: &GgufFile, cfg: &ModelConfig, i: usize) -> Result<Linear, WeightError> {
    let (h, q_dim, kv) = (cfg.hidden as u64, cfg.q_dim() as u64, cfg.kv_dim() as u64);
    let p = |s: &str| format!("blk.{i}.{s}");
    if f.tensor(&p("attn_qkv.weight")).is_some() {
        let mut w = linear(f, &p("attn_qkv.weight"), h, q_dim + 2 * kv)?;
        w.bias = optional_vector(f, &p("attn_qkv.bias"), q_dim + 2 * kv)?;
        return Ok(w);
    }
    let mut q = linear(f, &p("attn_q.weight"), h, q_dim)?;
    let mut k = linear(f, &p("attn_k.weight"), h, kv)?;
    let mut v = linear(f, &p("attn_v.weight"), h, kv)?;
    q.bias = optional_vector(f, &p("attn_q.bias"), q_dim)?;
    k.bias = optional_vector(f, &p("attn_k.bias"), kv)?;
    v.bias = optional_vector(f, &p("attn_v.bias"), kv)?;
    stack(&[&q, &k, &v], p("attn_qkv"))
}

/// Gate and up stacked, or Phi-3's `ffn_up` that already holds both (gate rows first, as
/// ggml's `swiglu` splits it).
fn gate_up(f: &GgufFile, cfg: &ModelConfig, i: usize) -> Result<Linear, WeightError> {
    let (h, ffn) = (cfg.hidden as u64, cfg.ffn as u64);
    let p = |s: &str| format!("blk.{i}.{s}");
    if f.tensor(&p("ffn_gate.weight")).is_none() {
        return linear(f, &p("ffn_up.weight"), h, 2 * ffn);
    }
    let gate = linear(f, &p("ffn_gate.weight"), h, ffn)?;
    let up = linear(f, &p("ffn_up.weight"), h, ffn)?;
    stack(&[&gate, &up], p("ffn_gate_up"))
}

/// The block's FFN: the dense gate/up and down, or (when the configuration has experts) the
/// router and the experts of the 3-D `ffn_{gate,up,down}_exps` tensors, each expert's gate and
/// up stacked; with the router's and the experts' biases where the file has them (gpt-oss).
pub(crate) fn ffn(f: &GgufFile, cfg: &ModelConfig, i: usize) -> Result<Ffn, WeightError> {
    let h = cfg.hidden as u64;
    let p = |s: &str| format!("blk.{i}.{s}");
    let Some(m) = cfg.extras.moe else {
        return Ok(Ffn::Dense {
            gate_up: gate_up(f, cfg, i)?,
            down: linear(f, &p("ffn_down.weight"), cfg.ffn as u64, h)?,
        });
    };
    let (fe, ne) = (m.ffn_exp as u64, m.n_expert as u64);
    let mut router = linear(f, &p("ffn_gate_inp.weight"), h, ne)?;
    router.bias = optional_vector(f, &p("ffn_gate_inp.bias"), ne)?;
    let gates = experts(f, &p("ffn_gate_exps"), h, fe, ne)?;
    let ups = experts(f, &p("ffn_up_exps"), h, fe, ne)?;
    let downs = experts(f, &p("ffn_down_exps"), fe, h, ne)?;
    let mut list = Vec::with_capacity(m.n_expert);
    for (e, ((g, u), d)) in gates.iter().zip(&ups).zip(downs).enumerate() {
        list.push(Expert {
            gate_up: stack(&[g, u], p(&format!("ffn_gate_up_exps[{e}]")))?,
            down: d,
        });
    }
    Ok(Ffn::Moe(MoeWeights {
        router,
        experts: list,
        rule: m.router,
    }))
}

/// The RoPE frequency factors: `rope_freqs` (Llama 3), else Phi-3's LongRoPE factors, the long
/// ones when the model's context is past the one it was trained at (llama.cpp picks by the
/// context it runs at; this engine runs up to the model's full context).
fn rope_factors(f: &GgufFile, cfg: &ModelConfig) -> Result<Option<Vec<f32>>, WeightError> {
    let half = (cfg.rope_dim / 2) as u64;
    if let Some(v) = optional_vector(f, "rope_freqs.weight", half)? {
        return Ok(Some(v));
    }
    let orig = match f.get(&format!(
        "{}.rope.scaling.original_context_length",
        cfg.arch
    )) {
        Some(v) => v.as_u64().unwrap_or(0) as usize,
        None => cfg.context_len,
    };
    let name = if cfg.context_len > orig {
        "rope_factors_long.weight"
    } else {
        "rope_factors_short.weight"
    };
    optional_vector(f, name, half)
}

/// The output projection, or `None` when it is tied to the embedding.
fn lm_head(f: &GgufFile, cfg: &ModelConfig) -> Result<Option<Linear>, WeightError> {
    match f.tensor("output.weight") {
        Some(_) => Ok(Some(linear(
            f,
            "output.weight",
            cfg.hidden as u64,
            cfg.vocab as u64,
        )?)),
        None => Ok(None),
    }
}

/// The weights by GGUF tensor name, Q/K/V and gate/up stacked into one matrix each.
pub fn load(f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    let (h, hd) = (cfg.hidden as u64, cfg.head_dim as u64);
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        layers.push(LayerWeights {
            attn_norm: vector(f, &p("attn_norm.weight"), h)?,
            wqkv: qkv(f, cfg, i)?,
            q_norm: optional_vector(f, &p("attn_q_norm.weight"), hd)?,
            k_norm: optional_vector(f, &p("attn_k_norm.weight"), hd)?,
            attn_sinks: None,
            wo: linear(f, &p("attn_output.weight"), cfg.q_dim() as u64, h)?,
            post_attn_norm: None,
            ffn_norm: vector(f, &p("ffn_norm.weight"), h)?,
            ffn: ffn(f, cfg, i)?,
            post_ffn_norm: None,
        });
    }
    Ok(Weights {
        embed: linear(f, "token_embd.weight", h, cfg.vocab as u64)?,
        layers,
        out_norm: vector(f, "output_norm.weight", h)?,
        lm_head: lm_head(f, cfg)?,
        rope_factors: rope_factors(f, cfg)?,
    })
}

/// Q/K norms (when the layer has them), RoPE with the KV store, and attention (with the
/// layer's sinks, when it has them): the part of a block every family shares, from `Buf::Qkv`
/// to `Buf::Attn`.
fn attend<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    l: &LayerWeights<O::Matrix, O::Vector>,
    li: usize,
    o: &mut O,
) -> Result<(), O::Error> {
    let heads = Heads::of(c);
    if let (Some(q), Some(k)) = (&l.q_norm, &l.k_norm) {
        o.qk_norm(Buf::Qkv, heads, q, k, c.rms_eps)?;
    }
    o.rope_store(
        li,
        Buf::Qkv,
        heads,
        Rope::of(c, li),
        w.rope_factors.as_ref(),
    )?;
    let sinks = l.attn_sinks.as_ref();
    o.attention(li, Buf::Qkv, heads, AttnOpts::of(c, li), sinks, Buf::Attn)
}

/// The recipe. Each block's residual add is fused into the next norm (`add_rms_norm`); the last
/// block's is a plain add before the output norm of the sampled rows.
pub fn forward<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    o: &mut O,
) -> Result<(), O::Error> {
    let eps = c.rms_eps;
    o.embed(&w.embed, Buf::X)?;
    // `c.n_layers` below the file's: an early exit (self-speculative drafting).
    for (li, l) in w.layers.iter().enumerate().take(c.n_layers) {
        attention_block(c, w, l, li, o)?;
        o.add_rms_norm(Buf::X, Buf::Tmp, &l.ffn_norm, eps, Buf::H)?;
        ffn_block(&l.ffn, Activation::Silu, o)?;
    }
    output(c, w, o)
}

/// The FFN of a block from `Buf::H` to `Buf::Tmp`: one gated FFN, or the mixture of experts.
pub(crate) fn ffn_block<O: Ops>(
    ffn: &Ffn<O::Matrix>,
    act: Activation,
    o: &mut O,
) -> Result<(), O::Error> {
    match ffn {
        Ffn::Dense { gate_up, down } => o.gated_ffn(gate_up, down, act, Buf::H, Buf::Tmp),
        Ffn::Moe(m) => o.moe_ffn(m, act, Buf::H, Buf::Tmp),
    }
}

/// Layer `li` from its input norm to the attention output in `Buf::Tmp`: the previous block's
/// residual add fused into the norm (a plain norm for the first layer), Q/K/V, attention and the
/// output projection. Every family's block starts so.
pub(crate) fn attention_block<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    l: &LayerWeights<O::Matrix, O::Vector>,
    li: usize,
    o: &mut O,
) -> Result<(), O::Error> {
    if li == 0 {
        o.rms_norm(Buf::X, &l.attn_norm, c.rms_eps, Buf::H)?;
    } else {
        o.add_rms_norm(Buf::X, Buf::Tmp, &l.attn_norm, c.rms_eps, Buf::H)?;
    }
    o.linear(&l.wqkv, Buf::H, Buf::Qkv)?;
    attend(c, w, l, li, o)?;
    o.linear(&l.wo, Buf::Attn, Buf::Tmp)
}

/// The last block's residual add, the output norm of the sampled rows and their logits.
pub(crate) fn output<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    o: &mut O,
) -> Result<(), O::Error> {
    o.add(Buf::X, Buf::Tmp)?;
    o.gather_rms_norm(Buf::X, &w.out_norm, c.rms_eps, Buf::Last)?;
    o.logits(w.lm_head(), Buf::Last, Buf::Logits)
}

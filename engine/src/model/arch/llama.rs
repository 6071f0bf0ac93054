//! The Llama family (llama.cpp's `src/models/llama.cpp`, `qwen2.cpp`): pre-norm blocks of
//! grouped-query attention with RoPE (Q/K/V biases where the file has them, as Qwen2 does) and
//! a SwiGLU feed-forward block; the output projection tied to the embedding when the file has no
//! `output.weight`.

use crate::formats::gguf::{GgmlType, GgufFile};
use crate::model::config::ModelConfig;
use crate::model::ops::{Activation, Buf, Heads, Ops, Rope};
use crate::model::weights::{
    LayerWeights, Linear, WeightError, Weights, linear, optional_vector, vector,
};

/// The weights by GGUF tensor name, Q/K/V and gate/up stacked into one matrix each.
pub fn load(f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    let (h, kv, ffn) = (cfg.hidden as u64, cfg.kv_dim() as u64, cfg.ffn as u64);
    let embed = linear(f, "token_embd.weight", h, cfg.vocab as u64)?;
    let lm_head = match f.tensor("output.weight") {
        Some(_) => Some(linear(f, "output.weight", h, cfg.vocab as u64)?),
        None => None,
    };
    let out_norm = vector(f, "output_norm.weight", h)?;
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        let mut q = linear(f, &p("attn_q.weight"), h, h)?;
        let mut k = linear(f, &p("attn_k.weight"), h, kv)?;
        let mut v = linear(f, &p("attn_v.weight"), h, kv)?;
        // Qwen2 has biases on Q, K and V.
        q.bias = optional_vector(f, &p("attn_q.bias"), h)?;
        k.bias = optional_vector(f, &p("attn_k.bias"), kv)?;
        v.bias = optional_vector(f, &p("attn_v.bias"), kv)?;
        let gate = linear(f, &p("ffn_gate.weight"), h, ffn)?;
        let up = linear(f, &p("ffn_up.weight"), h, ffn)?;
        let stack = |parts: &[&Linear], what: &str| {
            Linear::concat(parts).ok_or_else(|| WeightError::Type {
                name: format!("blk.{i}.{what} (parts differ in type)"),
                ty: GgmlType::F32,
            })
        };
        layers.push(LayerWeights {
            attn_norm: vector(f, &p("attn_norm.weight"), h)?,
            wqkv: stack(&[&q, &k, &v], "attn_qkv")?,
            wo: linear(f, &p("attn_output.weight"), h, h)?,
            ffn_norm: vector(f, &p("ffn_norm.weight"), h)?,
            w_gate_up: stack(&[&gate, &up], "ffn_gate_up")?,
            w_down: linear(f, &p("ffn_down.weight"), ffn, h)?,
        });
    }
    Ok(Weights {
        embed,
        layers,
        out_norm,
        lm_head,
    })
}

/// The recipe. Each block's residual add is fused into the next norm (`add_rms_norm`); the last
/// block's is a plain add before the output norm of the sampled rows.
pub fn forward<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    o: &mut O,
) -> Result<(), O::Error> {
    let (heads, rope, eps) = (Heads::of(c), Rope::of(c), c.rms_eps);
    o.embed(&w.embed, Buf::X)?;
    for (li, l) in w.layers.iter().enumerate() {
        if li == 0 {
            o.rms_norm(Buf::X, &l.attn_norm, eps, Buf::H)?;
        } else {
            o.add_rms_norm(Buf::X, Buf::Tmp, &l.attn_norm, eps, Buf::H)?;
        }
        o.linear(&l.wqkv, Buf::H, Buf::Qkv)?;
        o.rope_store(li, Buf::Qkv, heads, rope)?;
        o.attention(li, Buf::Qkv, heads, Buf::Attn)?;
        o.linear(&l.wo, Buf::Attn, Buf::Tmp)?;
        o.add_rms_norm(Buf::X, Buf::Tmp, &l.ffn_norm, eps, Buf::H)?;
        o.gated_ffn(&l.w_gate_up, &l.w_down, Activation::Silu, Buf::H, Buf::Tmp)?;
    }
    o.add(Buf::X, Buf::Tmp)?;
    o.gather_rms_norm(Buf::X, &w.out_norm, eps, Buf::Last)?;
    o.logits(w.lm_head(), Buf::Last, Buf::Logits)
}

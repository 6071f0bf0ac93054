//! gpt-oss (llama.cpp's `src/models/openai-moe.cpp`, `LLM_ARCH_OPENAI_MOE`): the Llama block
//! with what OpenAI's open-weight models add:
//! - biases on Q, K, V and the attention output;
//! - a learned sink logit per query head (`attn_sinks`) in every attention softmax;
//! - sliding-window layers (the even ones) alternating with full ones, YaRN on both;
//! - a mixture of experts in every layer, behind the norm llama.cpp calls
//!   `post_attention_norm`: a router with a bias, the top-k logits softmaxed, experts with
//!   biases on gate, up and down, gated by OpenAI's clamped SwiGLU (`swiglu_oai`). The experts
//!   are MXFP4 in the released files.
//!
//! The output projection is always its own tensor. Everything else is the Llama recipe's
//! (`llama::attention_block`, `llama::output`), which passes the sinks to the attention.

use crate::formats::gguf::{GgufError, GgufFile};
use crate::model::arch::llama::block::{self as llama, attention_block, ffn_block, output};
use crate::model::config::ModelConfig;
use crate::model::ops::{Activation, Buf, Ops};
use crate::model::weights::{Ffn, LayerWeights, WeightError, Weights, linear, vector};

/// `name` must be in the file (llama.cpp requires every bias of the family).
fn require(f: &GgufFile, name: &str) -> Result<(), WeightError> {
    match f.tensor(name) {
        Some(_) => Ok(()),
        None => Err(GgufError::MissingTensor(name.into()).into()),
    }
}

/// The weights by GGUF tensor name: the Llama family's Q/K/V (with their biases) and experts
/// (with the router's and the experts' biases), the output projection's bias, the sinks, and
/// `post_attention_norm` as the FFN's norm.
pub fn load(f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    let (h, q_dim) = (cfg.hidden as u64, cfg.q_dim() as u64);
    let mut layers = Vec::with_capacity(cfg.n_layers);
    for i in 0..cfg.n_layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        for b in [
            "attn_q.bias",
            "attn_k.bias",
            "attn_v.bias",
            "ffn_gate_inp.bias",
            "ffn_gate_exps.bias",
            "ffn_up_exps.bias",
            "ffn_down_exps.bias",
        ] {
            require(f, &p(b))?;
        }
        let ffn = llama::ffn(f, cfg, i)?;
        if !matches!(ffn, Ffn::Moe(_)) {
            return Err(GgufError::MissingTensor(p("ffn_gate_exps.weight")).into());
        }
        let mut wo = linear(f, &p("attn_output.weight"), q_dim, h)?;
        wo.bias = Some(vector(f, &p("attn_output.bias"), h)?);
        layers.push(LayerWeights {
            attn_norm: vector(f, &p("attn_norm.weight"), h)?,
            wqkv: llama::qkv(f, cfg, i)?,
            q_norm: None,
            k_norm: None,
            attn_sinks: Some(vector(f, &p("attn_sinks.weight"), cfg.n_heads as u64)?),
            wo,
            post_attn_norm: None,
            ffn_norm: vector(f, &p("post_attention_norm.weight"), h)?,
            ffn,
            post_ffn_norm: None,
        });
    }
    Ok(Weights {
        embed: linear(f, "token_embd.weight", h, cfg.vocab as u64)?,
        layers,
        out_norm: vector(f, "output_norm.weight", h)?,
        lm_head: Some(linear(f, "output.weight", h, cfg.vocab as u64)?),
        rope_factors: None,
    })
}

/// The recipe: the Llama block (sinks and biases ride on its weights) with the experts gated
/// by OpenAI's SwiGLU.
pub fn forward<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    o: &mut O,
) -> Result<(), O::Error> {
    o.embed(&w.embed, Buf::X)?;
    // `c.n_layers` below the file's: an early exit (self-speculative drafting).
    for (li, l) in w.layers.iter().enumerate().take(c.n_layers) {
        attention_block(c, w, l, li, o)?;
        o.add_rms_norm(Buf::X, Buf::Tmp, &l.ffn_norm, c.rms_eps, Buf::H)?;
        ffn_block(&l.ffn, Activation::SwigluOai, o)?;
    }
    output(c, w, o)
}

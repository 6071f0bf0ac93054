//! The Gemma family (llama.cpp's `src/models/gemma2.cpp`, `gemma3.cpp`): the embedding scaled by
//! `sqrt(hidden)`; RMS norms before and after both attention and the FFN (the "sandwich"); a
//! GELU-tanh gated FFN; queries scaled before attention; local (sliding-window) and global
//! layers, the local ones with their own RoPE base. Gemma 2 soft-caps attention scores and the
//! logits; Gemma 3 norms each Q and K head instead (and soft-caps the logits only if its file
//! says so). The output projection is the embedding unless the file has `output.weight`.
//!
//! GGUF files store Gemma's norm weights with the `1 +` already added (llama.cpp's converter
//! does it), so every norm here is a plain RMS norm.

use crate::formats::gguf::GgufFile;
use crate::model::arch::llama::block::{self as llama, attention_block, ffn_block, output};
use crate::model::config::ModelConfig;
use crate::model::ops::{Activation, Buf, Ops};
use crate::model::weights::{WeightError, Weights, vector};

/// The weights by GGUF tensor name: the Llama family's, plus the norms after attention and
/// after the FFN.
pub fn load(f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    let h = cfg.hidden as u64;
    let mut w = llama::load(f, cfg)?;
    for (i, l) in w.layers.iter_mut().enumerate() {
        l.post_attn_norm = Some(vector(
            f,
            &format!("blk.{i}.post_attention_norm.weight"),
            h,
        )?);
        l.post_ffn_norm = Some(vector(f, &format!("blk.{i}.post_ffw_norm.weight"), h)?);
    }
    Ok(w)
}

/// The recipe. The block output is normed in place (`Tmp`) before its residual add, which is
/// fused into the next norm as in the Llama recipe.
pub fn forward<O: Ops>(
    c: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    o: &mut O,
) -> Result<(), O::Error> {
    let eps = c.rms_eps;
    o.embed(&w.embed, Buf::X)?;
    if let Some(s) = c.extras.embed_scale {
        o.scale(Buf::X, s)?;
    }
    // `c.n_layers` below the file's: an early exit (self-speculative drafting).
    for (li, l) in w.layers.iter().enumerate().take(c.n_layers) {
        attention_block(c, w, l, li, o)?;
        if let Some(n) = &l.post_attn_norm {
            o.rms_norm(Buf::Tmp, n, eps, Buf::Tmp)?;
        }
        o.add_rms_norm(Buf::X, Buf::Tmp, &l.ffn_norm, eps, Buf::H)?;
        ffn_block(&l.ffn, Activation::GeluTanh, o)?;
        if let Some(n) = &l.post_ffn_norm {
            o.rms_norm(Buf::Tmp, n, eps, Buf::Tmp)?;
        }
    }
    output(c, w, o)?;
    if let Some(cap) = c.extras.final_softcap {
        o.softcap(Buf::Logits, cap)?;
    }
    Ok(())
}

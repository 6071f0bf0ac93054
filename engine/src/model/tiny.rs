//! Tiny random models of each architecture, written as that family's real GGUF files are laid
//! out (tensor names, shapes, metadata keys as llama.cpp's converter writes them), with a real
//! tokenizer copied from a vocabulary-only GGUF (llama.cpp's `models/ggml-vocab-*.gguf`). They
//! are how the engine is held against llama.cpp for families with no real checkpoint here: the
//! same file is run by both, and the test compares log-probabilities, greedy tokens and
//! perplexity (`tests/parity/arch_reference.rs`, references recorded by
//! `tests/reference/make-arch-refs.sh`).
//!
//! Weights are F32 (gpt-oss's experts MXFP4, as its released files have them, except in
//! [`write_tiny_f32`]'s files, which the llama.cpp references are recorded on), seeded by the
//! tensor's name, so a file's bytes depend on its variant and vocabulary only. Each variant
//! turns on what its family adds: Llama 3's `rope_freqs`, Qwen2's biases with YaRN scaling,
//! Qwen3's QK-norm with a head size that is not `hidden / heads`, Gemma's sandwich norms,
//! soft-caps and sliding windows, Phi-3's fused tensors and LongRoPE factors, SmolLM3's layers
//! without RoPE, Qwen3-MoE's and Mixtral's experts (3-D `ffn_*_exps` tensors and a router),
//! gpt-oss's biases everywhere, attention sinks, alternating windows with YaRN and MXFP4
//! experts.

use std::path::Path;

use crate::formats::gguf::{GgufFile, Value};
use crate::formats::gguf_write::{GgufWriteError, TensorDesc, write_gguf};
use crate::model::arch::Family;
use crate::model::arch::family::{
    TINY_FFN as FFN, TINY_HEADS as HEADS, TINY_HIDDEN as HIDDEN, TINY_KV_HEADS as KV_HEADS,
    TinySpec, TinyValue,
};
use tpslab_kernels::WType;

pub use crate::model::arch::family::{TINY_CONTEXT as CONTEXT, TINY_WINDOW as WINDOW};

/// Every tiny variant, from the families' lists (`FamilyDef::tiny`), in the registry's order.
fn specs() -> impl Iterator<Item = (Family, &'static TinySpec)> {
    crate::model::arch::listed(|d| d.tiny())
}

/// The variants' names: every registered architecture's (`mistral` with a sliding window;
/// `mistral` and `smollm` are names llama.cpp does not use, their files say `llama`), and
/// `mixtral`, a `llama` file with expert tensors as Mixtral's are (llama.cpp runs it: the file
/// says `llama`).
pub fn variants() -> Vec<&'static str> {
    specs().map(|(_, t)| t.variant).collect()
}

/// The spec of a variant (its file's architecture, experts, reference vocabulary).
pub fn spec(variant: &str) -> Option<&'static TinySpec> {
    specs().find(|(_, t)| t.variant == variant).map(|(_, t)| t)
}

#[derive(Debug, thiserror::Error)]
pub enum TinyError {
    #[error("no tiny variant '{0}' (known: {known})", known = variants().join(", "))]
    Variant(String),
    #[error("vocabulary file: {0}")]
    Vocab(#[from] crate::formats::gguf::GgufError),
    #[error(transparent)]
    Write(#[from] GgufWriteError),
    #[error("the tokenizer metadata has no tokenizer.ggml.tokens")]
    NoTokens,
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
}

/// Uniform floats in `[lo, hi)` from a generator seeded by `name` (FNV-1a, then xorshift).
fn uniform(name: &str, n: u64, lo: f32, hi: f32) -> Vec<u8> {
    let mut s = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    }) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let u = (s >> 40) as f32 / (1u64 << 24) as f32;
            (lo + (hi - lo) * u).to_le_bytes()
        })
        .collect()
}

/// The head size of `t`.
fn head_dim(t: &TinySpec) -> u64 {
    t.head_dim.unwrap_or(HIDDEN / HEADS)
}

/// The tensors of `t` with a vocabulary of `vocab`: (name, ggml dims, bytes); the experts in
/// the family's released type (`expert_type`) when `as_released`.
fn tensors(t: &TinySpec, vocab: u64, expert_type: Option<WType>) -> Vec<(TensorDesc, Vec<u8>)> {
    let (layers, head_dim) = (t.layers, head_dim(t));
    let (h, q, kv) = (HIDDEN, HEADS * head_dim, KV_HEADS * head_dim);
    let mut out = Vec::new();
    let mut add = |name: String, dims: Vec<u64>| {
        let n: u64 = dims.iter().product();
        let bytes = match dims.as_slice() {
            // Norm weights near 1, biases, sinks and factors of their own ranges.
            [_] if name.ends_with("norm.weight") => uniform(&name, n, 0.8, 1.2),
            [_] if name.contains("rope_f") => uniform(&name, n, 1.0, 4.0),
            [_] if name.ends_with("attn_sinks.weight") => uniform(&name, n, 0.0, 3.0),
            _ if name.ends_with(".bias") => uniform(&name, n, -0.1, 0.1),
            [_] => uniform(&name, n, -0.1, 0.1),
            [_, _] if name == "token_embd.weight" => uniform(&name, n, -0.5, 0.5),
            [k, _] | [k, _, _] => {
                let b = (3.0 / *k as f32).sqrt();
                uniform(&name, n, -b, b)
            }
            _ => Vec::new(),
        };
        out.push((TensorDesc::new(name, dims, WType::F32), bytes));
    };
    add("token_embd.weight".into(), vec![h, vocab]);
    add("output_norm.weight".into(), vec![h]);
    if t.rope_freqs {
        add("rope_freqs.weight".into(), vec![head_dim / 2]);
    }
    if t.longrope {
        add("rope_factors_long.weight".into(), vec![head_dim / 2]);
        add("rope_factors_short.weight".into(), vec![head_dim / 2]);
    }
    for i in 0..layers {
        let p = |s: &str| format!("blk.{i}.{s}");
        add(p("attn_norm.weight"), vec![h]);
        if t.fused {
            add(p("attn_qkv.weight"), vec![h, q + 2 * kv]);
        } else {
            add(p("attn_q.weight"), vec![h, q]);
            add(p("attn_k.weight"), vec![h, kv]);
            add(p("attn_v.weight"), vec![h, kv]);
        }
        if t.qkv_bias {
            add(p("attn_q.bias"), vec![q]);
            add(p("attn_k.bias"), vec![kv]);
            add(p("attn_v.bias"), vec![kv]);
        }
        if t.qk_norm {
            add(p("attn_q_norm.weight"), vec![head_dim]);
            add(p("attn_k_norm.weight"), vec![head_dim]);
        }
        add(p("attn_output.weight"), vec![q, h]);
        if t.sinks_and_biases {
            add(p("attn_output.bias"), vec![h]);
            add(p("attn_sinks.weight"), vec![HEADS]);
            // gpt-oss's FFN norm, by llama.cpp's name.
            add(p("post_attention_norm.weight"), vec![h]);
        } else {
            add(p("ffn_norm.weight"), vec![h]);
        }
        if let Some((n, _, w)) = t.experts {
            add(p("ffn_gate_inp.weight"), vec![h, n]);
            add(p("ffn_gate_exps.weight"), vec![h, w, n]);
            add(p("ffn_up_exps.weight"), vec![h, w, n]);
            add(p("ffn_down_exps.weight"), vec![w, h, n]);
            if t.sinks_and_biases {
                add(p("ffn_gate_inp.bias"), vec![n]);
                add(p("ffn_gate_exps.bias"), vec![w, n]);
                add(p("ffn_up_exps.bias"), vec![w, n]);
                add(p("ffn_down_exps.bias"), vec![h, n]);
            }
        } else if t.fused {
            add(p("ffn_up.weight"), vec![h, 2 * FFN]);
        } else {
            add(p("ffn_gate.weight"), vec![h, FFN]);
            add(p("ffn_up.weight"), vec![h, FFN]);
        }
        if t.experts.is_none() {
            add(p("ffn_down.weight"), vec![FFN, h]);
        }
        if t.sandwich {
            add(p("post_attention_norm.weight"), vec![h]);
            add(p("post_ffw_norm.weight"), vec![h]);
        }
    }
    if t.sinks_and_biases {
        add("output.weight".into(), vec![h, vocab]);
    }
    // The experts in the released type, quantized from the same floats.
    if let Some(ty) = expert_type {
        for (desc, bytes) in out
            .iter_mut()
            .filter(|(d, _)| d.name.ends_with("_exps.weight"))
        {
            let floats: Vec<f32> = bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect();
            *bytes = tpslab_kernels::quantize::quantize(ty, &floats);
            desc.ty = ty;
        }
    }
    out
}

/// The architecture's metadata (the tokenizer's is copied from the vocabulary file).
fn metadata(t: &TinySpec) -> Vec<(String, Value)> {
    let head_dim = head_dim(t);
    let k = |s: &str| format!("{}.{s}", t.arch);
    let u = |v: u64| Value::U32(v as u32);
    let mut md = vec![
        ("general.architecture".into(), Value::String(t.arch.into())),
        (
            "general.name".into(),
            Value::String(format!("tiny random {}", t.variant)),
        ),
        (k("block_count"), u(t.layers)),
        (k("context_length"), u(CONTEXT)),
        (k("embedding_length"), u(HIDDEN)),
        (k("feed_forward_length"), u(FFN)),
        (k("attention.head_count"), u(HEADS)),
        (k("attention.head_count_kv"), u(KV_HEADS)),
        (k("attention.key_length"), u(head_dim)),
        (k("attention.value_length"), u(head_dim)),
        (k("rope.dimension_count"), u(head_dim)),
        (k("attention.layer_norm_rms_epsilon"), Value::F32(1e-6)),
    ];
    md.extend(t.metadata.iter().map(|&(key, v)| {
        let v = match v {
            TinyValue::U32(x) => u(x),
            TinyValue::F32(x) => Value::F32(x),
            TinyValue::Str(x) => Value::String(x.into()),
        };
        (k(key), v)
    }));
    if let Some((n, used, w)) = t.experts {
        md.extend([(k("expert_count"), u(n)), (k("expert_used_count"), u(used))]);
        if t.expert_width_key {
            md.push((k("expert_feed_forward_length"), u(w)));
        }
    }
    md
}

/// The tokenizer metadata (`tokenizer.*`) of a vocabulary GGUF.
pub fn tokenizer_of(vocab_gguf: &Path) -> Result<Vec<(String, Value)>, TinyError> {
    let f = GgufFile::open(vocab_gguf)?;
    Ok(f.metadata
        .iter()
        .filter(|(key, _)| key.starts_with("tokenizer."))
        .map(|(key, v)| (key.clone(), v.clone()))
        .collect())
}

/// Writes the tiny `arch` model to `out` with the tokenizer metadata `tokenizer` (its
/// vocabulary sizes the embedding), its weights in the types the family's released files have.
pub fn write_tiny(arch: &str, tokenizer: &[(String, Value)], out: &Path) -> Result<(), TinyError> {
    write(arch, tokenizer, out, true)
}

/// As [`write_tiny`] with every weight F32, gpt-oss's experts too: the files the llama.cpp
/// references are recorded on. A quantized expert quantizes its activations as well (to Q8_0
/// in both engines), and on a random router that rounding noise flips which experts a token
/// takes, so two correct engines part by up to 0.1 nats on the MXFP4 file; on F32 experts
/// they agree to 1e-3. MXFP4 itself is held to gguf-py and to the plain dot elsewhere.
pub fn write_tiny_f32(
    arch: &str,
    tokenizer: &[(String, Value)],
    out: &Path,
) -> Result<(), TinyError> {
    write(arch, tokenizer, out, false)
}

fn write(
    arch: &str,
    tokenizer: &[(String, Value)],
    out: &Path,
    as_released: bool,
) -> Result<(), TinyError> {
    let Some((family, spec)) = specs().find(|(_, t)| t.variant == arch) else {
        return Err(TinyError::Variant(arch.into()));
    };
    let vocab = tokenizer
        .iter()
        .find_map(|(k, v)| match v {
            Value::Array(a) if k == "tokenizer.ggml.tokens" => Some(a.len() as u64),
            _ => None,
        })
        .ok_or(TinyError::NoTokens)?;
    let mut md = metadata(spec);
    md.extend(tokenizer.iter().cloned());
    let io = |source| TinyError::Io {
        path: out.display().to_string(),
        source,
    };
    let file = std::fs::File::create(out).map_err(io)?;
    let w = write_gguf(
        std::io::BufWriter::new(file),
        &md,
        &tensors(
            spec,
            vocab,
            family.def().released_expert_type().filter(|_| as_released),
        ),
    )?;
    w.into_inner()
        .map_err(|e| io(e.into_error()))?
        .sync_all()
        .map_err(io)?;
    Ok(())
}

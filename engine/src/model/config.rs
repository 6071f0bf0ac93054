//! Model configuration: the typed fields a file's metadata resolves to (the shape, the family,
//! its RoPE layout and what the family adds), and [`Keys`], the range-checked reader of an
//! architecture's metadata keys the families resolve them with. Resolving is
//! `model::arch::resolve`'s, over the registry of families (`model::arch`).

use crate::formats::gguf::{GgufError, GgufFile, Value};

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): GGUF Llama weights are permuted for this (ggml mode 0).
    Interleaved,
    /// First half with second half (x[i], x[i + d/2]): Qwen2 and HF-layout weights (NeoX).
    Neox,
}

/// A family of `model::arch`'s registry, which names each one (`Family::LLAMA`) and answers
/// for it (`Family::def`): a handle, made only by the registry.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Family(pub(crate) u8);

/// How RoPE stretches past the trained context (metadata `rope.scaling.*`), besides the
/// per-dimension frequency factors some files carry as a tensor (Llama 3's `rope_freqs`,
/// Phi-3's LongRoPE factors: [`crate::model::weights::Weights::rope_factors`]).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum RopeScaling {
    #[default]
    None,
    /// Positions divided by `factor` (ggml's `freq_scale = 1 / factor`).
    Linear { factor: f32 },
    /// YaRN: interpolation ramped in between the dimensions that see `orig_ctx` as fast and
    /// slow, with its magnitude correction.
    Yarn { factor: f32, orig_ctx: usize },
}

/// What some families add to the plain Llama block, resolved from their metadata (each `None`
/// or default when a file does not use it).
#[derive(Debug, Clone, PartialEq)]
pub struct Extras {
    /// Sliding-window attention: a token sees the keys of the last `window` positions, itself
    /// included, in the layers `swa_layers` marks (all layers when it is empty).
    pub window: Option<usize>,
    pub swa_layers: Vec<bool>,
    /// The RoPE base of sliding-window layers (Gemma 3's local layers).
    pub rope_theta_swa: f32,
    /// Whether sliding-window layers keep the model's RoPE scaling (gpt-oss: llama.cpp's
    /// `rope_freq_scale_train_swa` is the trained scale) or run unscaled (Gemma 3).
    pub rope_scaled_swa: bool,
    /// `tanh(s / cap) * cap` on attention scores, and on the logits (Gemma 2).
    pub attn_softcap: Option<f32>,
    pub final_softcap: Option<f32>,
    /// The query scale before attention (default `1 / sqrt(head_dim)`).
    pub attn_scale: f32,
    /// The embedding rows are multiplied by this (Gemma: `sqrt(hidden)`).
    pub embed_scale: Option<f32>,
    /// Each block's attention and FFN outputs are multiplied by this before their residual add
    /// (Granite's `residual_scale`).
    pub residual_scale: Option<f32>,
    /// The logits are divided by this (Granite's `logit_scale`).
    pub logit_scale: Option<f32>,
    /// Every `n`-th layer (1-based) has no RoPE (SmolLM3's NoPE layers).
    pub no_rope_every: Option<usize>,
    /// An extra factor on RoPE's cos and sin (`rope.scaling.attn_factor`, LongRoPE).
    pub rope_attn_factor: f32,
    /// Mixture-of-experts FFNs in every layer (`expert_count` > 0).
    pub moe: Option<MoeConfig>,
    /// The file's embedding rule (`pooling_type`), when it names one: an embedding model's.
    pub pooling: Option<crate::model::pooling::Pooling>,
}

/// A mixture-of-experts FFN: how many experts, how wide each is, and the family's routing.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MoeConfig {
    pub n_expert: usize,
    /// Width of one expert's FFN (`expert_feed_forward_length`, or as each family defaults).
    pub ffn_exp: usize,
    pub router: tpslab_kernels::moe::Router,
}

impl Extras {
    /// A plain Llama block with head size `head_dim`.
    pub fn plain(head_dim: usize) -> Self {
        Self {
            window: None,
            swa_layers: Vec::new(),
            rope_theta_swa: 10_000.0,
            rope_scaled_swa: false,
            attn_softcap: None,
            final_softcap: None,
            attn_scale: 1.0 / (head_dim as f32).sqrt(),
            embed_scale: None,
            residual_scale: None,
            logit_scale: None,
            no_rope_every: None,
            rope_attn_factor: 1.0,
            moe: None,
            pooling: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The GGUF `general.architecture` ("llama").
    pub arch: String,
    /// The family that runs it.
    pub family: Family,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Size of one attention head (`attention.key_length`, else `hidden / n_heads`).
    pub head_dim: usize,
    pub vocab: usize,
    pub context_len: usize,
    pub rope_theta: f32,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    pub rms_eps: f32,
    pub extras: Extras,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// An architecture no family runs, with the ones they do.
    #[error("unsupported model architecture '{0}' (supported: {1})")]
    Arch(String, String),
    #[error("bad model shape: {0}")]
    Shape(String),
}

/// Sizes past these are not a real model but a corrupt or hostile file: refuse them before any
/// buffer is sized from them.
pub const MAX_DIM: u64 = 1 << 20;
pub const MAX_LAYERS: u64 = 1024;
pub const MAX_CONTEXT: u64 = 1 << 24;
/// llama.cpp's `LLAMA_MAX_EXPERTS`.
pub const MAX_EXPERTS: u64 = 1024;

/// A file's metadata keys of one architecture, read with range checks.
pub struct Keys<'a> {
    pub f: &'a GgufFile,
    /// The architecture, which prefixes its keys.
    pub arch: &'a str,
}

impl Keys<'_> {
    pub fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    pub fn has(&self, k: &str) -> bool {
        self.f.get(&self.key(k)).is_some()
    }

    /// A count in `1..=max`.
    pub fn count(&self, k: &str, max: u64) -> Result<usize, ConfigError> {
        let v = self.f.get_u64(&self.key(k))?;
        if v == 0 || v > max {
            return Err(ConfigError::Shape(format!(
                "{} = {v} is out of range",
                self.key(k)
            )));
        }
        Ok(v as usize)
    }

    pub fn count_or(&self, k: &str, max: u64, default: usize) -> Result<usize, ConfigError> {
        if self.has(k) {
            self.count(k, max)
        } else {
            Ok(default)
        }
    }

    /// A float that must be finite and positive (or zero when `zero_ok`).
    pub fn float_or(&self, k: &str, default: f32, zero_ok: bool) -> Result<f32, ConfigError> {
        if !self.has(k) {
            return Ok(default);
        }
        let v = self.f.get_f64(&self.key(k))? as f32;
        if !v.is_finite() || v < 0.0 || (v == 0.0 && !zero_ok) {
            return Err(ConfigError::Shape(format!("{} = {v}", self.key(k))));
        }
        Ok(v)
    }

    pub fn str_or<'s>(&'s self, k: &str, default: &'s str) -> Result<&'s str, ConfigError> {
        if self.has(k) {
            Ok(self.f.get_str(&self.key(k))?)
        } else {
            Ok(default)
        }
    }

    /// Which layers slide: `attention.sliding_window_pattern` as a per-layer array, else as a period
    /// `n` (default `default_n`) of which the first `n - 1` layers slide (llama.cpp's
    /// `set_swa_pattern`).
    pub fn swa_pattern(&self, n_layers: usize, default_n: usize) -> Result<Vec<bool>, ConfigError> {
        let k = self;
        let key = k.key("attention.sliding_window_pattern");
        if let Some(Value::Array(items)) = k.f.get(&key) {
            let layers: Option<Vec<bool>> = items
                .iter()
                .map(|v| match v {
                    Value::Bool(b) => Some(*b),
                    _ => None,
                })
                .collect();
            return match layers {
                Some(l) if l.len() == n_layers => Ok(l),
                _ => Err(ConfigError::Shape(format!(
                    "{key} is not {n_layers} booleans"
                ))),
            };
        }
        let n = k.count_or("attention.sliding_window_pattern", MAX_LAYERS, default_n)?;
        Ok((0..n_layers).map(|il| il % n < n - 1).collect())
    }
}

impl ModelConfig {
    /// Width of all query heads of one token.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the concatenated K (or V) vectors of one token.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Whether layer `layer` attends over a sliding window (and how wide it is).
    pub fn window(&self, layer: usize) -> Option<usize> {
        let w = self.extras.window?;
        let swa = &self.extras.swa_layers;
        (swa.is_empty() || swa.get(layer).copied().unwrap_or(false)).then_some(w)
    }

    /// The sliding window when every layer has one (Mistral): then KV blocks that leave it can
    /// be freed, as no layer reads them again.
    pub fn full_window(&self) -> Option<usize> {
        let w = self.extras.window?;
        let swa = &self.extras.swa_layers;
        (swa.is_empty() || swa.iter().all(|&s| s)).then_some(w)
    }

    /// Whether layer `layer` rotates its queries and keys.
    pub fn has_rope(&self, layer: usize) -> bool {
        self.extras
            .no_rope_every
            .is_none_or(|n| !(layer + 1).is_multiple_of(n))
    }

    /// Parameters in the matrices (embedding counted once when tied), for display.
    pub fn n_params(&self) -> u64 {
        let (h, q, kv) = (
            self.hidden as u64,
            self.q_dim() as u64,
            self.kv_dim() as u64,
        );
        let ffn = match &self.extras.moe {
            Some(m) => (3 * h * m.ffn_exp as u64 + h) * m.n_expert as u64,
            None => 3 * h * self.ffn as u64,
        };
        let per_layer = h * q * 2 + h * kv * 2 + ffn + 2 * h;
        per_layer * self.n_layers as u64 + self.vocab as u64 * h + h
    }
}

//! Model configuration resolved once from GGUF metadata into typed fields: the shape, the
//! architecture's recipe ([`Family`]) and its RoPE layout, for every architecture in [`ARCHS`]
//! (the registry; each recipe is in `model::arch`).

use crate::formats::gguf::{GgufError, GgufFile};

/// How rotary embeddings pair up the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs (x[2i], x[2i+1]): GGUF Llama weights are permuted for this (ggml mode 0).
    Interleaved,
    /// First half with second half (x[i], x[i + d/2]): Qwen2 and HF-layout weights (NeoX).
    Neox,
}

/// A recipe: the graph one or more GGUF architectures share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
}

/// What the engine knows of a GGUF `general.architecture` it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// The GGUF name ("llama"), which also prefixes its metadata keys.
    pub name: &'static str,
    pub family: Family,
    pub rope_style: RopeStyle,
}

/// Every architecture the engine runs, by GGUF name.
pub const ARCHS: &[Arch] = &[
    Arch {
        name: "llama",
        family: Family::Llama,
        rope_style: RopeStyle::Interleaved,
    },
    Arch {
        name: "mistral",
        family: Family::Llama,
        rope_style: RopeStyle::Interleaved,
    },
    Arch {
        name: "smollm",
        family: Family::Llama,
        rope_style: RopeStyle::Interleaved,
    },
    Arch {
        name: "qwen2",
        family: Family::Llama,
        rope_style: RopeStyle::Neox,
    },
];

/// The architecture of a GGUF `general.architecture`, if the engine runs it (the library's
/// import check asks this too, so a model it admits is one that loads).
pub fn lookup(name: &str) -> Option<&'static Arch> {
    ARCHS.iter().find(|a| a.name == name)
}

/// The names of [`ARCHS`], for messages ("llama, mistral, ...").
pub fn names() -> String {
    ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The GGUF `general.architecture` ("llama").
    pub arch: String,
    /// The recipe that runs it.
    pub family: Family,
    pub n_layers: usize,
    pub hidden: usize,
    pub ffn: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context_len: usize,
    pub rope_theta: f32,
    pub rope_dim: usize,
    pub rope_style: RopeStyle,
    pub rms_eps: f32,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("unsupported model architecture '{0}' (supported: {names})", names = names())]
    Arch(String),
    #[error("bad model shape: {0}")]
    Shape(String),
}

/// Sizes past these are not a real model but a corrupt or hostile file: refuse them before any
/// buffer is sized from them.
const MAX_DIM: u64 = 1 << 20;
const MAX_LAYERS: u64 = 1024;
const MAX_CONTEXT: u64 = 1 << 24;

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let arch = f.get_str("general.architecture")?.to_string();
        let known = lookup(&arch).ok_or_else(|| ConfigError::Arch(arch.clone()))?;
        let (family, rope_style) = (known.family, known.rope_style);
        let key = |k: &str| format!("{arch}.{k}");
        let bounded = |k: &str, max: u64| -> Result<usize, ConfigError> {
            let v = f.get_u64(&key(k))?;
            if v == 0 || v > max {
                return Err(ConfigError::Shape(format!(
                    "{} = {v} is out of range",
                    key(k)
                )));
            }
            Ok(v as usize)
        };
        let n_layers = bounded("block_count", MAX_LAYERS)?;
        let hidden = bounded("embedding_length", MAX_DIM)?;
        let ffn = bounded("feed_forward_length", MAX_DIM)?;
        let n_heads = bounded("attention.head_count", MAX_DIM)?;
        let n_kv_heads = match f.get(&key("attention.head_count_kv")) {
            Some(_) => bounded("attention.head_count_kv", MAX_DIM)?,
            None => n_heads,
        };
        let context_len = bounded("context_length", MAX_CONTEXT)?;
        if !hidden.is_multiple_of(n_heads) || !n_heads.is_multiple_of(n_kv_heads) {
            return Err(ConfigError::Shape(format!(
                "hidden {hidden}, {n_heads} heads and {n_kv_heads} kv heads do not divide"
            )));
        }
        let head_dim = hidden / n_heads;
        if head_dim > tpslab_kernels::attn::MAX_HEAD_DIM {
            return Err(ConfigError::Shape(format!(
                "head dimension {head_dim} is over 256"
            )));
        }
        let rope_dim = match f.get(&key("rope.dimension_count")) {
            Some(_) => bounded("rope.dimension_count", MAX_DIM)?,
            None => head_dim,
        };
        if rope_dim > head_dim || !rope_dim.is_multiple_of(2) {
            return Err(ConfigError::Shape(format!(
                "rope dimension {rope_dim} for head {head_dim}"
            )));
        }
        let vocab = match f.get(&key("vocab_size")) {
            Some(_) => bounded("vocab_size", 1 << 22)?,
            None => f.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_theta = match f.get(&key("rope.freq_base")) {
            Some(_) => f.get_f64(&key("rope.freq_base"))? as f32,
            None => 10_000.0,
        };
        let rms_eps = match f.get(&key("attention.layer_norm_rms_epsilon")) {
            Some(_) => f.get_f64(&key("attention.layer_norm_rms_epsilon"))? as f32,
            None => 1e-5,
        };
        if !(rope_theta.is_finite() && rope_theta > 0.0 && rms_eps.is_finite() && rms_eps >= 0.0) {
            return Err(ConfigError::Shape(format!(
                "rope base {rope_theta}, rms eps {rms_eps}"
            )));
        }
        Ok(Self {
            arch,
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
            rope_style,
            rms_eps,
        })
    }

    /// Width of the concatenated K (or V) vectors of one token.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Parameters in the matrices (embedding counted once when tied), for display.
    pub fn n_params(&self) -> u64 {
        let h = self.hidden as u64;
        let per_layer = h * h * 2 + h * self.kv_dim() as u64 * 2 + 3 * h * self.ffn as u64 + 2 * h;
        per_layer * self.n_layers as u64 + self.vocab as u64 * h + h
    }
}

//! Model configuration resolved once from GGUF metadata into typed fields: the shape, the
//! architecture's recipe ([`Family`]) and its RoPE layout, for every architecture in [`ARCHS`]
//! (the registry; each recipe is in `model::arch`).

use crate::formats::gguf::{GgufError, GgufFile, Value};

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
    /// Llama, Mistral, SmolLM, Qwen2, Qwen3 (QK-norm), SmolLM3 (layers without RoPE), Phi-3
    /// (fused QKV and gate-up tensors), and their mixtures of experts (Mixtral-style `llama`
    /// files with expert tensors, Qwen3-MoE): pre-norm blocks with a SwiGLU FFN or experts.
    Llama,
    /// Gemma 2 and 3: scaled embeddings, norms before and after attention and FFN, GELU gating,
    /// soft-capping (Gemma 2), local and global layers.
    Gemma,
    /// gpt-oss: the Llama block with biases on Q/K/V and the output, a learned sink logit per
    /// head in each softmax, sliding-window and full layers alternating, YaRN on all of them,
    /// and a mixture of experts with biases behind a router with a bias, gated by OpenAI's
    /// clamped SwiGLU.
    GptOss,
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
    Arch {
        name: "qwen3",
        family: Family::Llama,
        rope_style: RopeStyle::Neox,
    },
    Arch {
        name: "qwen3moe",
        family: Family::Llama,
        rope_style: RopeStyle::Neox,
    },
    Arch {
        name: "smollm3",
        family: Family::Llama,
        rope_style: RopeStyle::Interleaved,
    },
    Arch {
        name: "phi3",
        family: Family::Llama,
        rope_style: RopeStyle::Neox,
    },
    Arch {
        name: "gemma2",
        family: Family::Gemma,
        rope_style: RopeStyle::Neox,
    },
    Arch {
        name: "gemma3",
        family: Family::Gemma,
        rope_style: RopeStyle::Neox,
    },
    Arch {
        name: "gpt-oss",
        family: Family::GptOss,
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
    /// Every `n`-th layer (1-based) has no RoPE (SmolLM3's NoPE layers).
    pub no_rope_every: Option<usize>,
    /// An extra factor on RoPE's cos and sin (`rope.scaling.attn_factor`, LongRoPE).
    pub rope_attn_factor: f32,
    /// Mixture-of-experts FFNs in every layer (`expert_count` > 0).
    pub moe: Option<MoeConfig>,
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
            no_rope_every: None,
            rope_attn_factor: 1.0,
            moe: None,
        }
    }
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
/// llama.cpp's `LLAMA_MAX_EXPERTS`.
const MAX_EXPERTS: u64 = 1024;

/// A file's metadata keys of one architecture, read with range checks.
struct Keys<'a> {
    f: &'a GgufFile,
    arch: &'a str,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch)
    }

    fn has(&self, k: &str) -> bool {
        self.f.get(&self.key(k)).is_some()
    }

    /// A count in `1..=max`.
    fn count(&self, k: &str, max: u64) -> Result<usize, ConfigError> {
        let v = self.f.get_u64(&self.key(k))?;
        if v == 0 || v > max {
            return Err(ConfigError::Shape(format!(
                "{} = {v} is out of range",
                self.key(k)
            )));
        }
        Ok(v as usize)
    }

    fn count_or(&self, k: &str, max: u64, default: usize) -> Result<usize, ConfigError> {
        if self.has(k) {
            self.count(k, max)
        } else {
            Ok(default)
        }
    }

    /// A float that must be finite and positive (or zero when `zero_ok`).
    fn float_or(&self, k: &str, default: f32, zero_ok: bool) -> Result<f32, ConfigError> {
        if !self.has(k) {
            return Ok(default);
        }
        let v = self.f.get_f64(&self.key(k))? as f32;
        if !v.is_finite() || v < 0.0 || (v == 0.0 && !zero_ok) {
            return Err(ConfigError::Shape(format!("{} = {v}", self.key(k))));
        }
        Ok(v)
    }

    fn str_or<'s>(&'s self, k: &str, default: &'s str) -> Result<&'s str, ConfigError> {
        if self.has(k) {
            Ok(self.f.get_str(&self.key(k))?)
        } else {
            Ok(default)
        }
    }
}

impl ModelConfig {
    pub fn from_gguf(f: &GgufFile) -> Result<Self, ConfigError> {
        let arch = f.get_str("general.architecture")?.to_string();
        let known = lookup(&arch).ok_or_else(|| ConfigError::Arch(arch.clone()))?;
        let (family, rope_style) = (known.family, known.rope_style);
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
            rope_style,
            rope_scaling,
            rms_eps,
            extras: Extras::plain(head_dim),
        };
        cfg.extras = extras(&k, &cfg)?;
        cfg.extras.moe = moe(&k, ffn)?;
        Ok(cfg)
    }

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

/// The family extras (sliding window, soft-capping, scales), with llama.cpp's defaults for each
/// architecture (`src/models/<arch>.cpp`, `load_arch_hparams`).
fn extras(k: &Keys<'_>, c: &ModelConfig) -> Result<Extras, ConfigError> {
    let mut e = Extras::plain(c.head_dim);
    e.rope_attn_factor = k.float_or("rope.scaling.attn_factor", 1.0, false)?;
    // 0 (or no key) is no window.
    let window = match k.f.get(&k.key("attention.sliding_window")) {
        Some(_) => {
            k.f.get_u64(&k.key("attention.sliding_window"))?
                .min(MAX_CONTEXT) as usize
        }
        None => 0,
    };
    match k.arch {
        "smollm3" => e.no_rope_every = Some(4),
        "gemma2" => {
            e.window = Some(if window > 0 { window } else { 4096 });
            e.swa_layers = swa_pattern(k, c.n_layers, 2)?;
            e.attn_softcap = Some(k.float_or("attn_logit_softcapping", 50.0, false)?);
            e.final_softcap = Some(k.float_or("final_logit_softcapping", 30.0, false)?);
        }
        "gemma3" => {
            if window > 0 {
                e.window = Some(window);
                e.swa_layers = swa_pattern(k, c.n_layers, 6)?;
            }
            let cap = k.float_or("final_logit_softcapping", 0.0, true)?;
            e.final_softcap = (cap > 0.0).then_some(cap);
        }
        // Phi-3's sliding window is off in llama.cpp (its files set it wrongly).
        "phi3" => {}
        // llama.cpp's `llama_model_openai_moe::load_arch_hparams`: the window is required,
        // every other layer slides (the first does), the sliding layers keep the base and
        // scaling unless the file gives them a base of their own; queries are scaled by the
        // rotated size.
        "gpt-oss" => {
            if window == 0 {
                return Err(ConfigError::Shape(format!(
                    "{} must be set for gpt-oss",
                    k.key("attention.sliding_window")
                )));
            }
            e.window = Some(window);
            e.swa_layers = swa_pattern(k, c.n_layers, 2)?;
            e.rope_theta_swa = k.float_or("rope.freq_base_swa", c.rope_theta, false)?;
            e.rope_scaled_swa = true;
            e.attn_scale = 1.0 / (c.rope_dim as f32).sqrt();
        }
        _ => e.window = (window > 0).then_some(window),
    }
    if c.family == Family::Gemma {
        // Gemma 2's local layers share the global base unless the file says otherwise; Gemma
        // 3's default to 10 000 (llama.cpp's `rope_freq_base_train_swa`).
        let swa_default = if k.arch == "gemma2" {
            c.rope_theta
        } else {
            10_000.0
        };
        e.rope_theta_swa = k.float_or("rope.freq_base_swa", swa_default, false)?;
        e.embed_scale = Some((c.hidden as f32).sqrt());
        // The 27B models (46 and 62 layers) scale queries by hidden / heads, not the head size.
        if matches!((k.arch, c.n_layers), ("gemma2", 46) | ("gemma3", 62)) {
            e.attn_scale = 1.0 / ((c.hidden / c.n_heads) as f32).sqrt();
        }
    }
    Ok(e)
}

/// The experts, when the file has them (`expert_count` > 0), counts checked before anything is
/// sized from them: at most llama.cpp's 1024 experts, 1..=n_expert used per token. Qwen3-MoE's
/// experts are `expert_feed_forward_length` wide (else `ffn / used`), gpt-oss's must say so;
/// Mixtral-style `llama` files use `feed_forward_length`. Qwen3-MoE and Mixtral route by a
/// softmax, the top-k, renormalized (llama.cpp's `build_moe_ffn` with `norm_w`); gpt-oss by the
/// top-k logits, softmaxed.
fn moe(k: &Keys<'_>, ffn: usize) -> Result<Option<MoeConfig>, ConfigError> {
    let n_expert = match k.f.get(&k.key("expert_count")) {
        Some(_) => k.f.get_u64(&k.key("expert_count"))?,
        None => 0,
    };
    if n_expert == 0 {
        if matches!(k.arch, "qwen3moe" | "gpt-oss") {
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
    let ffn_exp = match k.arch {
        "qwen3moe" => k.count_or("expert_feed_forward_length", MAX_DIM, ffn / n_used)?,
        "gpt-oss" => k.count("expert_feed_forward_length", MAX_DIM)?,
        _ => ffn,
    };
    if ffn_exp == 0 {
        return Err(ConfigError::Shape("experts of width 0".into()));
    }
    Ok(Some(MoeConfig {
        n_expert: n_expert as usize,
        ffn_exp,
        router: router_rule(k.arch, n_used),
    }))
}

/// How an architecture's router chooses `n_used` experts and weighs them: gpt-oss takes the
/// top-k of the (biased) router logits and softmaxes those k
/// (`LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX_WEIGHT`), not renormalized; the others softmax all
/// logits, take the top-k and renormalize them (`norm_w`).
pub fn router_rule(arch: &str, n_used: usize) -> tpslab_kernels::moe::Router {
    let (gating, norm) = match arch {
        "gpt-oss" => (tpslab_kernels::moe::Gating::SoftmaxWeight, false),
        _ => (tpslab_kernels::moe::Gating::Softmax, true),
    };
    tpslab_kernels::moe::Router {
        n_used,
        gating,
        norm,
        scale: 0.0,
    }
}

/// Which layers slide: `attention.sliding_window_pattern` as a per-layer array, else as a period
/// `n` (default `default_n`) of which the first `n - 1` layers slide (llama.cpp's
/// `set_swa_pattern`).
fn swa_pattern(k: &Keys<'_>, n_layers: usize, default_n: usize) -> Result<Vec<bool>, ConfigError> {
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

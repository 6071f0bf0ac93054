//! What a family module tells the engine: the contract ([`FamilyDef`]) every module in
//! `model::arch` fills in, and the plain types it answers with. Nothing here knows a family;
//! the defaults are the plain Llama block's.

use tpslab_kernels::WType;
use tpslab_kernels::moe::{Gating, Router};

use crate::formats::gguf::GgufFile;
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};
use crate::model::weights::{WeightError, Weights};

/// A GGUF `general.architecture` a family reads (its name also prefixes its metadata keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufArch {
    pub name: &'static str,
    pub rope_style: RopeStyle,
}

/// How wide an architecture's experts are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertWidth {
    /// `feed_forward_length`, as the dense FFN (Mixtral-style `llama` files).
    Dense,
    /// `expert_feed_forward_length`, else `feed_forward_length / expert_used_count`.
    KeyOrShare,
    /// `expert_feed_forward_length`, which the file must set.
    Key,
}

/// An architecture's mixture of experts: whether it must have one, how wide each expert is and
/// how its router weighs the chosen ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertRule {
    /// `expert_count` must be set (the architecture is a mixture of experts by definition).
    pub required: bool,
    pub width: ExpertWidth,
    /// The router's weighting: a softmax over all logits then the top-k (`Softmax`), or the
    /// top-k logits softmaxed (`SoftmaxWeight`, gpt-oss).
    pub gating: Gating,
    /// The chosen weights renormalized to sum to one (llama.cpp's `norm_w`).
    pub norm: bool,
}

impl ExpertRule {
    /// Mixtral's and Qwen3-MoE's routing: softmax, top-k, renormalized.
    pub const SOFTMAX: Self = Self {
        required: false,
        width: ExpertWidth::Dense,
        gating: Gating::Softmax,
        norm: true,
    };

    /// The router that chooses `n_used` experts by this rule.
    pub fn router(self, n_used: usize) -> Router {
        Router {
            n_used,
            gating: self.gating,
            norm: self.norm,
            scale: 0.0,
        }
    }
}

/// A known model of the family, by shape, for synthetic weights and the planner (vLLM's dummy
/// load format): what [`ModelConfig`] needs besides the family's own settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KnownShape {
    /// The name users type ("llama-3-8b").
    pub name: &'static str,
    /// Its GGUF architecture (one of the family's [`FamilyDef::gguf_archs`]).
    pub arch: &'static str,
    pub hidden: usize,
    pub ffn: usize,
    pub n_layers: usize,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub vocab: usize,
    pub context_len: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    pub tied_embeddings: bool,
    pub qkv_bias: bool,
    /// (experts, used per token, width of one expert).
    pub experts: Option<(usize, usize, usize)>,
    /// Per-head Q and K norms.
    pub qk_norm: bool,
    /// Biases on the attention output, the router and the experts, and a sink logit per head
    /// (gpt-oss).
    pub sinks_and_biases: bool,
}

/// A family: the GGUF architectures it reads, the quirks it resolves from their metadata, and
/// its weights by tensor name. Its recipe (`forward`, generic over the device) is the module's
/// free function the registry dispatches to. Every method but the first two has the plain
/// Llama block's answer as its default.
pub trait FamilyDef: Sync {
    /// The GGUF architectures this family runs.
    fn gguf_archs(&self) -> &'static [GgufArch];

    /// The weights by GGUF tensor name.
    fn load(&self, f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError>;

    /// What the architecture adds to the plain block, from its metadata (`k` reads the
    /// architecture's keys). `e` comes with the plain defaults and the generic keys read;
    /// `window` is `attention.sliding_window` (0 when unset). Default: a window where the file
    /// sets one, on every layer (Mistral).
    fn extras(
        &self,
        k: &Keys<'_>,
        c: &ModelConfig,
        window: usize,
        e: &mut Extras,
    ) -> Result<(), ConfigError> {
        let _ = (k, c);
        e.window = (window > 0).then_some(window);
        Ok(())
    }

    /// How architecture `arch`'s experts are sized and routed.
    fn experts(&self, arch: &str) -> ExpertRule {
        let _ = arch;
        ExpertRule::SOFTMAX
    }

    /// The type the family's released files keep their experts in whatever the precision
    /// (gpt-oss: MXFP4).
    fn released_expert_type(&self) -> Option<WType> {
        None
    }

    /// Known models of the family, by shape.
    fn known_shapes(&self) -> &'static [KnownShape] {
        &[]
    }

    /// The settings a known shape's file would carry besides its shape (gpt-oss: the window
    /// pattern and YaRN), applied to its resolved configuration.
    fn known_settings(&self, cfg: &mut ModelConfig) {
        let _ = cfg;
    }
}

//! What a family module tells the engine: the contract ([`FamilyDef`]) every module in
//! `model::arch` fills in, and the plain types it answers with. Nothing here knows a family;
//! the defaults are the plain Llama block's.

use tpslab_kernels::WType;
use tpslab_kernels::moe::{Gating, Router};

use serde_json::{Map, Value as Json};

use crate::formats::gguf::GgufFile;
use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{
    Bad, Change, Md, PRE_NORM, Rope, Shape, ShapeDefaults, default_theta, gguf_name, text_model,
};
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

/// What every tiny random model shares (`model::tiny` writes them): width, FFN width, heads,
/// the trained context the files claim (past every test's context, so LongRoPE's short
/// factors are the ones in use, as in llama.cpp at that context) and the sliding window of
/// the variants with one (narrow enough that a 128-token perplexity run crosses it).
pub const TINY_HIDDEN: u64 = 64;
pub const TINY_FFN: u64 = 128;
pub const TINY_HEADS: u64 = 4;
pub const TINY_KV_HEADS: u64 = 2;
pub const TINY_CONTEXT: u64 = 4096;
pub const TINY_WINDOW: u64 = 16;

/// A metadata value of a tiny model (its key is under the file's architecture).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TinyValue {
    U32(u64),
    F32(f32),
    Str(&'static str),
}

/// A tiny random model of a family, laid out as the family's real files are: which tensors
/// it has beyond the plain block's and the metadata it sets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TinySpec {
    /// The name tests ask for ("mixtral").
    pub variant: &'static str,
    /// The GGUF architecture its file says.
    pub arch: &'static str,
    pub layers: u64,
    /// The head size, when not `hidden / heads`.
    pub head_dim: Option<u64>,
    /// (experts, used per token, width of one expert), and whether the file says the width.
    pub experts: Option<(u64, u64, u64)>,
    pub expert_width_key: bool,
    /// Llama 3's `rope_freqs`.
    pub rope_freqs: bool,
    /// Phi-3's LongRoPE factors, fused `attn_qkv` and gate-up tensors.
    pub longrope: bool,
    pub fused: bool,
    pub qkv_bias: bool,
    /// Per-head Q and K norms.
    pub qk_norm: bool,
    /// Gemma's norms after attention and after the FFN.
    pub sandwich: bool,
    /// gpt-oss's biases (attention output, router, experts), sinks, its FFN norm's name
    /// (`post_attention_norm`) and an untied output.
    pub sinks_and_biases: bool,
    /// The keys beyond the shape's (RoPE base and scaling, window, soft-caps).
    pub metadata: &'static [(&'static str, TinyValue)],
    /// The llama.cpp vocabulary (`models/ggml-vocab-NAME.gguf`) its references are recorded
    /// with (`tests/reference/make_arch_refs.py`); `None` where llama.cpp does not run the
    /// file (it knows no such architecture name).
    pub reference_vocab: Option<&'static str>,
}

impl TinySpec {
    /// A plain two-layer Llama block in `arch`'s file.
    pub const PLAIN: Self = Self {
        variant: "",
        arch: "",
        layers: 2,
        head_dim: None,
        experts: None,
        expert_width_key: false,
        rope_freqs: false,
        longrope: false,
        fused: false,
        qkv_bias: false,
        qk_norm: false,
        sandwich: false,
        sinks_and_biases: false,
        metadata: &[("rope.freq_base", TinyValue::F32(10_000.0))],
        reference_vocab: None,
    };
}

/// A Hugging Face model class a family runs, as convert_hf_to_gguf registers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HfClass {
    /// `architectures[0]` ("LlamaForCausalLM"), what the converter dispatches on.
    pub class: &'static str,
    /// The `model_type`s that name it in a config without `architectures`.
    pub model_types: &'static [&'static str],
    /// The GGUF `general.architecture` the converter writes.
    pub gguf_arch: &'static str,
}

/// A folder's config as a family's mapping reads it: the typed fields, the raw object (with
/// the family's defaults filled in), the resolved RoPE parameters and the checked shape.
pub struct HfInput<'a> {
    pub cfg: &'a HfConfig,
    pub j: &'a Map<String, Json>,
    pub rope: &'a Rope,
    pub shape: &'a Shape,
}

/// A family: the GGUF architectures it reads, the quirks it resolves from their metadata, and
/// its weights by tensor name. Its recipe (`forward`, generic over the device) is the module's
/// free function the registry dispatches to. Every method but the first has the plain
/// Llama block's answer as its default.
pub trait FamilyDef: Sync {
    /// The GGUF architectures this family runs.
    fn gguf_archs(&self) -> &'static [GgufArch];

    /// The weights by GGUF tensor name. Default: the Llama block's.
    fn load(&self, f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
        crate::model::arch::llama::block::load(f, cfg)
    }

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

    /// The tiny random models of the family (`model::tiny`).
    fn tiny(&self) -> &'static [TinySpec] {
        &[]
    }

    /// The Hugging Face classes the family runs from a folder.
    fn hf_classes(&self) -> &'static [HfClass] {
        &[]
    }

    /// Fills in what the class's transformers config defaults where `config.json` leaves it
    /// out (the converter reads the config through `AutoConfig`). Default: RoPE base 10 000.
    fn hf_defaults(&self, c: &HfClass, cfg: &mut HfConfig, j: &mut Map<String, Json>) {
        let _ = (c, cfg);
        default_theta(j, 10_000.0);
    }

    /// The shape the class's config defaults to.
    fn hf_shape_defaults(&self, c: &HfClass) -> ShapeDefaults {
        let _ = c;
        ShapeDefaults::default()
    }

    /// The `{arch}.*` keys the converter writes (`set_gguf_parameters`). Default: the keys
    /// every text model writes.
    fn hf_metadata(&self, c: &HfClass, md: &mut Md, x: &HfInput<'_>) -> Result<(), Bad> {
        let _ = c;
        text_model(md, x.cfg, x.j, x.rope)
    }

    /// Tensors the converter computes from the config (`generate_extra_tensors`): (GGUF name,
    /// F32 values).
    fn hf_computed(&self, c: &HfClass, x: &HfInput<'_>) -> Result<Vec<(String, Vec<f32>)>, Bad> {
        let _ = (c, x);
        Ok(Vec::new())
    }

    /// The GGUF name of the folder's tensor `hf` (`None`: unknown, `Some(None)`: skipped).
    /// Default: the shared names and pre-norm blocks.
    fn hf_tensor_name(&self, c: &HfClass, hf: &str) -> Option<Option<String>> {
        let _ = c;
        gguf_name(&[&PRE_NORM], hf)
    }

    /// What the converter does to the values of the GGUF tensor `name`.
    fn hf_change(&self, c: &HfClass, name: &str, s: &Shape) -> Change {
        let _ = (c, name, s);
        Change::None
    }

    /// How many embedding rows the converter keeps, when fewer than the config's vocabulary
    /// (`tokenizer` reads the folder's tokenizer.json).
    fn hf_vocab_rows(
        &self,
        c: &HfClass,
        tokenizer: &dyn Fn() -> Result<Json, Bad>,
    ) -> Result<Option<u64>, Bad> {
        let _ = (c, tokenizer);
        Ok(None)
    }
}

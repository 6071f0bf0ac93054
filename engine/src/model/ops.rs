//! The backend-ops seam: the operations a layer recipe is written against, once for every
//! device. A device (the CPU over `tpslab_kernels`, CUDA over the PTX kernels, the recording
//! test double) implements [`Ops`] for one step of one batch: it knows the batch's tokens,
//! positions, block tables and logits rows, and holds the activation buffers the recipe names by
//! role ([`Buf`]). The recipe ([`crate::model::arch`]) decides the order of the operations; a
//! device decides how each one runs (and may fuse inside one, as the CPU chunks the FFN of a
//! long prefill or CUDA picks a matrix-vector kernel for a decode).
//!
//! Every buffer holds one row per token of the step (`Last` and `Logits`: one per logits row);
//! widths follow from the weights an op is given and the [`Heads`] geometry.

use crate::model::config::{ModelConfig, RopeScaling, RopeStyle};
use crate::model::weights::MoeWeights;
pub use crate::model::weights::{Param, ParamShape};

/// The activation buffers of a step, by role.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Buf {
    /// The residual stream.
    X,
    /// A normalized copy of the residual stream (input of the next matrix).
    H,
    /// Fused Q | K | V rows.
    Qkv,
    /// Attention output (all query heads).
    Attn,
    /// A block's output before it is added to the residual stream.
    Tmp,
    /// The normalized residual rows whose logits are wanted.
    Last,
    /// Logits rows.
    Logits,
}

impl Buf {
    pub const ALL: [Buf; 7] = [
        Buf::X,
        Buf::H,
        Buf::Qkv,
        Buf::Attn,
        Buf::Tmp,
        Buf::Last,
        Buf::Logits,
    ];

    /// Index into a per-buffer array.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Attention geometry: query heads, key/value heads (grouped-query attention) and head size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Heads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl Heads {
    pub fn of(c: &ModelConfig) -> Self {
        Self {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
        }
    }

    /// Width of all query heads of one token.
    pub fn q_dim(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of the K (or V) heads of one token.
    pub fn kv_dim(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Width of one fused Q | K | V row.
    pub fn qkv_dim(&self) -> usize {
        self.q_dim() + 2 * self.kv_dim()
    }
}

/// Rotary embedding of one layer: how many dimensions of each head rotate, the base, the
/// pairing, and the scaling (ggml's `rope_ext` parameters; per-dimension frequency factors, when
/// a model has them, are passed beside it as a weight).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rope {
    pub dim: usize,
    pub theta: f32,
    pub style: RopeStyle,
    /// Positions are multiplied by this (1 / the linear or YaRN factor).
    pub freq_scale: f32,
    /// YaRN's ramp between the correction dimensions `[low, high]` (ext_factor 1).
    pub yarn: Option<[f32; 2]>,
    /// Factor on cos and sin (YaRN's magnitude correction, `rope.scaling.attn_factor`).
    pub mscale: f32,
}

impl Rope {
    /// The rotation of layer `layer`, or `None` where the layer has none (SmolLM3's NoPE
    /// layers). Sliding-window layers use their own base, and no scaling (Gemma 3's local
    /// layers) unless the family keeps it there (gpt-oss), as llama.cpp's
    /// `get_rope_freq_base` / `get_rope_freq_scale` do.
    pub fn of(c: &ModelConfig, layer: usize) -> Option<Self> {
        if !c.has_rope(layer) {
            return None;
        }
        let mut r = Self {
            dim: c.rope_dim,
            theta: c.rope_theta,
            style: c.rope_style,
            freq_scale: 1.0,
            yarn: None,
            mscale: c.extras.rope_attn_factor,
        };
        if !c.extras.swa_layers.is_empty() && c.window(layer).is_some() {
            r.theta = c.extras.rope_theta_swa;
            if !c.extras.rope_scaled_swa {
                return Some(r);
            }
        }
        match c.rope_scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => r.freq_scale = 1.0 / factor,
            RopeScaling::Yarn { factor, orig_ctx } => {
                r.freq_scale = 1.0 / factor;
                r.yarn = Some(yarn_corr_dims(r.dim, orig_ctx, r.theta));
                // llama.cpp divides its attention factor by the magnitude correction that
                // the rotation then multiplies back in: the net factor is the correction.
                r.mscale *= 1.0 + 0.1 * factor.ln();
            }
        }
        Some(r)
    }
}

/// ggml's `ggml_rope_yarn_corr_dims` with its default betas (fast 32, slow 1).
fn yarn_corr_dims(n_dims: usize, n_ctx_orig: usize, base: f32) -> [f32; 2] {
    let dim = |n_rot: f32| {
        n_dims as f32 * (n_ctx_orig as f32 / (n_rot * 2.0 * std::f32::consts::PI)).ln()
            / (2.0 * base.ln())
    };
    let start = dim(32.0).floor();
    let end = dim(1.0).ceil();
    [start.max(0.0), end.min(n_dims as f32 - 1.0)]
}

/// How one layer's attention scores are formed: the query scale, Gemma 2's soft-cap, and the
/// sliding window (a token sees the last `window` positions, itself included).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnOpts {
    pub scale: f32,
    pub softcap: Option<f32>,
    pub window: Option<usize>,
}

impl AttnOpts {
    pub fn of(c: &ModelConfig, layer: usize) -> Self {
        Self {
            scale: c.extras.attn_scale,
            softcap: c.extras.attn_softcap,
            window: c.window(layer),
        }
    }

    /// Plain causal attention with the usual `1 / sqrt(head_dim)` (what every device runs).
    pub fn plain(head_dim: usize) -> Self {
        Self {
            scale: 1.0 / (head_dim as f32).sqrt(),
            softcap: None,
            window: None,
        }
    }
}

/// The activation of a gated feed-forward block (`act(gate) * up`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// SwiGLU (Llama, Qwen, Mistral, Phi-3).
    Silu,
    /// GeGLU with the tanh approximation of GELU (Gemma).
    GeluTanh,
    /// OpenAI's clamped SwiGLU (gpt-oss, ggml's `swiglu_oai` with alpha 1.702 and limit 7):
    /// `g = min(gate, 7)`, `u = clamp(up, -7, 7)`, `g * sigmoid(1.702 g) * (u + 1)`.
    SwigluOai,
}

/// The operations of a forward step on one device. Ops run in call order; each reads and
/// writes whole buffers (every token of the step, or every logits row).
pub trait Ops {
    /// A weight matrix as this device holds it (dense or quantized, with an optional bias).
    type Matrix: Param;
    /// A weight vector (norm weights) as this device holds it.
    type Vector: Param;
    type Error;

    /// `out[t]` = row `tokens[t]` of `table` (as floats).
    fn embed(&mut self, table: &Self::Matrix, out: Buf) -> Result<(), Self::Error>;
    /// `out = rms_norm(x) * w`, row by row (`out` may be `x`).
    fn rms_norm(&mut self, x: Buf, w: &Self::Vector, eps: f32, out: Buf)
    -> Result<(), Self::Error>;
    /// `x += y`, then `out = rms_norm(x) * w` (the residual add fused with the next norm).
    fn add_rms_norm(
        &mut self,
        x: Buf,
        y: Buf,
        w: &Self::Vector,
        eps: f32,
        out: Buf,
    ) -> Result<(), Self::Error>;
    /// `y = x W^T (+ b)`.
    fn linear(&mut self, w: &Self::Matrix, x: Buf, y: Buf) -> Result<(), Self::Error>;
    /// `x *= s`.
    fn scale(&mut self, x: Buf, s: f32) -> Result<(), Self::Error>;
    /// `x = tanh(x / cap) * cap` (soft-capped logits).
    fn softcap(&mut self, x: Buf, cap: f32) -> Result<(), Self::Error>;
    /// RMS norm of each query head with `q` and of each key head with `k`, inside the fused
    /// `qkv` rows (QK-norm: Qwen3, Gemma 3).
    fn qk_norm(
        &mut self,
        qkv: Buf,
        heads: Heads,
        q: &Self::Vector,
        k: &Self::Vector,
        eps: f32,
    ) -> Result<(), Self::Error>;
    /// Rotates the Q and K heads inside the fused `qkv` rows at each token's position (unless
    /// `rope` is `None`; frequencies divided by `factors` where given), and stores each token's
    /// K and V for `layer` in its KV slot (through the block tables).
    fn rope_store(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        rope: Option<Rope>,
        factors: Option<&Self::Vector>,
    ) -> Result<(), Self::Error>;
    /// Causal paged attention of each token's query heads (in `qkv`) over its sequence's keys and
    /// values of `layer` up to its position (within the window, if any). With `sinks` (one
    /// logit per query head, gpt-oss) each head's softmax has one more term in its
    /// denominator, `exp(sink)`, that attends to nothing.
    fn attention(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        opts: AttnOpts,
        sinks: Option<&Self::Vector>,
        out: Buf,
    ) -> Result<(), Self::Error>;
    /// `out = down(act(gate) * up)` where `gate_up` holds the gate rows then the up rows.
    fn gated_ffn(
        &mut self,
        gate_up: &Self::Matrix,
        down: &Self::Matrix,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), Self::Error>;
    /// The mixture of experts: each token's router logits (`moe.router`) choose and weigh its
    /// experts by `moe.rule`, and `out` is the weighted sum of those experts' gated FFNs of `x`.
    fn moe_ffn(
        &mut self,
        moe: &MoeWeights<Self::Matrix>,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), Self::Error>;
    /// `x += y`.
    fn add(&mut self, x: Buf, y: Buf) -> Result<(), Self::Error>;
    /// `out[j] = rms_norm(x[logit_rows[j]]) * w`: the rows whose logits are wanted. A device
    /// that embeds (`Backend::embeds`) norms the batch's `hidden_rows` alike and keeps them.
    fn gather_rms_norm(
        &mut self,
        x: Buf,
        w: &Self::Vector,
        eps: f32,
        out: Buf,
    ) -> Result<(), Self::Error>;
    /// `out = x head^T`: the logits of the gathered rows.
    fn logits(&mut self, head: &Self::Matrix, x: Buf, out: Buf) -> Result<(), Self::Error>;
}

//! Per-token operations of the forward pass on the GPU (elementwise.cu): RoPE with every scaling
//! the engine knows and the KV store, QK-norm, the embedding scale, soft-capping, and the gated
//! activations other than SwiGLU, and the gathering and weighted scattering of a mixture of
//! experts' rows.

use super::{Arg, AttnGeom, Gpu, Result};

/// One layer's rotation, as the engine's `Rope` resolves it: rotary dimensions (0: a layer
/// without RoPE, which only stores K and V), base, pair layout, scaling, and the device address
/// of per-pair frequency factors (0 for none).
#[derive(Debug, Clone, Copy)]
pub struct RopeSpec {
    pub dim: usize,
    pub theta_base: f32,
    pub neox: bool,
    /// Positions times this (1 / the linear or YaRN factor).
    pub freq_scale: f32,
    /// YaRN's correction dimensions `[low, high]`.
    pub yarn: Option<[f32; 2]>,
    /// Factor on cos and sin.
    pub mscale: f32,
    pub factors: u64,
}

impl RopeSpec {
    /// Plain RoPE of `dim` rotary dimensions with base `theta_base`.
    pub fn plain(dim: usize, theta_base: f32, neox: bool) -> Self {
        Self {
            dim,
            theta_base,
            neox,
            freq_scale: 1.0,
            yarn: None,
            mscale: 1.0,
            factors: 0,
        }
    }
}

impl Gpu {
    /// RoPE on Q and K of `n` tokens in place (rows of `qkv`, `stride` floats apart) and their K
    /// and V stored as f16 in KV slots `slots` of one layer's caches `kc`, `vc`.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_store(
        &self,
        qkv: u64,
        stride: usize,
        pos: u64,
        slots: u64,
        kc: u64,
        vc: u64,
        n: usize,
        g: &AttnGeom,
        rope: &RopeSpec,
    ) -> Result<()> {
        let theta_scale = if rope.dim == 0 {
            1.0
        } else {
            rope.theta_base.powf(-2.0 / rope.dim as f32)
        };
        let [low, high] = rope.yarn.unwrap_or([0.0, 0.0]);
        let a = [
            Arg::P(qkv),
            Arg::I(stride as i32),
            Arg::P(pos),
            Arg::P(slots),
            Arg::P(kc),
            Arg::P(vc),
            Arg::I(g.n_heads as i32),
            Arg::I(g.n_kv_heads as i32),
            Arg::I(g.head_dim as i32),
            Arg::I(rope.dim as i32),
            Arg::F(theta_scale),
            Arg::I(i32::from(rope.neox)),
            Arg::F(rope.freq_scale),
            Arg::I(i32::from(rope.yarn.is_some())),
            Arg::F(low),
            Arg::F(high),
            Arg::F(rope.mscale),
            Arg::P(rope.factors),
        ];
        self.run(&self.k.rope_store, (n as u32, 1), 256, &a)
    }

    /// QK-norm: every Q and K head of `n` tokens (rows of `qkv`, `stride` floats apart)
    /// RMS-normed in place over `head_dim` with weights `qw` (Q heads) or `kw` (K heads).
    #[allow(clippy::too_many_arguments)]
    pub fn qk_norm(
        &self,
        qkv: u64,
        stride: usize,
        n: usize,
        g: &AttnGeom,
        qw: u64,
        kw: u64,
        eps: f32,
    ) -> Result<()> {
        let a = [
            Arg::P(qkv),
            Arg::I(stride as i32),
            Arg::I(g.n_heads as i32),
            Arg::I(g.head_dim as i32),
            Arg::P(qw),
            Arg::P(kw),
            Arg::F(eps),
        ];
        let heads = (g.n_heads + g.n_kv_heads) as u32;
        self.run(&self.k.qk_norm, (n as u32, heads), 32, &a)
    }

    /// `x *= s` over `n` floats.
    pub fn scale(&self, x: u64, s: f32, n: usize) -> Result<()> {
        let a = [Arg::P(x), Arg::F(s), Arg::L(n as i64)];
        self.run(&self.k.scale_inplace, (Self::grid_for(n), 1), 256, &a)
    }

    /// `x = cap * tanh(x / cap)` over `n` floats.
    pub fn softcap(&self, x: u64, cap: f32, n: usize) -> Result<()> {
        let a = [Arg::P(x), Arg::F(cap), Arg::L(n as i64)];
        self.run(&self.k.softcap_inplace, (Self::grid_for(n), 1), 256, &a)
    }

    /// `out[r] = act(gate) * up` for rows of `gu` = `[gate | up]` (`ffn` each): `gelu` the
    /// tanh GELU as ggml computes it, else gpt-oss's clamped SwiGLU.
    pub fn gated_act(&self, gu: u64, out: u64, ffn: usize, rows: usize, gelu: bool) -> Result<()> {
        let a = [
            Arg::P(gu),
            Arg::P(out),
            Arg::I(ffn as i32),
            Arg::L((ffn * rows) as i64),
            Arg::I(if gelu { 1 } else { 2 }),
        ];
        self.run(&self.k.gated_act, (Self::grid_for(ffn * rows), 1), 256, &a)
    }

    /// `out[i] = x[idx[i]]` for `count` rows of `k` floats (`idx`: device i32).
    pub fn gather_rows(&self, x: u64, idx: u64, out: u64, k: usize, count: usize) -> Result<()> {
        let a = [
            Arg::P(x),
            Arg::P(idx),
            Arg::P(out),
            Arg::I(k as i32),
            Arg::I(count as i32),
        ];
        self.run(&self.k.gather_rows, (count.min(65_535) as u32, 1), 256, &a)
    }

    /// `out[idx[i]] += w[i] * y[i]` for `count` rows of `width` floats (`idx` i32, `w` f32, both
    /// on the device; no index twice).
    #[allow(clippy::too_many_arguments)]
    pub fn scatter_add_rows(
        &self,
        out: u64,
        idx: u64,
        w: u64,
        y: u64,
        width: usize,
        count: usize,
    ) -> Result<()> {
        let a = [
            Arg::P(out),
            Arg::P(idx),
            Arg::P(w),
            Arg::P(y),
            Arg::I(width as i32),
            Arg::I(count as i32),
        ];
        self.run(
            &self.k.scatter_add_rows,
            (count.min(65_535) as u32, 1),
            256,
            &a,
        )
    }
}

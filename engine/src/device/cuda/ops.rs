//! The backend-ops seam on the GPU: [`CudaOps`], one step's device addresses, runs each op of a
//! recipe as the PTX kernels of `tpslab_kernels::cuda`.

use tpslab_kernels::cuda::{AttnGeom, AttnIo, AttnSplit, CudaError, GemmScratch, Gpu, RopeSpec};

use super::{ACT, ACTS, ARGMAX, DevLinear, DevVector, GU};
use crate::model::config::RopeStyle;
use crate::model::ops::{Activation, AttnOpts, Buf, Heads, Ops, Rope};
use crate::model::weights::MoeWeights;

/// One step of one batch on the GPU: device addresses of the step's integers (uploaded once),
/// its activation sub-buffers and the KV pool.
pub(super) struct CudaOps<'a> {
    pub(super) g: &'a Gpu,
    pub(super) sc: &'a mut GemmScratch,
    /// Tokens and logits rows of the step.
    pub(super) n: usize,
    pub(super) r: usize,
    /// Addresses of the activation sub-buffers (see [`ACTS`]) and floats per row of each.
    pub(super) bufs: [u64; ACTS],
    pub(super) widths: [usize; ACTS],
    pub(super) logits: u64,
    /// Floats per logits row.
    pub(super) vocab: usize,
    pub(super) tokens: u64,
    pub(super) pos: u64,
    pub(super) slots: u64,
    pub(super) bt_off: u64,
    pub(super) rows: u64,
    pub(super) bt: u64,
    pub(super) kv: u64,
    /// Bytes of one layer's K (or V) slots; a layer's K then V follow the previous layer's.
    pub(super) layer_bytes: u64,
    pub(super) block_size: usize,
    /// Prefill runs as flash.cu tiles and the other tokens (see `CudaBackend::use_flash`).
    pub(super) split: Option<AttnSplit>,
}

impl CudaOps<'_> {
    fn buf(&self, b: Buf) -> u64 {
        match b {
            Buf::Logits => self.logits,
            _ => self.bufs[b.index()],
        }
    }

    /// Floats in buffer `b` this step: a row per token, or per logits row for `Last` and
    /// `Logits` (whose rows are the vocabulary).
    fn count(&self, b: Buf) -> usize {
        match b {
            Buf::Logits => self.r * self.vocab,
            Buf::Last => self.r * self.widths[b.index()],
            _ => self.n * self.widths[b.index()],
        }
    }

    fn geom(&self, heads: Heads) -> AttnGeom {
        AttnGeom::plain(
            heads.n_heads,
            heads.n_kv_heads,
            heads.head_dim,
            self.block_size,
        )
    }

    /// K and V slots of `layer`.
    fn kv_of(&self, layer: usize) -> (u64, u64) {
        let k = self.kv + 2 * layer as u64 * self.layer_bytes;
        (k, k + self.layer_bytes)
    }
}

impl Ops for CudaOps<'_> {
    type Matrix = DevLinear;
    type Vector = DevVector;
    type Error = CudaError;

    fn embed(&mut self, table: &DevLinear, out: Buf) -> Result<(), CudaError> {
        self.g.embed(&table.m, self.tokens, self.n, self.buf(out))
    }

    fn rms_norm(&mut self, x: Buf, w: &DevVector, eps: f32, out: Buf) -> Result<(), CudaError> {
        // In place too: each thread writes only the elements it read, after the block's sum.
        let (x, out) = (self.buf(x), self.buf(out));
        self.g
            .rms_norm(x, None, self.n, w.buf.ptr(), out, w.len, eps)
    }

    fn add_rms_norm(
        &mut self,
        x: Buf,
        y: Buf,
        w: &DevVector,
        eps: f32,
        out: Buf,
    ) -> Result<(), CudaError> {
        let (x, y, out) = (self.buf(x), self.buf(y), self.buf(out));
        self.g
            .add_rms_norm(x, y, w.buf.ptr(), out, self.n, w.len, eps)
    }

    fn linear(&mut self, w: &DevLinear, x: Buf, y: Buf) -> Result<(), CudaError> {
        let (x, y) = (self.buf(x), self.buf(y));
        w.forward(self.g, x, self.n, y, self.sc)
    }

    fn scale(&mut self, x: Buf, s: f32) -> Result<(), CudaError> {
        let count = self.count(x);
        self.g.scale(self.buf(x), s, count)
    }

    fn softcap(&mut self, x: Buf, cap: f32) -> Result<(), CudaError> {
        let count = self.count(x);
        self.g.softcap(self.buf(x), cap, count)
    }

    fn qk_norm(
        &mut self,
        qkv: Buf,
        heads: Heads,
        q: &DevVector,
        k: &DevVector,
        eps: f32,
    ) -> Result<(), CudaError> {
        let geom = self.geom(heads);
        let qkv = self.buf(qkv);
        self.g.qk_norm(
            qkv,
            heads.qkv_dim(),
            self.n,
            &geom,
            q.buf.ptr(),
            k.buf.ptr(),
            eps,
        )
    }

    fn rope_store(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        rope: Option<Rope>,
        factors: Option<&DevVector>,
    ) -> Result<(), CudaError> {
        let (kc, vc) = self.kv_of(layer);
        // A layer without RoPE (SmolLM3's NoPE layers) only stores K and V.
        let spec = rope.map_or(RopeSpec::plain(0, 1.0, false), |r| RopeSpec {
            dim: r.dim,
            theta_base: r.theta,
            neox: r.style == RopeStyle::Neox,
            freq_scale: r.freq_scale,
            yarn: r.yarn,
            mscale: r.mscale,
            factors: factors.map_or(0, |f| f.buf.ptr()),
        });
        self.g.rope_store(
            self.buf(qkv),
            heads.qkv_dim(),
            self.pos,
            self.slots,
            kc,
            vc,
            self.n,
            &self.geom(heads),
            &spec,
        )
    }

    fn attention(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        opts: AttnOpts,
        sinks: Option<&DevVector>,
        out: Buf,
    ) -> Result<(), CudaError> {
        if sinks.is_some() {
            return Err(CudaError::NoOp("attention sinks"));
        }
        let geom = AttnGeom {
            scale: opts.scale,
            window: opts.window.unwrap_or(0),
            softcap: opts.softcap.unwrap_or(0.0),
            ..self.geom(heads)
        };
        let (kc, vc) = self.kv_of(layer);
        let io = AttnIo {
            qkv: self.buf(qkv),
            stride: heads.qkv_dim(),
            kc,
            vc,
            pos: self.pos,
            bt_off: self.bt_off,
            bt: self.bt,
            out: self.buf(out),
            n: self.n,
        };
        match &self.split {
            Some(split) => self.g.attention_split(&io, &geom, split),
            None => self.g.paged_attention(&io, &geom),
        }
    }

    fn gated_ffn(
        &mut self,
        gate_up: &DevLinear,
        down: &DevLinear,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), CudaError> {
        let (x, out, gu, a) = (self.buf(x), self.buf(out), self.bufs[GU], self.bufs[ACT]);
        match act {
            // Gating fused into the product where the kernels allow (no bias to add between).
            Activation::Silu if gate_up.bias.is_none() => {
                self.g
                    .gate_up_swiglu(&gate_up.m, x, self.n, gu, a, self.sc)?;
            }
            Activation::Silu => {
                gate_up.forward(self.g, x, self.n, gu, self.sc)?;
                self.g.swiglu(gu, a, gate_up.m.n / 2, self.n)?;
            }
            Activation::GeluTanh | Activation::SwigluOai => {
                gate_up.forward(self.g, x, self.n, gu, self.sc)?;
                let gelu = act == Activation::GeluTanh;
                self.g.gated_act(gu, a, gate_up.m.n / 2, self.n, gelu)?;
            }
        }
        down.forward(self.g, a, self.n, out, self.sc)
    }

    fn moe_ffn(
        &mut self,
        _: &MoeWeights<DevLinear>,
        _: Activation,
        _: Buf,
        _: Buf,
    ) -> Result<(), CudaError> {
        Err(CudaError::NoOp("mixture-of-experts layers"))
    }

    fn add(&mut self, x: Buf, y: Buf) -> Result<(), CudaError> {
        let count = self.n * self.widths[x.index()];
        self.g.add(self.buf(x), self.buf(y), count)
    }

    fn gather_rms_norm(
        &mut self,
        x: Buf,
        w: &DevVector,
        eps: f32,
        out: Buf,
    ) -> Result<(), CudaError> {
        if self.r == 0 {
            return Ok(());
        }
        let (x, out) = (self.buf(x), self.buf(out));
        self.g
            .rms_norm(x, Some(self.rows), self.r, w.buf.ptr(), out, w.len, eps)
    }

    /// The logits rows, and their greedy tokens (one launch more, so a greedy step copies back
    /// one integer a row instead of a vocabulary of floats).
    fn logits(&mut self, head: &DevLinear, x: Buf, out: Buf) -> Result<(), CudaError> {
        if self.r == 0 {
            return Ok(());
        }
        let (x, out) = (self.buf(x), self.buf(out));
        head.forward(self.g, x, self.r, out, self.sc)?;
        self.g.argmax(out, self.r, head.m.n, self.bufs[ARGMAX])
    }
}

//! The backend-ops seam on the GPU: [`CudaOps`], one step's device addresses, runs each op of a
//! recipe as the PTX kernels of `tpslab_kernels::cuda`.

use tpslab_kernels::ThreadPool;
use tpslab_kernels::cuda::{
    AttnGeom, AttnIo, AttnSplit, CudaError, DBuf, Feature, GemmScratch, Gpu, RopeSpec, Unsupported,
};
use tpslab_kernels::moe::Route;

use super::{ACT, ACTS, ARGMAX, DevLinear, DevVector, GU};
use crate::device::ExpertLoad;
use crate::device::moe::{HostExpert, HostExperts, route_rows};
use crate::model::config::RopeStyle;
use crate::model::ops::{Activation, AttnOpts, Buf, Heads, Ops, Rope};
use crate::model::weights::MoeWeights;

/// One step of one batch on the GPU: device addresses of the step's integers (uploaded once),
/// its activation sub-buffers and the KV pool.
pub(super) struct CudaOps<'a> {
    pub(super) g: &'a Gpu,
    pub(super) sc: &'a mut GemmScratch,
    pub(super) moe: &'a mut MoeScratch,
    /// The CPU side for experts kept in host memory (`--n-cpu-moe`).
    pub(super) host: Option<&'a mut HostSide>,
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
        let geom = AttnGeom {
            scale: opts.scale,
            window: opts.window.unwrap_or(0),
            softcap: opts.softcap.unwrap_or(0.0),
            sinks: sinks.map_or(0, |v| v.buf.ptr()),
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
        gate(self.g, self.sc, gate_up, act, x, self.n, gu, a)?;
        down.forward(self.g, a, self.n, out, self.sc)
    }

    /// A mixture of experts, routed on the host: the router's logits come back (one sync a
    /// layer, so such steps are never captured), [`route_rows`] (the CPU's rule) picks and
    /// weighs each token's experts. Experts on the device each run on their gathered rows, their
    /// outputs added back to their tokens with their weights; experts kept in host memory
    /// (`--n-cpu-moe`) run on the CPU over the layer's input copied back, their sum copied up.
    fn moe_ffn(
        &mut self,
        moe: &MoeWeights<DevLinear>,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), CudaError> {
        let Some(first) = moe.experts.first() else {
            return Ok(());
        };
        let (n, ne) = (self.n, moe.experts.len());
        let (x, out) = (self.buf(x), self.buf(out));
        let ms = &mut *self.moe;
        let logits = self.g.grow(&mut ms.logits, n * ne * 4, |_| n * ne * 4)?;
        moe.router.forward(self.g, x, n, logits, self.sc)?;
        ms.host.resize(n * ne, 0.0);
        self.g.dtoh(logits, &mut ms.host)?;
        route_rows(&ms.host, ne, &moe.rule, &mut ms.probs, &mut ms.routes);
        ms.load.count_routes(&ms.routes, ne);
        if first.gate_up.host().is_some() {
            self.host_experts(moe, act, x, out)
        } else {
            self.device_experts(moe, act, x, out)
        }
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

impl CudaOps<'_> {
    /// The layer's experts on the device, over the routes [`Ops::moe_ffn`] left in the scratch:
    /// per expert, its tokens and their weights (one upload for all), each expert with tokens
    /// on its gathered rows, added back to them weighted.
    fn device_experts(
        &mut self,
        moe: &MoeWeights<DevLinear>,
        act: Activation,
        x: u64,
        out: u64,
    ) -> Result<(), CudaError> {
        let (n, ne, used) = (self.n, moe.experts.len(), moe.rule.n_used);
        let first = &moe.experts[0];
        let (k, ffn, width) = (first.gate_up.m.k, first.gate_up.m.n / 2, first.down.m.n);
        let ms = &mut *self.moe;
        // One pass over the routes counts each expert's tokens, a second places them.
        let mut spans = vec![(0usize, 0usize); ne];
        for r in &ms.routes {
            spans[r.expert as usize].1 += 1;
        }
        let mut at = 0;
        for s in &mut spans {
            s.0 = at;
            at += 2 * s.1;
        }
        ms.lists.clear();
        ms.lists.resize(at, 0);
        let mut fill: Vec<usize> = spans.iter().map(|s| s.0).collect();
        for (i, r) in ms.routes.iter().enumerate() {
            let e = r.expert as usize;
            ms.lists[fill[e]] = (i / used) as u32;
            ms.lists[fill[e] + spans[e].1] = r.weight.to_bits();
            fill[e] += 1;
        }
        let lists = self
            .g
            .grow(&mut ms.list_buf, ms.lists.len() * 4, |_| ms.lists.len() * 8)?;
        self.g.htod(lists, &ms.lists)?;
        let most = spans.iter().map(|s| s.1).max().unwrap_or(0);
        let (xg_at, gu_at, a_at, y_at) = (0, most * k, most * (k + 2 * ffn), most * (k + 3 * ffn));
        let rows = self.g.grow(&mut ms.rows, (y_at + most * width) * 4, |_| {
            (y_at + most * width) * 4
        })?;
        let at = |off: usize| rows + 4 * off as u64;
        self.g.memset(out, 0, n * width * 4)?;
        ms.bytes.clear();
        (ms.bytes).extend(
            moe.experts
                .iter()
                .map(|e| e.gate_up.bytes() + e.down.bytes()),
        );
        let ran = spans.iter().enumerate().filter(|(_, s)| s.1 > 0);
        ms.load.count_bytes(&ms.bytes, ran.map(|(e, _)| e));
        for (expert, &(start, count)) in moe.experts.iter().zip(&spans) {
            if count == 0 {
                continue;
            }
            let (idx, w) = (lists + 4 * start as u64, lists + 4 * (start + count) as u64);
            self.g.gather_rows(x, idx, at(xg_at), k, count)?;
            gate(
                self.g,
                self.sc,
                &expert.gate_up,
                act,
                at(xg_at),
                count,
                at(gu_at),
                at(a_at),
            )?;
            expert
                .down
                .forward(self.g, at(a_at), count, at(y_at), self.sc)?;
            self.g
                .scatter_add_rows(out, idx, w, at(y_at), width, count)?;
        }
        Ok(())
    }

    /// The layer's experts kept in host memory: its input comes back, the CPU runs each
    /// token's experts over the routes [`Ops::moe_ffn`] left in the scratch ([`HostExperts`],
    /// the CPU backend's own path), and their weighted sum goes up to `out`.
    fn host_experts(
        &mut self,
        moe: &MoeWeights<DevLinear>,
        act: Activation,
        x: u64,
        out: u64,
    ) -> Result<(), CudaError> {
        const NOT_HOST: CudaError = CudaError::Unsupported(Unsupported(Feature::SplitExperts));
        let experts: Vec<HostExpert<'_>> = moe
            .experts
            .iter()
            .filter_map(|e| Some((e.gate_up.host()?, e.down.host()?)))
            .collect();
        let (Some(hs), Some(&(gate_up, down))) = (self.host.as_deref_mut(), experts.first()) else {
            return Err(NOT_HOST);
        };
        if experts.len() != moe.experts.len() {
            return Err(NOT_HOST);
        }
        let (n, k, width) = (self.n, gate_up.k, down.n);
        hs.x.resize(n * k, 0.0);
        self.g.dtoh(x, &mut hs.x)?;
        hs.y.resize(n * width, 0.0);
        let ms = &mut *self.moe;
        hs.experts.run(
            &hs.pool,
            &experts,
            act,
            &hs.x,
            k,
            &ms.routes,
            moe.rule.n_used,
            width,
            &mut hs.y,
            &mut ms.load,
        );
        self.g.htod(out, &hs.y)
    }
}

/// `a = act(gate) * up` of `rows` rows of `x` through `gate_up` (`gu`: the product's room, used
/// where the gating is not fused into it).
#[allow(clippy::too_many_arguments)]
fn gate(
    g: &Gpu,
    sc: &mut GemmScratch,
    gate_up: &DevLinear,
    act: Activation,
    x: u64,
    rows: usize,
    gu: u64,
    a: u64,
) -> Result<(), CudaError> {
    match act {
        // Gating fused into the product where the kernels allow (no bias to add between).
        Activation::Silu if gate_up.bias.is_none() => {
            g.gate_up_swiglu(&gate_up.m, x, rows, gu, a, sc)
        }
        Activation::Silu => {
            gate_up.forward(g, x, rows, gu, sc)?;
            g.swiglu(gu, a, gate_up.m.n / 2, rows)
        }
        Activation::GeluTanh | Activation::SwigluOai => {
            gate_up.forward(g, x, rows, gu, sc)?;
            g.gated_act(gu, a, gate_up.m.n / 2, rows, act == Activation::GeluTanh)
        }
    }
}

/// The mixture-of-experts path's buffers: router logits and their host copy, the routes, the
/// experts' token and weight lists (host and device), and the gathered rows with their products.
#[derive(Default)]
pub(super) struct MoeScratch {
    logits: Option<DBuf>,
    host: Vec<f32>,
    probs: Vec<f32>,
    routes: Vec<Route>,
    lists: Vec<u32>,
    list_buf: Option<DBuf>,
    rows: Option<DBuf>,
    /// Each expert's bytes (of the layer being run).
    bytes: Vec<usize>,
    /// What the step read of the experts.
    pub(super) load: ExpertLoad,
}

/// The CPU that runs the experts kept in host memory: its threads, buffers, and a layer's
/// input and output on the host.
pub(super) struct HostSide {
    pool: ThreadPool,
    experts: HostExperts,
    x: Vec<f32>,
    y: Vec<f32>,
}

impl HostSide {
    pub(super) fn new(threads: usize) -> Self {
        Self {
            pool: ThreadPool::new(threads),
            experts: HostExperts::default(),
            x: Vec::new(),
            y: Vec::new(),
        }
    }

    pub(super) fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    /// Bytes held on the host.
    pub(super) fn bytes(&self) -> usize {
        self.experts.bytes() + (self.x.capacity() + self.y.capacity()) * 4
    }
}

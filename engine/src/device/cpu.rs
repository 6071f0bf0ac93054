//! The CPU device: the backend-ops seam over `tpslab_kernels` (quantized matmuls, paged
//! attention) and the per-row ops of [`crate::device::rowops`], plus [`CpuBackend`], the model
//! and its KV pool on the CPU.

use std::convert::Infallible;
use std::sync::Arc;

use tpslab_kernels::ThreadPool;
use tpslab_kernels::moe::Route;

use crate::device::attention::{AttnShape, paged_attention};
use crate::device::moe::{HostExperts, route_rows};
use crate::device::rowops::{self, FFN_ROWS, sized};
use crate::device::{
    Backend, BackendError, BatchError, ExpertLoad, MemoryUse, RowNeed, StepOutput, check_batch,
};
use crate::kv::{Batch, KvCache, KvTypes};
use crate::model::LoadedModel;
use crate::model::Model;
use crate::model::arch;
use crate::model::config::ModelConfig;
use crate::model::ops::{Activation, AttnOpts, Buf, Heads, Ops, Rope};
use crate::model::weights::{Linear, MoeWeights};

/// Reusable activation buffers, grown to the largest batch seen.
#[derive(Default)]
pub struct Workspace {
    bufs: [Vec<f32>; Buf::ALL.len()],
    /// Floats in use of each buffer in this step (a buffer may be longer from a larger step).
    lens: [usize; Buf::ALL.len()],
    gu: Vec<f32>,
    act: Vec<f32>,
    gathered: Vec<f32>,
    /// The output-normed states of the batch's `hidden_rows` (embeddings), row after row.
    hidden: Vec<f32>,
    hidden_len: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
    /// Router logits, routes and the grouped expert buffers of a mixture of experts.
    router: Vec<f32>,
    probs: Vec<f32>,
    routes: Vec<Route>,
    host: HostExperts,
    /// What the last step read of the experts.
    pub experts: ExpertLoad,
}

impl Workspace {
    /// Bytes held by the activation buffers.
    pub fn bytes(&self) -> usize {
        self.bufs
            .iter()
            .chain([&self.gu, &self.act, &self.gathered, &self.cos, &self.sin])
            .chain([&self.hidden])
            .chain([&self.router, &self.probs])
            .map(|v| v.capacity() * 4)
            .sum::<usize>()
            + self.routes.capacity() * std::mem::size_of::<Route>()
            + self.host.bytes()
    }

    /// The floats of buffer `b` as the last step left them.
    pub fn buf(&self, b: Buf) -> &[f32] {
        &self.bufs[b.index()][..self.lens[b.index()]]
    }

    /// The output-normed states of the last step's `hidden_rows`, `hidden` floats a row.
    pub fn hidden(&self) -> &[f32] {
        &self.hidden[..self.hidden_len]
    }
}

/// One step of one batch on the CPU.
pub struct CpuOps<'a> {
    pool: &'a ThreadPool,
    batch: &'a Batch,
    kv: &'a mut KvCache,
    ws: &'a mut Workspace,
    /// What the rotary tables of this step's positions were computed for (the rotation and the
    /// address of its frequency factors): layers that share it share the tables.
    rope: Option<(Rope, Option<usize>)>,
}

impl<'a> CpuOps<'a> {
    pub fn new(
        pool: &'a ThreadPool,
        batch: &'a Batch,
        kv: &'a mut KvCache,
        ws: &'a mut Workspace,
    ) -> Self {
        Self {
            pool,
            batch,
            kv,
            ws,
            rope: None,
        }
    }

    /// Runs `f(input, output)` with `src` read and `dst` (sized to `len` floats) written.
    fn map(&mut self, src: Buf, dst: Buf, len: usize, f: impl FnOnce(&[f32], &mut [f32])) {
        let mut out = std::mem::take(&mut self.ws.bufs[dst.index()]);
        f(self.ws.buf(src), sized(&mut out, len));
        self.ws.bufs[dst.index()] = out;
        self.ws.lens[dst.index()] = len;
    }

    fn rope_tables(&mut self, rope: Rope, factors: Option<&[f32]>) {
        let key = (rope, factors.map(|f| f.as_ptr() as usize));
        if self.rope == Some(key) {
            return;
        }
        let half = rope.dim / 2;
        let n = self.batch.len();
        let cos = sized(&mut self.ws.cos, n * half);
        let sin = sized(&mut self.ws.sin, n * half);
        for (i, &p) in self.batch.positions.iter().enumerate() {
            let r = i * half..(i + 1) * half;
            rowops::rope_cache(p, &rope, factors, &mut cos[r.clone()], &mut sin[r]);
        }
        self.rope = Some(key);
    }

    /// Buffer `x`'s floats in use, to change in place.
    fn rows_mut(&mut self, x: Buf) -> &mut [f32] {
        let len = self.ws.lens[x.index()];
        &mut self.ws.bufs[x.index()][..len]
    }
}

impl Ops for CpuOps<'_> {
    type Matrix = Linear;
    type Vector = Vec<f32>;
    type Error = Infallible;

    fn embed(&mut self, table: &Linear, out: Buf) -> Result<(), Infallible> {
        let (n, k) = (self.batch.len(), table.k);
        let x = sized(&mut self.ws.bufs[out.index()], n * k);
        for (i, &t) in self.batch.tokens.iter().enumerate() {
            table.row(t as usize, &mut x[i * k..(i + 1) * k]);
        }
        self.ws.lens[out.index()] = n * k;
        Ok(())
    }

    fn rms_norm(&mut self, x: Buf, w: &Vec<f32>, eps: f32, out: Buf) -> Result<(), Infallible> {
        if x == out {
            rowops::rms_norm_in_place(self.rows_mut(x), w, eps);
            return Ok(());
        }
        let len = self.ws.lens[x.index()];
        self.map(x, out, len, |x, o| rowops::rms_norm(x, w, eps, o));
        Ok(())
    }

    fn scale(&mut self, x: Buf, s: f32) -> Result<(), Infallible> {
        self.rows_mut(x).iter_mut().for_each(|v| *v *= s);
        Ok(())
    }

    fn softcap(&mut self, x: Buf, cap: f32) -> Result<(), Infallible> {
        rowops::softcap(self.rows_mut(x), cap);
        Ok(())
    }

    fn qk_norm(
        &mut self,
        qkv: Buf,
        heads: Heads,
        q: &Vec<f32>,
        k: &Vec<f32>,
        eps: f32,
    ) -> Result<(), Infallible> {
        let (q_dim, kv_dim, width) = (heads.q_dim(), heads.kv_dim(), heads.qkv_dim());
        for row in self.rows_mut(qkv).chunks_exact_mut(width) {
            rowops::rms_norm_in_place(&mut row[..q_dim], q, eps);
            rowops::rms_norm_in_place(&mut row[q_dim..q_dim + kv_dim], k, eps);
        }
        Ok(())
    }

    fn add_rms_norm(
        &mut self,
        x: Buf,
        y: Buf,
        w: &Vec<f32>,
        eps: f32,
        out: Buf,
    ) -> Result<(), Infallible> {
        self.add(x, y)?;
        self.rms_norm(x, w, eps, out)
    }

    fn linear(&mut self, w: &Linear, x: Buf, y: Buf) -> Result<(), Infallible> {
        let (pool, n) = (self.pool, self.batch.len());
        self.map(x, y, n * w.n, |x, y| w.forward(pool, x, n, y));
        Ok(())
    }

    fn rope_store(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        rope: Option<Rope>,
        factors: Option<&Vec<f32>>,
    ) -> Result<(), Infallible> {
        if let Some(r) = rope {
            self.rope_tables(r, factors.map(Vec::as_slice));
        }
        let (hd, block) = (heads.head_dim, self.kv.block_size);
        let (q_dim, kv_dim, width) = (heads.q_dim(), heads.kv_dim(), heads.qkv_dim());
        let rows = &mut self.ws.bufs[qkv.index()][..self.ws.lens[qkv.index()]];
        for (i, row) in rows.chunks_exact_mut(width).enumerate() {
            let (q, rest) = row.split_at_mut(q_dim);
            let (k, v) = rest.split_at_mut(kv_dim);
            if let Some(r) = rope {
                let half = r.dim / 2;
                let (cs, sn) = (
                    &self.ws.cos[i * half..(i + 1) * half],
                    &self.ws.sin[i * half..(i + 1) * half],
                );
                rowops::rope(q, hd, r.style, cs, sn);
                rowops::rope(k, hd, r.style, cs, sn);
            }
            self.kv.write(layer, self.batch.slot(i, block), k, v);
        }
        Ok(())
    }

    fn attention(
        &mut self,
        layer: usize,
        qkv: Buf,
        heads: Heads,
        opts: AttnOpts,
        sinks: Option<&Vec<f32>>,
        out: Buf,
    ) -> Result<(), Infallible> {
        let shape = AttnShape {
            n_heads: heads.n_heads,
            n_kv_heads: heads.n_kv_heads,
            head_dim: heads.head_dim,
            block_size: self.kv.block_size,
        };
        let (pool, batch, n) = (self.pool, self.batch, self.batch.len());
        let (kc, vc) = self.kv.layer(layer);
        let mut o = std::mem::take(&mut self.ws.bufs[out.index()]);
        let q = self.ws.buf(qkv);
        let len = n * heads.q_dim();
        paged_attention(
            pool,
            shape,
            opts,
            sinks.map(Vec::as_slice),
            batch,
            q,
            heads.qkv_dim(),
            kc,
            vc,
            sized(&mut o, len),
        );
        self.ws.bufs[out.index()] = o;
        self.ws.lens[out.index()] = len;
        Ok(())
    }

    /// The FFN's rows are 3x (gate+up: 6x) the hidden width: a long prefill takes them
    /// [`FFN_ROWS`] tokens at a time instead of holding them all. Same results: every output
    /// row depends on its own input row only.
    fn gated_ffn(
        &mut self,
        gate_up: &Linear,
        down: &Linear,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), Infallible> {
        let (pool, n, ffn) = (self.pool, self.batch.len(), gate_up.n / 2);
        let (k, width) = (gate_up.k, down.n);
        let mut o = std::mem::take(&mut self.ws.bufs[out.index()]);
        let o_rows = sized(&mut o, n * width);
        let h = &self.ws.bufs[x.index()];
        for r0 in (0..n).step_by(FFN_ROWS) {
            let m = (n - r0).min(FFN_ROWS);
            let gu = sized(&mut self.ws.gu, m * 2 * ffn);
            gate_up.forward(pool, &h[r0 * k..(r0 + m) * k], m, gu);
            let a = sized(&mut self.ws.act, m * ffn);
            rowops::gated(pool, act, gu, ffn, a);
            down.forward(pool, a, m, &mut o_rows[r0 * width..(r0 + m) * width]);
        }
        self.ws.bufs[out.index()] = o;
        self.ws.lens[out.index()] = n * width;
        Ok(())
    }

    /// The router's logits and each token's routes, then the experts grouped by
    /// [`HostExperts::run`].
    fn moe_ffn(
        &mut self,
        moe: &MoeWeights<Linear>,
        act: Activation,
        x: Buf,
        out: Buf,
    ) -> Result<(), Infallible> {
        let (pool, n, ne) = (self.pool, self.batch.len(), moe.experts.len());
        let Some(first) = moe.experts.first() else {
            return Ok(());
        };
        let (k, width, used) = (first.gate_up.k, first.down.n, moe.rule.n_used);
        let ws = &mut *self.ws;
        let mut o = std::mem::take(&mut ws.bufs[out.index()]);
        let h = &ws.bufs[x.index()][..n * k];
        let logits = sized(&mut ws.router, n * ne);
        moe.router.forward(pool, h, n, logits);
        route_rows(logits, ne, &moe.rule, &mut ws.probs, &mut ws.routes);
        ws.experts.count_routes(&ws.routes, ne);
        let experts: Vec<_> = moe.experts.iter().map(|e| (&e.gate_up, &e.down)).collect();
        let o_rows = sized(&mut o, n * width);
        ws.host.run(
            pool,
            &experts,
            act,
            h,
            k,
            &ws.routes,
            used,
            width,
            o_rows,
            &mut ws.experts,
        );
        ws.bufs[out.index()] = o;
        ws.lens[out.index()] = n * width;
        Ok(())
    }

    fn add(&mut self, x: Buf, y: Buf) -> Result<(), Infallible> {
        let len = self.ws.lens[x.index()];
        let mut xs = std::mem::take(&mut self.ws.bufs[x.index()]);
        rowops::add_assign(&mut xs[..len], self.ws.buf(y));
        self.ws.bufs[x.index()] = xs;
        Ok(())
    }

    fn gather_rms_norm(
        &mut self,
        x: Buf,
        w: &Vec<f32>,
        eps: f32,
        out: Buf,
    ) -> Result<(), Infallible> {
        let width = w.len();
        let ws = &mut *self.ws;
        // The logits rows, then the states embeddings are pooled from, normed alike.
        for (rows, hidden) in [
            (&self.batch.logit_rows, false),
            (&self.batch.hidden_rows, true),
        ] {
            let len = rows.len() * width;
            let g = sized(&mut ws.gathered, len);
            let src = &ws.bufs[x.index()];
            for (j, &row) in rows.iter().enumerate() {
                g[j * width..(j + 1) * width].copy_from_slice(&src[row * width..(row + 1) * width]);
            }
            let o = if hidden {
                ws.hidden_len = len;
                sized(&mut ws.hidden, len)
            } else {
                ws.lens[out.index()] = len;
                sized(&mut ws.bufs[out.index()], len)
            };
            rowops::rms_norm(&ws.gathered[..len], w, eps, o);
        }
        Ok(())
    }

    fn logits(&mut self, head: &Linear, x: Buf, out: Buf) -> Result<(), Infallible> {
        let (pool, r) = (self.pool, self.batch.logit_rows.len());
        self.map(x, out, r * head.n, |x, y| head.forward(pool, x, r, y));
        Ok(())
    }
}

impl Model {
    /// Runs every token of `batch` through the model on the CPU, writing their K/V into `kv`,
    /// and returns the logits of `batch.logit_rows` (`logit_rows.len() * vocab` floats, in that
    /// order).
    pub fn forward<'w>(
        &self,
        pool: &ThreadPool,
        batch: &Batch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32], BatchError> {
        self.forward_as(&self.cfg, pool, batch, kv, ws)
    }

    /// As [`Self::forward`] under `cfg`, this model's configuration with fewer layers: the first
    /// `cfg.n_layers` blocks, then the output norm and head (an early exit; `kv` holds that many
    /// layers).
    pub fn forward_as<'w>(
        &self,
        cfg: &ModelConfig,
        pool: &ThreadPool,
        batch: &Batch,
        kv: &mut KvCache,
        ws: &'w mut Workspace,
    ) -> Result<&'w [f32], BatchError> {
        debug_assert!(cfg.n_layers <= self.cfg.n_layers);
        check_batch(cfg, batch, kv.num_blocks, kv.block_size)?;
        ws.experts.clear();
        let mut ops = CpuOps::new(pool, batch, kv, ws);
        match arch::forward(cfg, &self.weights, &mut ops) {
            Ok(()) => {}
            Err(never) => match never {},
        }
        Ok(ws.buf(Buf::Logits))
    }
}

/// The model on the CPU: the kernels crate's quantized matmuls and paged attention.
pub struct CpuBackend {
    lm: Arc<LoadedModel>,
    /// The configuration run: the model's, or its first layers only ([`Self::early_exit`]).
    cfg: ModelConfig,
    pool: ThreadPool,
    kv: KvCache,
    ws: Workspace,
}

impl CpuBackend {
    pub fn new(
        lm: Arc<LoadedModel>,
        threads: usize,
        block_size: usize,
        num_blocks: usize,
    ) -> Result<Self, BackendError> {
        Self::with_kv_types(lm, threads, block_size, num_blocks, KvTypes::F16)
    }

    /// As [`Self::new`], K and V stored as `types`.
    pub fn with_kv_types(
        lm: Arc<LoadedModel>,
        threads: usize,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<Self, BackendError> {
        let cfg = lm.model.cfg.clone();
        Self::with_config(lm, cfg, threads, block_size, num_blocks, types)
    }

    /// The model's first `layers` blocks and its output head, sharing `lm`'s weights, with a KV
    /// pool of that many layers (stored as `types`): the self-speculative drafter (LayerSkip's
    /// early exit).
    pub fn early_exit(
        lm: Arc<LoadedModel>,
        layers: usize,
        threads: usize,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<Self, BackendError> {
        let mut cfg = lm.model.cfg.clone();
        cfg.n_layers = layers.clamp(1, cfg.n_layers);
        Self::with_config(lm, cfg, threads, block_size, num_blocks, types)
    }

    fn with_config(
        lm: Arc<LoadedModel>,
        cfg: ModelConfig,
        threads: usize,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<Self, BackendError> {
        let kv = KvCache::with_types(&cfg, block_size, num_blocks, types)?;
        Ok(Self {
            lm,
            cfg,
            pool: ThreadPool::new(threads),
            kv,
            ws: Workspace::default(),
        })
    }
}

impl Backend for CpuBackend {
    fn describe(&self) -> String {
        format!("CPU, {} threads", self.pool.n_threads())
    }

    fn embeds(&self) -> bool {
        true
    }

    fn forward(&mut self, batch: &Batch, _: &[RowNeed]) -> Result<StepOutput<'_>, BackendError> {
        self.lm
            .model
            .forward_as(&self.cfg, &self.pool, batch, &mut self.kv, &mut self.ws)?;
        Ok(StepOutput {
            logits: self.ws.buf(Buf::Logits),
            hidden: self.ws.hidden(),
            argmax: &[],
            topk_k: 0,
            topk_ids: &[],
            topk_vals: &[],
        })
    }

    fn rebuild_kv(
        &mut self,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<(), BackendError> {
        self.kv = KvCache::with_types(&self.cfg, block_size, num_blocks, types)?;
        Ok(())
    }

    fn num_blocks(&self) -> usize {
        self.kv.num_blocks
    }

    fn kv_types(&self) -> KvTypes {
        self.kv.types()
    }

    fn block_size(&self) -> usize {
        self.kv.block_size
    }

    fn memory(&self) -> MemoryUse {
        MemoryUse {
            weights: self.lm.model.weights.bytes(),
            host_weights: 0,
            kv: self.kv.bytes(),
            activations: self.ws.bytes(),
            device_used: None,
            device_total: None,
        }
    }

    fn set_model(&mut self, lm: &Arc<LoadedModel>) -> Result<(), BackendError> {
        if lm.model.cfg != self.lm.model.cfg {
            return Err(BackendError::ShapeChanged);
        }
        self.lm = Arc::clone(lm);
        Ok(())
    }

    fn threads(&self) -> usize {
        self.pool.n_threads()
    }

    fn expert_load(&self) -> Option<&ExpertLoad> {
        self.ws.experts.share().map(|_| &self.ws.experts)
    }
}

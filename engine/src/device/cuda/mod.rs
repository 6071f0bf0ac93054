//! The CUDA device: the backend-ops seam over the PTX kernels of `tpslab_kernels::cuda`, and
//! [`CudaBackend`], the model (weights uploaded in their file format) and its paged KV pool on a
//! GPU, with the same batch and KV contract as the CPU. Per step: one upload of the batch's
//! integers, the recipe's kernels in order on one stream (replayed as a CUDA graph for decode
//! steps), one download of the greedy tokens (and of logits rows only where a sampler needs
//! them). Modules: `ops` (the recipe's ops as kernel launches), `weights` (the weights on the
//! device, and the experts `--n-cpu-moe` leaves in host memory), `support` (which of a model's
//! operations the CUDA path runs, and the backend's options).

mod ops;
mod support;
mod weights;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tpslab_kernels::cuda::{AttnSplit, CudaError, DBuf, GemmScratch, Gpu, Graph, flash_split};

use self::ops::{CudaOps, HostSide, MoeScratch};
pub use self::support::{CudaOpts, cuda_gap, refuse_kv_types};
pub use self::weights::{DevLinear, DevVector};
use self::weights::{DevWeights, Placement};

use crate::device::{
    Backend, BackendError, BatchError, ExpertLoad, MemoryUse, RowNeed, StepOutput, check_batch,
};
use crate::kv::{Batch, KvTypes};
use crate::model::LoadedModel;
use crate::model::arch;
use crate::model::config::ModelConfig;
use crate::model::ops::{Buf, Heads};
use crate::model::record::{Op, Recording};

/// A CUDA error with what the engine was doing.
fn cuda(what: impl Into<String>) -> impl FnOnce(CudaError) -> BackendError {
    let what = what.into();
    move |source| BackendError::Cuda { what, source }
}

/// Activation buffers for up to `cap` tokens and `cap` logits rows, one allocation.
struct DevWorkspace {
    cap: usize,
    buf: Option<DBuf>,
    ints: Option<DBuf>,
    offs: [usize; ACTS + 1],
    /// Floats per token of each sub-buffer ([`act_sizes`] of the model, fixed).
    sizes: [usize; ACTS],
    /// Logits rows (only the sampled rows have logits, so this is sized by the number of
    /// sequences, not tokens: a 128k vocabulary is 0.5 MB a row).
    logits: Option<DBuf>,
}

/// Sub-buffers of the activation allocation: those of [`Buf`] but the logits (x, h, qkv, attn,
/// tmp, last), then the FFN's gate|up and activation, then the greedy tokens.
const ACTS: usize = 9;
const GU: usize = 6;
const ACT: usize = 7;
const ARGMAX: usize = 8;

/// Floats (4-byte words) per token of each sub-buffer.
fn act_sizes(c: &ModelConfig) -> [usize; ACTS] {
    let heads = Heads::of(c);
    let mut s = [0; ACTS];
    for b in [Buf::X, Buf::H, Buf::Tmp, Buf::Last] {
        s[b.index()] = c.hidden;
    }
    s[Buf::Qkv.index()] = heads.qkv_dim();
    s[Buf::Attn.index()] = heads.q_dim();
    s[GU] = 2 * c.ffn;
    s[ACT] = c.ffn;
    s[ARGMAX] = 1;
    s
}

/// The model and its paged KV pool on one GPU.
pub struct CudaBackend {
    gpu: Gpu,
    cfg: ModelConfig,
    w: DevWeights,
    /// Bytes of the weights on the device, and of the experts left in host memory.
    weights_bytes: usize,
    host_bytes: usize,
    /// The blocks whose experts stay in host memory (`--n-cpu-moe`), and the CPU that runs them.
    cpu_moe_layers: usize,
    host: Option<HostSide>,
    kv: DBuf,
    block_size: usize,
    num_blocks: usize,
    ws: DevWorkspace,
    scratch: GemmScratch,
    /// The mixture-of-experts path's buffers (see `ops::MoeScratch`).
    moe: MoeScratch,
    staging: Vec<i32>,
    logits: Vec<f32>,
    argmax: Vec<u32>,
    /// Top-k candidates on the device (ids then values) and copied back.
    topk_buf: Option<DBuf>,
    topk_ids: Vec<u32>,
    topk_vals: Vec<f32>,
    /// Step graphs by (tokens, logits rows) as launched (padded for mixed steps), with the
    /// buffer addresses they captured.
    graphs: HashMap<(usize, usize), ([u64; 6], Graph)>,
    /// Shapes run once (buffers sized): the next step of that shape is captured.
    graph_seen: HashSet<(usize, usize)>,
    use_graphs: bool,
    /// Prefill runs of at least [`FLASH_MIN_RUN`] tokens through flash.cu's tiles (the rest per
    /// token). Off unless asked (`CudaOpts::flash`) until the GPU check has measured it.
    use_flash: bool,
    /// Mixed steps (prefill chunks beside decodes) of up to [`MIXED_GRAPH_MAX_TOKENS`] tokens
    /// padded to [`mixed_bucket`] sizes and replayed as graphs too. Off unless asked
    /// (`CudaOpts::mixed_graphs`) until the GPU check has measured it.
    use_mixed_graphs: bool,
    /// Where this step's flash split sits in its uploaded integers: (tiles at, tiles, rest at,
    /// rest), in i32s; `None` when the step has no prefill run to tile.
    split_at: Option<(usize, usize, usize, usize)>,
}

/// Largest mixed step replayed as a graph (padded to [`mixed_bucket`] tokens).
pub const MIXED_GRAPH_MAX_TOKENS: usize = 512;

/// The token count a mixed step of `n` tokens is padded to for its graph: a multiple of 16 up
/// to 128, then of 64. Padding tokens are token 0 at position 0 of the first sequence's block
/// table, store no K/V (slot -1), and their rows are never read.
pub fn mixed_bucket(n: usize) -> usize {
    if n <= 128 {
        n.max(1).next_multiple_of(16)
    } else {
        n.next_multiple_of(64)
    }
}

/// The (tokens, logits rows) a step is launched with and keyed by as a graph: decode steps as
/// they are, mixed steps padded; `None` for a step that runs without a graph.
fn graph_shape(batch: &Batch, mixed: bool) -> Option<(usize, usize)> {
    let (n, r) = (batch.len(), batch.logit_rows.len());
    if n == r && n == batch.block_tables.len() && n <= GRAPH_MAX_BATCH {
        Some((n, r))
    } else if mixed && n <= MIXED_GRAPH_MAX_TOKENS && !batch.block_tables.is_empty() {
        let np = mixed_bucket(n);
        Some((np, r.max(1).next_power_of_two().min(np)))
    } else {
        None
    }
}

/// Shortest prefill run that flash.cu takes (a tile has 64 rows; shorter runs waste most of it).
pub const FLASH_MIN_RUN: usize = 16;

/// Largest decode batch replayed as a CUDA graph (as vLLM's default capture sizes end at 512).
pub const GRAPH_MAX_BATCH: usize = 512;

impl CudaBackend {
    /// Uploads the model to GPU `ordinal` and sizes the KV pool: `kv_budget` bytes, or with
    /// `fraction > 0` that fraction of the memory left free after the weights. Options from the
    /// environment ([`CudaOpts::from_env`]).
    pub fn new(
        lm: &Arc<LoadedModel>,
        ordinal: usize,
        block_size: usize,
        kv_budget: usize,
        fraction: f32,
    ) -> Result<Self, BackendError> {
        let opts = CudaOpts::from_env();
        Self::new_with(lm, ordinal, block_size, kv_budget, fraction, opts)
    }

    /// [`CudaBackend::new`] with `opts`.
    pub fn new_with(
        lm: &Arc<LoadedModel>,
        ordinal: usize,
        block_size: usize,
        kv_budget: usize,
        fraction: f32,
        opts: CudaOpts,
    ) -> Result<Self, BackendError> {
        let cfg = lm.model.cfg.clone();
        if !Gpu::supports_head_dim(cfg.head_dim) {
            return Err(BackendError::HeadDim(cfg.head_dim));
        }
        let place = Placement::new(&lm.model.weights, opts.cpu_moe_layers);
        place.check_types(&lm.model.weights)?;
        if let Some(gap) = cuda_gap(&cfg, &lm.model.weights, opts.untried) {
            return Err(gap.into());
        }
        refuse_kv_types(opts.kv_types)?;
        let mut gpu = Gpu::new(ordinal).map_err(cuda(format!("opening cuda:{ordinal}")))?;
        gpu.set_mmvq(opts.mmvq);
        gpu.set_mmq(opts.mmq);
        gpu.set_wide(opts.wide);
        let w = place
            .upload(&gpu, &lm.model.weights)
            .map_err(cuda(format!("uploading the weights to {}", gpu.name())))?;
        let budget = if fraction > 0.0 {
            let (free, _) = gpu.mem_info().map_err(cuda("asking the free memory"))?;
            (free as f64 * f64::from(fraction.min(0.95))) as usize
        } else {
            kv_budget
        };
        let blocks = KvTypes::F16.pool_for_budget(&cfg, block_size, budget)?;
        let sizes = act_sizes(&cfg);
        let mut me = Self {
            kv: gpu.alloc(1).map_err(cuda("allocating the KV pool"))?,
            gpu,
            cfg,
            w,
            weights_bytes: lm.model.weights.bytes() - place.host_bytes,
            host_bytes: place.host_bytes,
            cpu_moe_layers: opts.cpu_moe_layers,
            host: (place.host_bytes > 0).then(|| HostSide::new(opts.threads)),
            block_size,
            num_blocks: 0,
            ws: DevWorkspace {
                cap: 0,
                buf: None,
                ints: None,
                offs: [0; ACTS + 1],
                sizes,
                logits: None,
            },
            scratch: GemmScratch::default(),
            moe: MoeScratch::default(),
            staging: Vec::new(),
            logits: Vec::new(),
            argmax: Vec::new(),
            topk_buf: None,
            topk_ids: Vec::new(),
            topk_vals: Vec::new(),
            graphs: HashMap::new(),
            graph_seen: HashSet::new(),
            // A mixture of experts is routed on the host (a sync a layer): never captured.
            use_graphs: opts.graphs && lm.model.cfg.extras.moe.is_none(),
            use_flash: opts.flash,
            use_mixed_graphs: opts.mixed_graphs,
            split_at: None,
        };
        me.rebuild_kv(block_size, blocks, KvTypes::F16)?;
        if opts.trial_kernels {
            me.set_trial_kernels(true);
        }
        me.warm_up()?;
        Ok(me)
    }

    /// Turns every kernel that is opt-in until the GPU check has measured it on or off at once:
    /// 8-bit-activation matrix-vector kernels, the fused tensor-core GEMM for 9 to 256 rows,
    /// wide-load F16/BF16 batch-1 kernels, flash prefill and graphs of padded mixed steps
    /// (`CudaOpts::mmvq`, `mmq`, `wide`, `flash`, `mixed_graphs`). Graphs captured before are
    /// dropped.
    pub fn set_trial_kernels(&mut self, on: bool) {
        self.gpu.set_mmvq(on);
        self.gpu.set_mmq(on);
        self.gpu.set_wide(on);
        self.use_flash = on;
        self.use_mixed_graphs = on;
        self.graphs.clear();
        self.graph_seen.clear();
    }

    /// A profile run as vLLM does at start: one prefill long enough for the GEMM path and one
    /// decode, so cuBLAS's initialisation, the buffers and the driver's first launches are paid
    /// here and not in the first request's TTFT. It also fails early if a kernel cannot run.
    fn warm_up(&mut self) -> Result<(), BackendError> {
        let n = (self.num_blocks * self.block_size)
            .min(64)
            .min(self.cfg.context_len);
        if n < 2 {
            return Ok(());
        }
        let blocks: Vec<u32> = (0..n.div_ceil(self.block_size) as u32).collect();
        let mut prefill = Batch::default();
        prefill.push_seq(blocks.clone(), 0, &vec![0u32; n - 1], true);
        let mut decode = Batch::default();
        decode.push_seq(blocks, n - 1, &[0], true);
        let name = self.gpu.name().to_string();
        for (b, full) in [(prefill, false), (decode, true)] {
            let need = if full { RowNeed::Full } else { RowNeed::Argmax };
            if let Err(e) = self.forward(&b, &[need]) {
                return Err(BackendError::WarmUp {
                    device: name,
                    source: Box::new(e),
                });
            }
        }
        Ok(())
    }

    fn ensure_workspace(&mut self, n: usize, rows: usize) -> Result<(), CudaError> {
        let row = self.cfg.vocab * 4;
        // Doubling, at least 8 rows.
        self.gpu.grow(&mut self.ws.logits, rows * row, |old| {
            (2 * old).max(8 * row)
        })?;
        if n <= self.ws.cap {
            return Ok(());
        }
        let cap = n.max(self.ws.cap * 2).max(16);
        let mut offs = [0usize; ACTS + 1];
        let mut at = 0;
        for (i, s) in self.ws.sizes.iter().enumerate() {
            offs[i] = at;
            // 256-byte aligned sub-buffers.
            at += (s * cap * 4).div_ceil(256) * 256;
        }
        offs[ACTS] = at;
        self.ws.buf = None;
        self.ws.buf = Some(self.gpu.alloc(at)?);
        self.ws.offs = offs;
        self.ws.cap = cap;
        Ok(())
    }

    /// A step's setup: the context bound, the buffers sized for it (for `pad`'s (tokens, rows)
    /// when given), its integers uploaded (their device address returned).
    fn prepare(&mut self, batch: &Batch, pad: Option<(usize, usize)>) -> Result<u64, CudaError> {
        self.gpu.bind()?;
        let (n, r) = pad.unwrap_or((batch.len(), batch.logit_rows.len()));
        self.ensure_workspace(n, r)?;
        self.upload_ints(batch, pad)
    }

    fn ints(&mut self, len: usize) -> Result<u64, CudaError> {
        // Generous, so that growing block tables rarely move it (which stales the graphs).
        self.gpu
            .grow(&mut self.ws.ints, len * 4, |_| (len * 4 * 2).max(1 << 20))
    }

    /// Uploads the batch's integers: tokens, positions, slots, block-table offsets, logits rows,
    /// block tables, and with flash on the step's tiles and other tokens (in that order, one
    /// copy). With `pad` (a graph's shape), each per-token section is padded to its tokens with
    /// padding tokens ([`mixed_bucket`]) and the logits rows to its rows with row 0; such a step
    /// takes no flash tiles (their count varies from step to step).
    fn upload_ints(
        &mut self,
        batch: &Batch,
        pad: Option<(usize, usize)>,
    ) -> Result<u64, CudaError> {
        let n = batch.len();
        let (np, rp) = pad.unwrap_or((n, batch.logit_rows.len()));
        let extra = np - n;
        let st = &mut self.staging;
        st.clear();
        st.extend(batch.tokens.iter().map(|&t| t as i32));
        st.extend(std::iter::repeat_n(0, extra));
        st.extend(batch.positions.iter().map(|&p| p as i32));
        st.extend(std::iter::repeat_n(0, extra));
        st.extend((0..n).map(|i| batch.slot(i, self.block_size) as i32));
        st.extend(std::iter::repeat_n(-1, extra));
        let mut starts = Vec::with_capacity(batch.block_tables.len());
        let mut acc = 0;
        for t in &batch.block_tables {
            starts.push(acc as i32);
            acc += t.len();
        }
        st.extend(batch.seq_of.iter().map(|&s| starts[s]));
        st.extend(std::iter::repeat_n(0, extra));
        st.extend(batch.logit_rows.iter().map(|&x| x as i32));
        st.extend(std::iter::repeat_n(0, rp - batch.logit_rows.len()));
        for t in &batch.block_tables {
            st.extend(t.iter().map(|&b| b as i32));
        }
        self.split_at = None;
        if self.use_flash && pad.is_none() {
            let (tiles, rest) = flash_split(&batch.seq_of, &batch.positions, FLASH_MIN_RUN);
            if !tiles.is_empty() {
                let at = self.staging.len();
                self.split_at = Some((at, tiles.len() / 2, at + tiles.len(), rest.len()));
                self.staging.extend(tiles);
                self.staging.extend(rest);
            }
        }
        let total = self.staging.len();
        let ints = self.ints(total)?;
        self.gpu.htod(ints, &self.staging)?;
        Ok(ints)
    }

    /// Addresses every launch of a step depends on; a graph captured under other ones is stale.
    fn signature(&self, ints: u64) -> [u64; 6] {
        let (sx, sw) = self.scratch.ptrs();
        [
            ints,
            self.ws.buf.as_ref().map_or(0, DBuf::ptr),
            self.ws.logits.as_ref().map_or(0, DBuf::ptr),
            self.kv.ptr(),
            sx,
            sw,
        ]
    }

    /// Runs the step; returns the device address of its logits. Pure decode steps (one token
    /// per sequence, every one sampled) of up to [`GRAPH_MAX_BATCH`] sequences, and with
    /// `use_mixed_graphs` mixed steps padded to a bucket, replay a CUDA graph captured the second
    /// time that shape is seen (the first run sizes every buffer, so the capture allocates
    /// nothing).
    fn run(&mut self, batch: &Batch) -> Result<u64, CudaError> {
        let (n, r) = (batch.len(), batch.logit_rows.len());
        let shape = graph_shape(batch, self.use_mixed_graphs).filter(|_| self.use_graphs);
        let ints = self.prepare(batch, shape)?;
        self.moe.load.clear();
        match shape {
            None => self.launch(n, r, ints, None)?,
            Some(key) => self.replay(key, ints)?,
        }
        let logits = self.ws.logits.as_ref().map_or(0, DBuf::ptr);
        self.argmax.resize(r, 0);
        let greedy = self.ws.buf.as_ref().map_or(0, DBuf::ptr) + self.ws.offs[ARGMAX] as u64;
        self.gpu.dtoh(greedy, &mut self.argmax)?;
        Ok(logits)
    }

    /// Runs a step of `key` = (tokens, rows) as launched through its graph: replayed when
    /// captured, captured when that shape has run once, else run and remembered.
    fn replay(&mut self, key: (usize, usize), ints: u64) -> Result<(), CudaError> {
        let (n, r) = key;
        let sig = self.signature(ints);
        if self.graphs.values().any(|(s, _)| *s != sig) {
            // A buffer moved (it grew): every graph holds old addresses.
            self.graphs.clear();
            self.graph_seen.clear();
        }
        if let Some((_, g)) = self.graphs.get(&key) {
            self.gpu.launch_graph(g)?;
        } else if self.graph_seen.contains(&key) {
            self.gpu.begin_capture()?;
            let launched = self.launch(n, r, ints, None);
            match (launched, self.gpu.end_capture()) {
                (Ok(()), Ok(graph)) => {
                    self.gpu.launch_graph(&graph)?;
                    self.graphs.insert(key, (sig, graph));
                }
                // A driver or library that cannot capture: run without graphs from now on
                // (the capture queued nothing, so this step runs as usual).
                _ => {
                    self.use_graphs = false;
                    self.graphs.clear();
                    self.launch(n, r, ints, None)?;
                }
            }
        } else {
            self.launch(n, r, ints, None)?;
            self.graph_seen.insert(key);
        }
        Ok(())
    }

    /// Queues every kernel of one step (no host copies, no synchronization, no allocation
    /// once the buffers have grown to this batch: safe to capture): the recipe on [`CudaOps`].
    /// With `record`, the ops are listed there too (see [`Self::recorded_step`]).
    fn launch(
        &mut self,
        n: usize,
        r: usize,
        ints: u64,
        record: Option<&mut Vec<Op>>,
    ) -> Result<(), CudaError> {
        let at = |k: usize| ints + 4 * k as u64;
        let base = self.ws.buf.as_ref().map_or(0, DBuf::ptr);
        let mut bufs = [0u64; ACTS];
        for (b, off) in bufs.iter_mut().zip(&self.ws.offs) {
            *b = base + *off as u64;
        }
        let mut ops = CudaOps {
            g: &self.gpu,
            sc: &mut self.scratch,
            moe: &mut self.moe,
            host: self.host.as_mut(),
            n,
            r,
            bufs,
            widths: self.ws.sizes,
            logits: self.ws.logits.as_ref().map_or(0, DBuf::ptr),
            vocab: self.cfg.vocab,
            tokens: at(0),
            pos: at(n),
            slots: at(2 * n),
            bt_off: at(3 * n),
            rows: at(4 * n),
            bt: at(4 * n + r),
            kv: self.kv.ptr(),
            layer_bytes: (self.num_blocks * self.block_size * self.cfg.kv_dim() * 2) as u64,
            block_size: self.block_size,
            split: self.split_at.map(|(t, nt, r, nr)| AttnSplit {
                tiles: at(t),
                n_tiles: nt,
                rest: at(r),
                n_rest: nr,
            }),
        };
        match record {
            None => arch::forward(&self.cfg, &self.w, &mut ops),
            Some(out) => {
                let mut rec = Recording::around(ops);
                arch::forward(&self.cfg, &self.w, &mut rec)?;
                *out = rec.into_parts().1;
                Ok(())
            }
        }
    }

    /// Runs one step (never as a graph) with its ops recorded, and returns them: the GPU check
    /// holds CUDA's op sequence against the recording device's.
    pub fn recorded_step(&mut self, batch: &Batch) -> Result<Vec<Op>, BackendError> {
        check_batch(&self.cfg, batch, self.num_blocks, self.block_size)?;
        let (n, r) = (batch.len(), batch.logit_rows.len());
        let mut ops = Vec::new();
        let mut step = |me: &mut Self| -> Result<(), CudaError> {
            let ints = me.prepare(batch, None)?;
            me.launch(n, r, ints, Some(&mut ops))?;
            me.gpu.sync()
        };
        step(self).map_err(cuda("running a recorded step"))?;
        Ok(ops)
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        let gpu = format!("CUDA cuda:{} {}", self.gpu.ordinal(), self.gpu.name());
        match &self.host {
            Some(h) => format!(
                "{gpu}, experts of {} blocks on the CPU ({} threads)",
                self.cpu_moe_layers.min(self.cfg.n_layers),
                h.threads()
            ),
            None => gpu,
        }
    }

    fn forward(
        &mut self,
        batch: &Batch,
        needs: &[RowNeed],
    ) -> Result<StepOutput<'_>, BackendError> {
        check_batch(&self.cfg, batch, self.num_blocks, self.block_size)?;
        if batch.is_empty() {
            return Err(BatchError::Empty.into());
        }
        let logits = self.run(batch).map_err(cuda("running a step"))?;
        let (vocab, r) = (self.cfg.vocab, batch.logit_rows.len());
        let need = |j: usize| needs.get(j).copied().unwrap_or(RowNeed::Full);
        // Top-k rows: the largest k of all of them, selected on the device for every row (one
        // launch), copied back only for the rows that asked.
        let kmax = (0..r)
            .filter_map(|j| match need(j) {
                RowNeed::TopK(k) => Some(k.min(vocab)),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        self.topk_ids.clear();
        self.topk_vals.clear();
        if kmax > 0 {
            let bytes = r * kmax * 4;
            let ids = self
                .gpu
                .grow(&mut self.topk_buf, 2 * bytes, |_| 2 * bytes)
                .map_err(cuda("copying the logits back"))?;
            let vals = ids + bytes as u64;
            self.gpu
                .topk(logits, r, vocab, kmax, ids, vals)
                .map_err(cuda("copying the logits back"))?;
            for j in (0..r).filter(|&j| matches!(need(j), RowNeed::TopK(_))) {
                let at = self.topk_ids.len();
                self.topk_ids.resize(at + kmax, 0);
                self.topk_vals.resize(at + kmax, 0.0);
                let off = (j * kmax * 4) as u64;
                self.gpu
                    .dtoh(ids + off, &mut self.topk_ids[at..])
                    .map_err(cuda("copying the logits back"))?;
                self.gpu
                    .dtoh(vals + off, &mut self.topk_vals[at..])
                    .map_err(cuda("copying the logits back"))?;
            }
        }
        self.logits.clear();
        for j in (0..r).filter(|&j| need(j) == RowNeed::Full) {
            let at = self.logits.len();
            self.logits.resize(at + vocab, 0.0);
            self.gpu
                .dtoh(logits + (j * vocab * 4) as u64, &mut self.logits[at..])
                .map_err(cuda("copying the logits back"))?;
        }
        Ok(StepOutput {
            logits: &self.logits,
            hidden: &[],
            argmax: &self.argmax,
            topk_k: kmax,
            topk_ids: &self.topk_ids,
            topk_vals: &self.topk_vals,
        })
    }

    fn rebuild_kv(
        &mut self,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<(), BackendError> {
        refuse_kv_types(types)?;
        if num_blocks == 0 {
            return Err(BackendError::EmptyPool);
        }
        let bytes = KvTypes::F16
            .bytes_per_block(&self.cfg, block_size)
            .checked_mul(num_blocks)
            .ok_or(BackendError::PoolOverflow)?;
        // Graphs captured the old pool's address and block size.
        self.graphs.clear();
        self.graph_seen.clear();
        // Free the old pool before taking the new one.
        self.kv = self.gpu.alloc(1).map_err(cuda("freeing the KV pool"))?;
        self.kv = self
            .gpu
            .alloc(bytes)
            .map_err(cuda(format!("KV pool of {num_blocks} blocks")))?;
        self.block_size = block_size;
        self.num_blocks = num_blocks;
        Ok(())
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
    }

    fn kv_types(&self) -> KvTypes {
        KvTypes::F16
    }

    fn block_size(&self) -> usize {
        self.block_size
    }

    fn memory(&self) -> MemoryUse {
        let (used, total) = match self.gpu.mem_info() {
            Ok((free, total)) => (Some((total - free) as u64), Some(total as u64)),
            Err(_) => (None, None),
        };
        MemoryUse {
            weights: self.weights_bytes,
            host_weights: self.host_bytes,
            kv: self.kv.len(),
            activations: self.ws.buf.as_ref().map_or(0, DBuf::len)
                + self.ws.ints.as_ref().map_or(0, DBuf::len)
                + self.ws.logits.as_ref().map_or(0, DBuf::len)
                + self.scratch.bytes()
                + self.host.as_ref().map_or(0, HostSide::bytes),
            device_used: used,
            device_total: total,
        }
    }

    /// The CPU threads that run the experts kept in host memory, or 0.
    fn threads(&self) -> usize {
        self.host.as_ref().map_or(0, HostSide::threads)
    }

    fn expert_load(&self) -> Option<&ExpertLoad> {
        self.moe.load.share().map(|_| &self.moe.load)
    }

    fn set_model(&mut self, lm: &Arc<LoadedModel>) -> Result<(), BackendError> {
        if lm.model.cfg != self.cfg {
            return Err(BackendError::ShapeChanged);
        }
        let place = Placement::new(&lm.model.weights, self.cpu_moe_layers);
        place.check_types(&lm.model.weights)?;
        // Both sets are on the device for a moment; without room for that the old one stays.
        let w = place
            .upload(&self.gpu, &lm.model.weights)
            .map_err(cuda(format!(
                "uploading the new weights to {}",
                self.gpu.name()
            )))?;
        self.w = w;
        self.weights_bytes = lm.model.weights.bytes() - place.host_bytes;
        self.host_bytes = place.host_bytes;
        // The captured graphs point at the old weights.
        self.graphs.clear();
        self.graph_seen.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mixed_steps_pad_to_buckets_and_decodes_keep_their_shape() {
        assert_eq!(
            [1, 16, 17, 128, 129, 300, 512].map(mixed_bucket),
            [16, 16, 32, 128, 192, 320, 512]
        );
        // Three decodes: as they are.
        let mut b = Batch::default();
        for s in 0..3u32 {
            b.push_seq(vec![s], 5, &[7], true);
        }
        assert_eq!(graph_shape(&b, false), Some((3, 3)));
        // A prefill chunk of 37 (its last token sampled) beside two decodes: 39 tokens, 3 rows,
        // padded to (48, 4) only with mixed graphs on.
        let mut b = Batch::default();
        b.push_seq(vec![0, 1, 2], 0, &[9; 37], true);
        b.push_seq(vec![3], 4, &[7], true);
        b.push_seq(vec![4], 4, &[7], true);
        assert_eq!(graph_shape(&b, false), None);
        assert_eq!(graph_shape(&b, true), Some((48, 4)));
        // Past the largest mixed graph: no graph.
        let mut b = Batch::default();
        b.push_seq((0..40).collect(), 0, &[9; 600], true);
        assert_eq!(graph_shape(&b, true), None);
    }
}

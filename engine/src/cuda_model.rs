//! The Llama-family forward pass on a GPU: the same weights (uploaded in their file format), the
//! same batch and paged-KV contract as the CPU [`crate::model::Model`], with the kernels of
//! `tpslab_kernels::cuda`. Per step: one upload of the batch's integers, the layers' kernels in
//! order on one stream, one download of the greedy tokens (and of logits rows only where a
//! sampler needs them).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use tpslab_kernels::cuda::{AttnGeom, AttnIo, CudaError, DBuf, DevMatrix, GemmScratch, Gpu, Graph};

use crate::backend::{Backend, MemoryUse, RowNeed, StepOutput};
use crate::config::{ModelConfig, RopeStyle};
use crate::generate::LoadedModel;
use crate::kv::{Batch, KvCache};
use crate::model::{ModelError, check_batch};
use crate::weights::{Linear, Weights};

fn gpu_err(e: CudaError) -> ModelError {
    ModelError::Batch(format!("GPU: {e}"))
}

/// Refuses, before touching a GPU, weights of a type the CUDA kernels do not read (Q5_K).
fn check_weight_types(w: &Weights) -> Result<(), String> {
    let layers = w
        .layers
        .iter()
        .flat_map(|l| [&l.wqkv, &l.wo, &l.w_gate_up, &l.w_down]);
    for l in std::iter::once(&w.embed).chain(layers).chain(&w.lm_head) {
        tpslab_kernels::cuda::check_type(l.ty).map_err(|e| e.to_string())?;
    }
    Ok(())
}

struct DevLinear {
    m: DevMatrix,
    bias: Option<DBuf>,
    _data: DBuf,
}

impl DevLinear {
    fn upload(gpu: &Gpu, l: &Linear) -> Result<Self, CudaError> {
        let data = gpu.upload(&l.data)?;
        let bias = l.bias.as_ref().map(|b| gpu.upload(b)).transpose()?;
        Ok(Self {
            m: DevMatrix {
                ty: l.ty,
                n: l.n,
                k: l.k,
                ptr: data.ptr(),
            },
            bias,
            _data: data,
        })
    }

    fn forward(
        &self,
        gpu: &Gpu,
        x: u64,
        m: usize,
        y: u64,
        scratch: &mut GemmScratch,
    ) -> Result<(), CudaError> {
        gpu.matmul(&self.m, x, m, y, scratch)?;
        if let Some(b) = &self.bias {
            gpu.add_bias(y, b.ptr(), self.m.n, m)?;
        }
        Ok(())
    }
}

struct DevLayer {
    attn_norm: DBuf,
    wqkv: DevLinear,
    wo: DevLinear,
    ffn_norm: DBuf,
    w_gate_up: DevLinear,
    w_down: DevLinear,
}

struct DevWeights {
    embed: DevLinear,
    layers: Vec<DevLayer>,
    out_norm: DBuf,
    lm_head: Option<DevLinear>,
    bytes: usize,
}

impl DevWeights {
    fn upload(gpu: &Gpu, w: &Weights) -> Result<Self, CudaError> {
        let mut layers = Vec::with_capacity(w.layers.len());
        for l in &w.layers {
            layers.push(DevLayer {
                attn_norm: gpu.upload(&l.attn_norm)?,
                wqkv: DevLinear::upload(gpu, &l.wqkv)?,
                wo: DevLinear::upload(gpu, &l.wo)?,
                ffn_norm: gpu.upload(&l.ffn_norm)?,
                w_gate_up: DevLinear::upload(gpu, &l.w_gate_up)?,
                w_down: DevLinear::upload(gpu, &l.w_down)?,
            });
        }
        Ok(Self {
            embed: DevLinear::upload(gpu, &w.embed)?,
            layers,
            out_norm: gpu.upload(&w.out_norm)?,
            lm_head: w
                .lm_head
                .as_ref()
                .map(|l| DevLinear::upload(gpu, l))
                .transpose()?,
            bytes: w.bytes(),
        })
    }

    fn lm_head(&self) -> &DevLinear {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }
}

/// Activation buffers for up to `cap` tokens and `cap` logits rows, one allocation.
struct DevWorkspace {
    cap: usize,
    buf: Option<DBuf>,
    ints: Option<DBuf>,
    offs: [usize; 9],
    /// Logits rows (only the sampled rows have logits, so this is sized by the number of
    /// sequences, not tokens: a 128k vocabulary is 0.5 MB a row).
    logits: Option<DBuf>,
}

/// Floats per token of each activation buffer: x, h, qkv, attn, tmp, gu, act, last.
fn act_sizes(c: &ModelConfig) -> [usize; 8] {
    let qkv = c.hidden + 2 * c.kv_dim();
    [
        c.hidden,
        c.hidden,
        qkv,
        c.hidden,
        c.hidden,
        2 * c.ffn,
        c.ffn,
        c.hidden,
    ]
}

/// The model and its paged KV pool on one GPU.
pub struct CudaBackend {
    gpu: Gpu,
    cfg: ModelConfig,
    w: DevWeights,
    kv: DBuf,
    block_size: usize,
    num_blocks: usize,
    ws: DevWorkspace,
    scratch: GemmScratch,
    staging: Vec<i32>,
    logits: Vec<f32>,
    argmax: Vec<u32>,
    /// Top-k candidates on the device (ids then values) and copied back.
    topk_buf: Option<DBuf>,
    topk_ids: Vec<u32>,
    topk_vals: Vec<f32>,
    /// Decode-step graphs by batch size, with the buffer addresses they captured.
    graphs: HashMap<usize, ([u64; 6], Graph)>,
    /// Batch sizes run once (buffers sized): the next step of that size is captured.
    graph_seen: HashSet<usize>,
    use_graphs: bool,
}

/// Largest decode batch replayed as a CUDA graph (as vLLM's default capture sizes end at 512).
pub const GRAPH_MAX_BATCH: usize = 512;

impl CudaBackend {
    /// Uploads the model to GPU `ordinal` and sizes the KV pool: `kv_budget` bytes, or with
    /// `fraction > 0` that fraction of the memory left free after the weights.
    pub fn new(
        lm: &Arc<LoadedModel>,
        ordinal: usize,
        block_size: usize,
        kv_budget: usize,
        fraction: f32,
    ) -> Result<Self, String> {
        let cfg = lm.model.cfg.clone();
        if !Gpu::supports_head_dim(cfg.head_dim) {
            return Err(format!(
                "the CUDA attention kernel does not take head size {}",
                cfg.head_dim
            ));
        }
        check_weight_types(&lm.model.weights)?;
        let gpu = Gpu::new(ordinal).map_err(|e| e.to_string())?;
        let w = DevWeights::upload(&gpu, &lm.model.weights)
            .map_err(|e| format!("uploading the weights to {}: {e}", gpu.name()))?;
        let budget = if fraction > 0.0 {
            let (free, _) = gpu.mem_info().map_err(|e| e.to_string())?;
            (free as f64 * f64::from(fraction.min(0.95))) as usize
        } else {
            kv_budget
        };
        let blocks = KvCache::blocks_for_budget(&cfg, block_size.max(1), budget);
        let mut me = Self {
            kv: gpu.alloc(1).map_err(|e| e.to_string())?,
            gpu,
            cfg,
            w,
            block_size,
            num_blocks: 0,
            ws: DevWorkspace {
                cap: 0,
                buf: None,
                ints: None,
                offs: [0; 9],
                logits: None,
            },
            scratch: GemmScratch::default(),
            staging: Vec::new(),
            logits: Vec::new(),
            argmax: Vec::new(),
            topk_buf: None,
            topk_ids: Vec::new(),
            topk_vals: Vec::new(),
            graphs: HashMap::new(),
            graph_seen: HashSet::new(),
            // TPSLAB_CUDA_GRAPHS=0 turns graphs off (to measure what they pay).
            use_graphs: std::env::var("TPSLAB_CUDA_GRAPHS").map_or(true, |v| v != "0"),
        };
        me.rebuild_kv(block_size, blocks)?;
        me.warm_up()?;
        Ok(me)
    }

    /// A profile run as vLLM does at start: one prefill long enough for the GEMM path and one
    /// decode, so cuBLAS's initialisation, the buffers and the driver's first launches are paid
    /// here and not in the first request's TTFT. It also fails early if a kernel cannot run.
    fn warm_up(&mut self) -> Result<(), String> {
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
                return Err(format!("warm-up step on {name}: {e}"));
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
        let mut offs = [0usize; 9];
        let mut at = 0;
        for (i, s) in act_sizes(&self.cfg).iter().enumerate() {
            offs[i] = at;
            // 256-byte aligned sub-buffers.
            at += (s * cap * 4).div_ceil(256) * 256;
        }
        offs[8] = at;
        self.ws.buf = None;
        self.ws.buf = Some(self.gpu.alloc(at)?);
        self.ws.offs = offs;
        self.ws.cap = cap;
        Ok(())
    }

    fn ints(&mut self, len: usize) -> Result<u64, CudaError> {
        // Generous, so that growing block tables rarely move it (which stales the graphs).
        self.gpu
            .grow(&mut self.ws.ints, len * 4, |_| (len * 4 * 2).max(1 << 20))
    }

    /// Uploads the batch's integers: tokens, positions, slots, block-table offsets, logits rows,
    /// block tables (in that order, one copy).
    fn upload_ints(&mut self, batch: &Batch) -> Result<u64, CudaError> {
        let n = batch.len();
        let st = &mut self.staging;
        st.clear();
        st.extend(batch.tokens.iter().map(|&t| t as i32));
        st.extend(batch.positions.iter().map(|&p| p as i32));
        st.extend((0..n).map(|i| batch.slot(i, self.block_size) as i32));
        let mut starts = Vec::with_capacity(batch.block_tables.len());
        let mut acc = 0;
        for t in &batch.block_tables {
            starts.push(acc as i32);
            acc += t.len();
        }
        st.extend(batch.seq_of.iter().map(|&s| starts[s]));
        st.extend(batch.logit_rows.iter().map(|&x| x as i32));
        for t in &batch.block_tables {
            st.extend(t.iter().map(|&b| b as i32));
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
    /// per sequence, every one sampled) of up to [`GRAPH_MAX_BATCH`] sequences replay a CUDA
    /// graph captured the second time that batch size is seen (the first run sizes every buffer,
    /// so the capture allocates nothing).
    fn run(&mut self, batch: &Batch) -> Result<u64, CudaError> {
        let n = batch.len();
        let r = batch.logit_rows.len();
        self.gpu.bind()?;
        self.ensure_workspace(n, r)?;
        let ints = self.upload_ints(batch)?;
        let decode =
            self.use_graphs && n == r && n == batch.block_tables.len() && n <= GRAPH_MAX_BATCH;
        if decode {
            let sig = self.signature(ints);
            if self.graphs.values().any(|(s, _)| *s != sig) {
                // A buffer moved (it grew): every graph holds old addresses.
                self.graphs.clear();
                self.graph_seen.clear();
            }
            if let Some((_, g)) = self.graphs.get(&n) {
                self.gpu.launch_graph(g)?;
            } else if self.graph_seen.contains(&n) {
                self.gpu.begin_capture()?;
                let launched = self.launch(n, r, ints);
                match (launched, self.gpu.end_capture()) {
                    (Ok(()), Ok(graph)) => {
                        self.gpu.launch_graph(&graph)?;
                        self.graphs.insert(n, (sig, graph));
                    }
                    // A driver or library that cannot capture: run without graphs from now on
                    // (the capture queued nothing, so this step runs as usual).
                    _ => {
                        self.use_graphs = false;
                        self.graphs.clear();
                        self.launch(n, r, ints)?;
                    }
                }
            } else {
                self.launch(n, r, ints)?;
                self.graph_seen.insert(n);
            }
        } else {
            self.launch(n, r, ints)?;
        }
        let logits = self.ws.logits.as_ref().map_or(0, DBuf::ptr);
        // The greedy tokens were written into the (free by then) `tmp` buffer.
        self.argmax.resize(r, 0);
        let tmp = self.ws.buf.as_ref().map_or(0, DBuf::ptr) + self.ws.offs[4] as u64;
        self.gpu.dtoh(tmp, &mut self.argmax)?;
        Ok(logits)
    }

    /// Queues every kernel of one step (no host copies, no synchronization, no allocation
    /// once the buffers have grown to this batch: safe to capture).
    fn launch(&mut self, n: usize, r: usize, ints: u64) -> Result<(), CudaError> {
        let c = &self.cfg;
        let at = |k: usize| ints + 4 * k as u64;
        let (tokens, pos, slots, bt_off, rows, bt) =
            (at(0), at(n), at(2 * n), at(3 * n), at(4 * n), at(4 * n + r));
        let base = self.ws.buf.as_ref().map_or(0, DBuf::ptr);
        let o = |i: usize| base + self.ws.offs[i] as u64;
        let (x, h, qkv, attn, tmp, gu, act, last) =
            (o(0), o(1), o(2), o(3), o(4), o(5), o(6), o(7));
        let logits = self.ws.logits.as_ref().map_or(0, DBuf::ptr);
        let g = &self.gpu;
        let sc = &mut self.scratch;
        let geom = AttnGeom {
            n_heads: c.n_heads,
            n_kv_heads: c.n_kv_heads,
            head_dim: c.head_dim,
            block_size: self.block_size,
        };
        let stride = c.hidden + 2 * c.kv_dim();
        let per = (self.num_blocks * self.block_size * c.kv_dim() * 2) as u64;
        let neox = c.rope_style == RopeStyle::Neox;
        g.embed(&self.w.embed.m, tokens, n, x)?;
        for (li, l) in self.w.layers.iter().enumerate() {
            if li == 0 {
                g.rms_norm(x, None, n, l.attn_norm.ptr(), h, c.hidden, c.rms_eps)?;
            } else {
                g.add_rms_norm(x, tmp, l.attn_norm.ptr(), h, n, c.hidden, c.rms_eps)?;
            }
            l.wqkv.forward(g, h, n, qkv, sc)?;
            let kc = self.kv.ptr() + 2 * li as u64 * per;
            let vc = kc + per;
            g.rope_store(
                qkv,
                stride,
                pos,
                slots,
                kc,
                vc,
                n,
                &geom,
                c.rope_dim,
                c.rope_theta,
                neox,
            )?;
            let io = AttnIo {
                qkv,
                stride,
                kc,
                vc,
                pos,
                bt_off,
                bt,
                out: attn,
                n,
            };
            g.paged_attention(&io, &geom)?;
            l.wo.forward(g, attn, n, tmp, sc)?;
            g.add_rms_norm(x, tmp, l.ffn_norm.ptr(), h, n, c.hidden, c.rms_eps)?;
            l.w_gate_up.forward(g, h, n, gu, sc)?;
            g.swiglu(gu, act, c.ffn, n)?;
            l.w_down.forward(g, act, n, tmp, sc)?;
        }
        g.add(x, tmp, n * c.hidden)?;
        if r > 0 {
            g.rms_norm(
                x,
                Some(rows),
                r,
                self.w.out_norm.ptr(),
                last,
                c.hidden,
                c.rms_eps,
            )?;
            self.w.lm_head().forward(g, last, r, logits, sc)?;
            g.argmax(logits, r, c.vocab, tmp)?;
        }
        Ok(())
    }
}

impl Backend for CudaBackend {
    fn describe(&self) -> String {
        format!("CUDA cuda:{} {}", self.gpu.ordinal(), self.gpu.name())
    }

    fn forward(&mut self, batch: &Batch, needs: &[RowNeed]) -> Result<StepOutput<'_>, ModelError> {
        check_batch(&self.cfg, batch, self.num_blocks, self.block_size)?;
        if batch.is_empty() {
            return Err(ModelError::Batch("empty batch".into()));
        }
        let logits = self.run(batch).map_err(gpu_err)?;
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
                .map_err(gpu_err)?;
            let vals = ids + bytes as u64;
            self.gpu
                .topk(logits, r, vocab, kmax, ids, vals)
                .map_err(gpu_err)?;
            for j in (0..r).filter(|&j| matches!(need(j), RowNeed::TopK(_))) {
                let at = self.topk_ids.len();
                self.topk_ids.resize(at + kmax, 0);
                self.topk_vals.resize(at + kmax, 0.0);
                let off = (j * kmax * 4) as u64;
                self.gpu
                    .dtoh(ids + off, &mut self.topk_ids[at..])
                    .map_err(gpu_err)?;
                self.gpu
                    .dtoh(vals + off, &mut self.topk_vals[at..])
                    .map_err(gpu_err)?;
            }
        }
        self.logits.clear();
        for j in (0..r).filter(|&j| need(j) == RowNeed::Full) {
            let at = self.logits.len();
            self.logits.resize(at + vocab, 0.0);
            self.gpu
                .dtoh(logits + (j * vocab * 4) as u64, &mut self.logits[at..])
                .map_err(gpu_err)?;
        }
        Ok(StepOutput {
            logits: &self.logits,
            argmax: &self.argmax,
            topk_k: kmax,
            topk_ids: &self.topk_ids,
            topk_vals: &self.topk_vals,
        })
    }

    fn rebuild_kv(&mut self, block_size: usize, num_blocks: usize) -> Result<(), String> {
        if num_blocks == 0 {
            return Err("the KV budget holds no block".into());
        }
        let bytes = KvCache::bytes_per_block(&self.cfg, block_size)
            .checked_mul(num_blocks)
            .ok_or("KV pool size overflows")?;
        // Graphs captured the old pool's address and block size.
        self.graphs.clear();
        self.graph_seen.clear();
        // Free the old pool before taking the new one.
        self.kv = self.gpu.alloc(1).map_err(|e| e.to_string())?;
        self.kv = self
            .gpu
            .alloc(bytes)
            .map_err(|e| format!("KV pool of {num_blocks} blocks: {e}"))?;
        self.block_size = block_size;
        self.num_blocks = num_blocks;
        Ok(())
    }

    fn num_blocks(&self) -> usize {
        self.num_blocks
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
            weights: self.w.bytes,
            kv: self.kv.len(),
            activations: self.ws.buf.as_ref().map_or(0, DBuf::len)
                + self.ws.ints.as_ref().map_or(0, DBuf::len)
                + self.ws.logits.as_ref().map_or(0, DBuf::len)
                + self.scratch.bytes(),
            device_used: used,
            device_total: total,
        }
    }

    fn threads(&self) -> usize {
        0
    }

    fn set_model(&mut self, lm: &Arc<LoadedModel>) -> Result<(), String> {
        if lm.model.cfg != self.cfg {
            return Err("the new weights are of another model shape".into());
        }
        check_weight_types(&lm.model.weights)?;
        // Both sets are on the device for a moment; without room for that the old one stays.
        let w = DevWeights::upload(&self.gpu, &lm.model.weights)
            .map_err(|e| format!("uploading the new weights to {}: {e}", self.gpu.name()))?;
        self.w = w;
        // The captured graphs point at the old weights.
        self.graphs.clear();
        self.graph_seen.clear();
        Ok(())
    }
}

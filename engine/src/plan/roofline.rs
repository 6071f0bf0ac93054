//! The roofline model of this engine's steps, and its error against measured runs.
//!
//! A step of `B` decoding sequences at context `ctx` plus `T` prefill tokens takes
//! `overhead + max(weight bytes / (bandwidth · e_w), 2 · params · (B + T) / (FLOP/s · e_c)) +
//! B · ctx · KV bytes per token / (bandwidth · e_kv)`: weight reads and matmul compute overlap,
//! the attention's KV reads come on top (they follow the matmuls in each layer). The `e_*` are
//! the calibration's shares of the roofline this engine reaches (see `assets/devices.json`).
//! A run of `tpslab bench` (all requests at once) is then its prefill, in steps of the token
//! budget, and `output_len - 1` decode steps of the whole batch; requests past what the KV
//! memory holds wait for a later wave.

use serde::Serialize;
use tpslab_kernels::WType;

use super::PlanError;
use super::devices::{Calibration, DeviceSpec, DeviceTable, MeasuredRow, PublishedRow};
use super::split::Parallel;
use crate::kv::KvTypes;
use crate::model::config::ModelConfig;
use crate::model::precision::matrix_type;
use crate::serving::metrics::cost_per_million_output_tokens;

const GIB: f64 = (1u64 << 30) as f64;

/// The sizes that set a model's bytes and FLOPs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelShape {
    pub name: String,
    pub n_layers: usize,
    pub hidden: usize,
    /// Query and K/V heads (what tensor parallelism splits; `q_dim` and `kv_dim` are these
    /// times the head width).
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub q_dim: usize,
    pub kv_dim: usize,
    pub ffn: usize,
    pub vocab: usize,
    /// The output head is the embedding (its bytes count once).
    pub tied_embeddings: bool,
    /// A mixture of experts' FFN in every layer (then `ffn` is unused).
    pub experts: Option<ExpertShape>,
}

/// The experts of every layer: `n_expert` FFNs of width `ffn`, `n_used` chosen per token.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ExpertShape {
    pub n_expert: usize,
    pub n_used: usize,
    pub ffn: usize,
    /// The type the experts keep whatever the precision asked (gpt-oss's MXFP4).
    #[serde(serialize_with = "type_name")]
    pub fixed_type: Option<WType>,
}

/// A weight type as its name ("MXFP4") in the planner's JSON.
fn type_name<S: serde::Serializer>(t: &Option<WType>, s: S) -> Result<S::Ok, S::Error> {
    match t {
        Some(t) => s.serialize_some(t.name()),
        None => s.serialize_none(),
    }
}

impl ExpertShape {
    /// Experts of one layer a step of `tokens` tokens reads, expected when each token chooses
    /// `n_used` of `n_expert` uniformly: `E (1 - (1 - k/E)^t)`. One token reads k; a large batch
    /// reads them all (the share `tpslab bench` measures).
    pub fn read_per_layer(&self, tokens: usize) -> f64 {
        let (e, k) = (self.n_expert as f64, self.n_used.min(self.n_expert) as f64);
        e * (1.0 - (1.0 - k / e).powf(tokens as f64))
    }
}

/// One plan's workload: `concurrency` requests at once, each `prompt_len` tokens in and
/// `output_len` out, prefilled in steps of at most `token_budget` tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Workload {
    pub concurrency: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    pub token_budget: usize,
}

/// What the planner predicts for one device, precision and workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Prediction {
    pub device: String,
    pub precision: String,
    pub concurrency: usize,
    /// 1 / decode step time (1000 / TPOT); `None` when the weights do not fit.
    pub per_request_tps: Option<f64>,
    /// Output tokens / whole run time, prefill included.
    pub aggregate_tps: Option<f64>,
    /// Median time to first token.
    pub ttft_ms: Option<f64>,
    /// The most sequences of `prompt_len + output_len` tokens the memory left after the
    /// weights holds.
    pub max_concurrency: usize,
    pub usd_per_million_tokens: Option<f64>,
    /// Weights in one GPU's memory (its share under tensor, pipeline or expert parallelism).
    pub weights_gib: f64,
    /// How the model is split, and over how many devices (whose hourly prices add up).
    pub parallel: Parallel,
    pub gpus: usize,
    /// Whose calibration made it ("cuda": this engine's; "vllm", "sglang": published runs').
    pub engine: String,
    /// Fewer sequences run at once than asked (the KV memory is full); the rest wait.
    pub kv_limited: bool,
}

impl ModelShape {
    /// The shape of a resolved configuration.
    pub fn from_config(name: &str, cfg: &ModelConfig, tied_embeddings: bool) -> Self {
        Self {
            name: name.to_string(),
            n_layers: cfg.n_layers,
            hidden: cfg.hidden,
            n_heads: cfg.n_heads,
            n_kv_heads: cfg.n_kv_heads,
            q_dim: cfg.q_dim(),
            kv_dim: cfg.kv_dim(),
            ffn: cfg.ffn,
            vocab: cfg.vocab,
            tied_embeddings,
            experts: cfg.extras.moe.as_ref().map(|m| ExpertShape {
                n_expert: m.n_expert,
                n_used: m.router.n_used,
                ffn: m.ffn_exp,
                fixed_type: cfg.family.def().released_expert_type(),
            }),
        }
    }

    /// The shape of a `--synthetic` architecture.
    pub fn synthetic(arch: &str) -> Result<Self, PlanError> {
        let spec =
            crate::model::synthetic::arch(arch).map_err(|e| PlanError::Shape(e.to_string()))?;
        Ok(Self::from_config(
            spec.name,
            &spec.config,
            spec.tied_embeddings,
        ))
    }

    /// (inputs k, outputs n, how many) of each matrix a step multiplies by: every layer's
    /// Q, K, V, O, gate, up and down (a mixture of experts: the router), and the output head.
    fn matrices(&self) -> [(usize, usize, usize); 6] {
        let (h, l) = (self.hidden, self.n_layers);
        let ffn = match &self.experts {
            // The router; the experts are counted apart.
            Some(e) => [(h, e.n_expert, l), (0, 0, 0)],
            None => [(h, self.ffn, 2 * l), (self.ffn, h, l)],
        };
        [
            (h, self.q_dim, l),
            (h, self.kv_dim, 2 * l),
            (self.q_dim, h, l),
            ffn[0],
            ffn[1],
            (h, self.vocab, 1),
        ]
    }

    /// Bytes of an `n x k` matrix in `ty` (or the type its rows fall back to).
    fn matrix_bytes(ty: WType, k: usize, n: usize) -> f64 {
        if k == 0 || n == 0 {
            return 0.0;
        }
        let t = matrix_type(ty, k);
        k as f64 / t.block_size() as f64 * t.type_size() as f64 * n as f64
    }

    /// Bytes of one expert (gate, up and down) in `ty`, or in the type the experts keep.
    fn expert_bytes(&self, e: &ExpertShape, ty: WType) -> f64 {
        let ty = e.fixed_type.unwrap_or(ty);
        2.0 * Self::matrix_bytes(ty, self.hidden, e.ffn)
            + Self::matrix_bytes(ty, e.ffn, self.hidden)
    }

    /// Bytes a step of `tokens` tokens reads: every matrix once (the embedding's rows are
    /// gathered, not read), and of a mixture of experts the experts its tokens chose
    /// ([`ExpertShape::read_per_layer`]).
    pub fn weight_bytes_read(&self, ty: WType, tokens: usize) -> f64 {
        self.dense_bytes(ty) + self.experts_read(ty, tokens)
    }

    /// Bytes of every matrix but the experts.
    fn dense_bytes(&self, ty: WType) -> f64 {
        (self.matrices().iter())
            .map(|&(k, n, count)| Self::matrix_bytes(ty, k, n) * count as f64)
            .sum()
    }

    /// Bytes the weights take in memory: the matrices, every expert, and an untied embedding.
    pub fn weight_bytes_total(&self, ty: WType) -> f64 {
        let embedding = if self.tied_embeddings {
            0.0
        } else {
            Self::matrix_bytes(ty, self.hidden, self.vocab)
        };
        let all_experts = self.experts.as_ref().map_or(0.0, |e| {
            e.n_expert as f64 * self.expert_bytes(e, ty) * self.n_layers as f64
        });
        self.dense_bytes(ty) + all_experts + embedding
    }

    /// The expert bytes of [`Self::weight_bytes_read`].
    fn experts_read(&self, ty: WType, tokens: usize) -> f64 {
        self.experts.as_ref().map_or(0.0, |e| {
            e.read_per_layer(tokens.max(1)) * self.expert_bytes(e, ty) * self.n_layers as f64
        })
    }

    /// Multiply-adds per token of the matrices (2 FLOPs each): of a mixture of experts, the
    /// `n_used` experts each token runs.
    pub fn matmul_params(&self) -> f64 {
        let experts = self.experts.as_ref().map_or(0.0, |e| {
            (3 * self.hidden * e.ffn * e.n_used * self.n_layers) as f64
        });
        (self.matrices().iter())
            .map(|&(k, n, count)| (k * n * count) as f64)
            .sum::<f64>()
            + experts
    }

    /// Bytes of one token's K and V in every layer (an F16 cache: what the GPUs planned for
    /// run; see [`KvTypes`]).
    pub fn kv_bytes_per_token(&self) -> f64 {
        KvTypes::F16.bytes_per_token_of(self.n_layers, self.kv_dim) as f64
    }
}

/// Bytes of memory left for the KV cache once the weights and the calibration's reserve are
/// taken (negative when the weights do not fit).
pub(crate) fn kv_free_bytes(
    device: &DeviceSpec,
    cal: &Calibration,
    shape: &ModelShape,
    ty: WType,
) -> f64 {
    device.memory_gib.value * GIB - cal.memory_reserve_gib * GIB - shape.weight_bytes_total(ty)
}

/// One replica's steps as the planner models them: what the fleet simulator
/// ([`super::fleet`]) advances each replica by, so both use one step model.
pub struct StepModel<'a> {
    machine: Machine<'a>,
    shape: &'a ModelShape,
}

impl<'a> StepModel<'a> {
    /// The step model of `shape` in `ty` on `device`, with its backend's calibration.
    pub fn new(
        table: &'a DeviceTable,
        device: &'a DeviceSpec,
        shape: &'a ModelShape,
        ty: WType,
    ) -> Result<Self, PlanError> {
        let cal = table.calibration(device)?;
        Ok(Self {
            machine: Machine { device, cal, ty },
            shape,
        })
    }

    /// Seconds of one step: `decoding` sequences at mean context `ctx` and `prefill` prompt
    /// tokens (the roofline of the module doc).
    pub fn step_s(&self, decoding: usize, ctx: f64, prefill: usize) -> f64 {
        self.machine.step_s(self.shape, decoding, ctx, prefill)
    }

    /// Tokens of KV the memory left after the weights holds (0 when the weights do not fit).
    pub fn kv_capacity_tokens(&self) -> u64 {
        let m = &self.machine;
        let free = kv_free_bytes(m.device, m.cal, self.shape, m.ty);
        if free > 0.0 {
            (free / self.shape.kv_bytes_per_token()).floor().min(1e15) as u64
        } else {
            0
        }
    }

    /// Bytes of the weights in memory (what a cold start loads).
    pub fn weight_bytes(&self) -> f64 {
        self.shape.weight_bytes_total(self.machine.ty)
    }

    /// The calibration's fixed time before a request's first token besides its prefill, s.
    pub fn ttft_overhead_s(&self) -> f64 {
        self.machine.cal.ttft_overhead_ms / 1e3
    }
}

/// The device, calibration and weight type one plan is made for.
pub(crate) struct Machine<'a> {
    pub(crate) device: &'a DeviceSpec,
    pub(crate) cal: &'a Calibration,
    pub(crate) ty: WType,
}

fn is_float(ty: WType) -> bool {
    matches!(ty, WType::F32 | WType::F16 | WType::BF16)
}

/// What a plan needs of a step model: one device's roofline ([`Single`]), or a model split
/// over several ([`super::parallel`]).
pub(crate) trait Steps {
    /// Seconds of one step: `decoding` sequences at context `ctx` and `prefill` prompt tokens
    /// (under pipeline parallelism: one round in which every sequence advances a token, or one
    /// prefill chunk's turn through the slowest stage).
    fn step_s(&self, decoding: usize, ctx: f64, prefill: usize) -> f64;
    /// Seconds a pipeline takes to fill before its first chunk of `prefill` tokens comes out
    /// of the last stage (0 without one).
    fn fill_s(&self, _prefill: usize) -> f64 {
        0.0
    }
}

/// One device running the whole model.
pub(crate) struct Single<'a> {
    pub(crate) machine: Machine<'a>,
    pub(crate) shape: &'a ModelShape,
}

impl Steps for Single<'_> {
    fn step_s(&self, decoding: usize, ctx: f64, prefill: usize) -> f64 {
        self.machine.step_s(self.shape, decoding, ctx, prefill)
    }
}

impl Machine<'_> {
    /// Seconds of one step: `decoding` sequences at context `ctx` and `prefill` prompt tokens.
    pub(crate) fn step_s(
        &self,
        shape: &ModelShape,
        decoding: usize,
        ctx: f64,
        prefill: usize,
    ) -> f64 {
        let bw = self.device.bandwidth_gb_s.value * 1e9;
        let tokens = decoding + prefill;
        let dequant = !is_float(self.ty)
            && (self.cal.dequant_above_tokens).is_some_and(|limit| tokens > limit);
        let weights = if dequant {
            // Read the quantized bytes, write F16's, read those for the F16 GEMM.
            let f16 = shape.weight_bytes_read(WType::F16, tokens);
            (shape.weight_bytes_read(self.ty, tokens) + 2.0 * f16)
                / (bw * self.cal.weight_efficiency("F16"))
        } else {
            shape.weight_bytes_read(self.ty, tokens)
                / (bw * self.cal.weight_efficiency(self.ty.name()))
        };
        let flops =
            (self.device.tflops.get(&self.cal.compute_precision)).map_or(1e12, |f| f.value * 1e12);
        let batched = prefill == 0 && self.cal.batched_above_tokens.is_some_and(|l| tokens > l);
        let share = match self.cal.batched_compute_efficiency {
            _ if prefill > 0 => self.cal.prefill_compute_efficiency,
            Some(e) if batched => e,
            _ => self.cal.decode_compute_efficiency,
        };
        let compute = 2.0 * shape.matmul_params() * tokens as f64 / (flops * share);
        let kv = decoding as f64 * ctx * shape.kv_bytes_per_token()
            / (bw * self.cal.kv_bandwidth_efficiency);
        // A batched decode step repacks each weight group before its dots: that pass does not
        // overlap them, so the two add up; elsewhere reads and dots overlap (the larger wins).
        let matmuls = if batched {
            weights + compute
        } else {
            weights.max(compute)
        };
        self.cal.step_overhead_ms / 1e3 + matmuls + kv
    }
}

/// The median of the two middle requests' prefill end times, for `batch` requests of
/// `prompt_len` tokens prefilled in steps of `budget` tokens (full steps take `full_s`, the
/// last partial one `rest_s`): in closed form, however many steps there are.
fn median_prefill_end(
    batch: usize,
    prompt_len: usize,
    budget: usize,
    full_s: f64,
    rest_s: f64,
) -> f64 {
    let total = batch as u128 * prompt_len as u128;
    let n_full = total / budget as u128;
    let end_of = |r: usize| {
        // Request r's last prompt token is token (r + 1) * L of the whole prefill.
        let step = ((r as u128 + 1) * prompt_len as u128).div_ceil(budget as u128);
        if step <= n_full {
            step as f64 * full_s
        } else {
            n_full as f64 * full_s + rest_s
        }
    };
    let (lo, hi) = ((batch - 1) / 2, batch / 2);
    (end_of(lo) + end_of(hi)) / 2.0
}

pub(crate) fn check_workload(w: &Workload) -> Result<(), PlanError> {
    for (what, v) in [
        ("concurrency", w.concurrency),
        ("prompt length", w.prompt_len),
        ("output length", w.output_len),
        ("token budget", w.token_budget),
    ] {
        if v == 0 {
            return Err(PlanError::Workload(format!("{what} must be at least 1")));
        }
        if v > 1 << 24 {
            return Err(PlanError::Workload(format!("{what} {v} is past 2^24")));
        }
    }
    Ok(())
}

/// The prediction for `shape` in `ty` on `device` under workload `w` (one device, the
/// device's own backend's calibration).
pub fn predict(
    table: &DeviceTable,
    device: &DeviceSpec,
    shape: &ModelShape,
    ty: WType,
    w: &Workload,
) -> Result<Prediction, PlanError> {
    let cal = table.calibration(device)?;
    let steps = Single {
        machine: Machine { device, cal, ty },
        shape,
    };
    let plan = PlanFor {
        machine: &steps.machine,
        engine: &device.backend,
        per_gpu: shape,
        parallel: Parallel::NONE,
    };
    predict_with(&steps, &plan, w)
}

/// What [`predict_with`] needs besides the steps: the machine, whose calibration it is, the
/// shape one GPU holds (the whole model on one device) and how the model is split.
pub(crate) struct PlanFor<'a> {
    pub(crate) machine: &'a Machine<'a>,
    pub(crate) engine: &'a str,
    pub(crate) per_gpu: &'a ModelShape,
    pub(crate) parallel: Parallel,
}

/// The prediction of workload `w` from a step model: the KV memory one GPU has left after its
/// share of the weights sets the concurrency that fits, then the prefill in steps of the token
/// budget (after the pipeline's fill), the decode steps, and the waves of requests that wait.
pub(crate) fn predict_with(
    steps: &dyn Steps,
    plan: &PlanFor,
    w: &Workload,
) -> Result<Prediction, PlanError> {
    check_workload(w)?;
    let Machine { device, cal, ty } = *plan.machine;
    let shape = plan.per_gpu;
    let weights = shape.weight_bytes_total(ty);
    let free = kv_free_bytes(device, cal, shape, ty);
    let per_seq = shape.kv_bytes_per_token() * (w.prompt_len + w.output_len) as f64;
    let max_concurrency = if free > 0.0 {
        (free / per_seq).floor().min(1e9) as usize
    } else {
        0
    };
    let gpus = plan.parallel.gpus();
    let mut p = Prediction {
        device: device.id.clone(),
        precision: ty.name().to_string(),
        concurrency: w.concurrency,
        per_request_tps: None,
        aggregate_tps: None,
        ttft_ms: None,
        max_concurrency,
        usd_per_million_tokens: None,
        weights_gib: weights / GIB,
        parallel: plan.parallel,
        gpus,
        engine: plan.engine.to_string(),
        kv_limited: max_concurrency < w.concurrency,
    };
    if max_concurrency == 0 {
        return Ok(p);
    }
    let batch = w.concurrency.min(max_concurrency);
    let waves = w.concurrency.div_ceil(batch) as f64;
    let prefill_tokens = batch as u128 * w.prompt_len as u128;
    let budget = w.token_budget as u128;
    let rest = (prefill_tokens % budget) as usize;
    let first = w.token_budget.min(prefill_tokens as usize);
    let full_s = steps.step_s(0, 0.0, first);
    let rest_s = if rest > 0 {
        steps.step_s(0, 0.0, rest)
    } else {
        0.0
    };
    let fill_s = steps.fill_s(first);
    let prefill_s = (prefill_tokens / budget) as f64 * full_s + rest_s + fill_s;
    let ttft_first = median_prefill_end(batch, w.prompt_len, w.token_budget, full_s, rest_s)
        + fill_s
        + cal.ttft_overhead_ms / 1e3;
    // The mean context over the decode, for the KV reads.
    let ctx = w.prompt_len as f64 + w.output_len as f64 / 2.0;
    let decode_s = steps.step_s(batch, ctx, 0);
    let wave_s = prefill_s + (w.output_len - 1) as f64 * decode_s;
    let aggregate = (w.concurrency * w.output_len) as f64 / (waves * wave_s);
    p.per_request_tps = Some(1.0 / decode_s);
    p.aggregate_tps = Some(aggregate);
    // The median request waits for half the waves before it.
    p.ttft_ms = Some((ttft_first + (waves - 1.0) / 2.0 * wave_s) * 1e3);
    p.usd_per_million_tokens =
        cost_per_million_output_tokens(device.usd_per_hour.value * gpus as f64, aggregate);
    Ok(p)
}

/// A measured row beside its prediction: the signed relative error of each figure.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RowError {
    pub row: MeasuredRow,
    pub predicted: Prediction,
    /// (predicted - measured) / measured, for aggregate TPS, per-request TPS and TTFT.
    pub aggregate_err: f64,
    pub per_request_err: f64,
    pub ttft_err: f64,
}

/// How far the predictions fall from a device's measured rows.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ErrorSummary {
    pub device: String,
    pub rows: Vec<RowError>,
    /// Mean and largest |relative error| over every figure of every row, in percent.
    pub mean_abs_pct: f64,
    pub max_abs_pct: f64,
    /// The same over the rows not used to fit the calibration (`None` when all were).
    pub held_out_mean_abs_pct: Option<f64>,
    pub held_out_max_abs_pct: Option<f64>,
}

/// (mean, max) of |e| in percent over every figure of `rows`.
fn abs_pct<'a>(rows: impl Iterator<Item = &'a RowError>) -> Option<(f64, f64)> {
    let errs: Vec<f64> = rows
        .flat_map(|r| [r.aggregate_err, r.per_request_err, r.ttft_err])
        .map(|e| e.abs() * 100.0)
        .collect();
    let max = errs
        .iter()
        .copied()
        .fold(None, |m: Option<f64>, e| Some(m.map_or(e, |m| m.max(e))))?;
    Some((errs.iter().sum::<f64>() / errs.len() as f64, max))
}

/// What a row of the device table (measured here, or published) asks the planner: its
/// model's shape, its weight type and its workload.
pub(crate) struct RowAsks {
    pub shape: ModelShape,
    pub ty: WType,
    pub workload: Workload,
}

impl RowAsks {
    /// `device`'s row of `kind` ("measured", "published") naming `model` and `precision`.
    fn new(
        device: &DeviceSpec,
        kind: &str,
        model: &str,
        precision: &str,
        w: Workload,
    ) -> Result<Self, PlanError> {
        let ty = precision.parse().map_err(|e| {
            PlanError::Table(format!("device {}: {kind} precision: {e}", device.id))
        })?;
        Ok(Self {
            shape: ModelShape::synthetic(model)?,
            ty,
            workload: w,
        })
    }

    pub(crate) fn measured(device: &DeviceSpec, r: &MeasuredRow) -> Result<Self, PlanError> {
        let w = Workload {
            concurrency: r.concurrency,
            prompt_len: r.prompt_len,
            output_len: r.output_len,
            token_budget: r.token_budget,
        };
        Self::new(device, "measured", &r.model, &r.precision, w)
    }

    pub(crate) fn published(device: &DeviceSpec, r: &PublishedRow) -> Result<Self, PlanError> {
        let w = Workload {
            concurrency: r.concurrency,
            prompt_len: r.prompt_len,
            output_len: r.output_len,
            token_budget: r.token_budget,
        };
        Self::new(device, "published", &r.model, &r.precision, w)
    }
}

/// The predictions for `device`'s measured rows against what was measured; `None` when it has
/// none.
pub fn check(table: &DeviceTable, device: &DeviceSpec) -> Result<Option<ErrorSummary>, PlanError> {
    let mut rows = Vec::new();
    for r in &device.measured {
        let a = RowAsks::measured(device, r)?;
        let p = predict(table, device, &a.shape, a.ty, &a.workload)?;
        let rel = |pred: Option<f64>, meas: f64| pred.map_or(f64::INFINITY, |v| v / meas - 1.0);
        rows.push(RowError {
            aggregate_err: rel(p.aggregate_tps, r.aggregate_tps),
            per_request_err: rel(p.per_request_tps, r.per_request_tps),
            ttft_err: rel(p.ttft_ms, r.ttft_ms),
            row: r.clone(),
            predicted: p,
        });
    }
    let Some((mean, max)) = abs_pct(rows.iter()) else {
        return Ok(None);
    };
    let held = abs_pct(rows.iter().filter(|r| !r.row.fitted));
    Ok(Some(ErrorSummary {
        device: device.id.clone(),
        rows,
        mean_abs_pct: mean,
        max_abs_pct: max,
        held_out_mean_abs_pct: held.map(|h| h.0),
        held_out_max_abs_pct: held.map(|h| h.1),
    }))
}

impl ErrorSummary {
    /// "mean 6.7%, max 18.7% over 8 measured rows (held out of the fit: mean 6.2%, max 10.8%)".
    pub fn text(&self) -> String {
        let held = match (self.held_out_mean_abs_pct, self.held_out_max_abs_pct) {
            (Some(m), Some(x)) => format!(" (held out of the fit: mean {m:.1}%, max {x:.1}%)"),
            _ => String::new(),
        };
        format!(
            "mean {:.1}%, max {:.1}% over {} measured rows{held}",
            self.mean_abs_pct,
            self.max_abs_pct,
            self.rows.len()
        )
    }
}

/// Where a device's predictions come from and how far they fell from measurements.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Source {
    pub device: String,
    pub name: String,
    pub backend: String,
    /// How the backend's calibration was found.
    pub calibration: String,
    /// The predictions against this device's own measured rows, if it has any.
    pub error: Option<ErrorSummary>,
    /// Otherwise the calibration's error on the device it was measured on.
    pub error_elsewhere: Option<ErrorSummary>,
    /// The line printed beside the predictions.
    pub text: String,
}

/// The prediction source of `device`, with its error.
pub fn source(table: &DeviceTable, device: &DeviceSpec) -> Result<Source, PlanError> {
    let cal = table.calibration(device)?;
    let own = check(table, device)?;
    let elsewhere = match (&own, table.measured_on(&device.backend).first()) {
        (None, Some(m)) => check(table, m)?,
        _ => None,
    };
    let (id, backend) = (&device.id, &device.backend);
    let text = match (&own, &elsewhere) {
        (Some(e), _) => format!(
            "{id}: {backend} calibration; against this device's measured runs: {}",
            e.text()
        ),
        (None, Some(e)) => format!(
            "{id}: {backend} calibration, not measured on this device; on {}: {}",
            e.device,
            e.text()
        ),
        (None, None) => format!("{id}: {backend} calibration; error unknown (nothing measured)"),
    };
    Ok(Source {
        device: id.clone(),
        name: device.name.clone(),
        backend: backend.clone(),
        calibration: cal.source.clone(),
        error: own,
        error_elsewhere: elsewhere,
        text,
    })
}

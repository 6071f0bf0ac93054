//! Multi-GPU serving in the planner: a model split over GPUs by tensor parallelism (TP),
//! pipeline parallelism (PP) and expert parallelism (EP), with what the split costs priced from
//! the link in the device table; and the published multi-GPU runs of other engines held
//! against these predictions.
//!
//! The split, as vLLM and SGLang do it:
//! - TP `t`: every layer's Q/K/V, output, FFN (or each expert's FFN) and the vocabulary
//!   matrices are cut in `t` (column- then row-parallel); each GPU holds `1/t` of the weights
//!   and of the query heads. K/V heads fewer than `t` are replicated, one per GPU (vLLM's rule:
//!   `t` must then be a multiple of them), so the KV cache per GPU stops shrinking there. Each
//!   layer then pays two all-reduces of its activations (after attention, after the FFN):
//!   a ring all-reduce of `b` bytes over `t` GPUs takes `2 (t - 1) / t · b / one-way link
//!   bandwidth + latency`, the latency being the link's fixed cost of one small collective.
//! - EP `e` (only `e = t`, vLLM's `--enable-expert-parallel` without data parallelism): each GPU
//!   holds `1/e` of the experts whole instead of `1/t` of every expert; the FFN's all-reduce is
//!   replaced by an all-to-all that sends each token to its chosen experts' GPUs and one that
//!   brings the results back, `(e - 1) / e · bytes per GPU / one-way bandwidth + latency` each.
//!   Routing is taken as balanced (the step waits for the busiest GPU, so small batches are
//!   optimistic).
//! - PP `p`: the layers are cut in `p` stages of `ceil(layers / p)`, one vocabulary matrix each
//!   (the first stage's embedding, the last one's output head; the slowest stage sets the pace),
//!   each stage sending its activations to the next (`bytes / one-way bandwidth + latency`).
//!   The schedule is vLLM's: the running sequences are split into `m = min(batch, p)`
//!   micro-batches that chase each other round the stages; a decode round, in which every
//!   sequence advances one token, takes `p · (stage step of batch / m sequences + send)`, so
//!   with fewer sequences than stages `(p - m) / p` of each GPU's time is idle: the bubble
//!   ([`pipeline_bubble`]). A prefill's chunks flow through the stages one behind the other
//!   (GPipe's fill): the first comes out after `p` stage steps, the rest one stage step apart.
//!
//! Each GPU's memory holds its share of the weights and the KV of its layers and heads; the
//! concurrency that fits is computed from it (through [`super::roofline`]'s `predict_with`,
//! which both the single-device and the split plans use).

use serde::Serialize;
use tpslab_kernels::WType;

use super::PlanError;
use super::devices::{DeviceSpec, DeviceTable, Link, PublishedRow};
use super::roofline::{
    ExpertShape, Machine, ModelShape, PlanFor, Prediction, RowAsks, Steps, Workload, predict_with,
};
pub use super::split::Parallel;

/// Most GPUs one configuration spans (eight 8-GPU nodes).
const MAX_GPUS: usize = 64;

/// What a split needs of the model's shape (the type itself is `split.rs`'s).
impl Parallel {
    /// K/V heads each GPU holds: its share, or one replicated head when there are fewer heads
    /// than GPUs.
    pub fn kv_heads_per_gpu(&self, shape: &ModelShape) -> usize {
        (shape.n_kv_heads / self.tp).max(1)
    }

    /// Whether `shape` can be split this way; the reason it cannot, naming the numbers.
    pub fn check(&self, shape: &ModelShape) -> Result<(), PlanError> {
        let bad = |why: String| Err(PlanError::Parallel(format!("{}: {why}", shape.name)));
        let Parallel { tp, pp, ep } = *self;
        if tp == 0 || pp == 0 || ep == 0 {
            return bad("tp, pp and ep are at least 1".into());
        }
        if tp * pp > MAX_GPUS {
            return bad(format!("TP {tp} x PP {pp} is more than {MAX_GPUS} GPUs"));
        }
        if !shape.n_heads.is_multiple_of(tp) {
            return bad(format!(
                "TP {tp} does not divide its {} query heads",
                shape.n_heads
            ));
        }
        let kv = shape.n_kv_heads;
        if kv >= tp && !kv.is_multiple_of(tp) {
            return bad(format!("TP {tp} does not divide its {kv} K/V heads"));
        }
        if kv < tp && !tp.is_multiple_of(kv) {
            return bad(format!(
                "its {kv} K/V heads cannot be replicated evenly over TP {tp} (TP must be a multiple of them)"
            ));
        }
        let ffn = shape.experts.as_ref().map_or(shape.ffn, |e| e.ffn);
        if ep == 1 && !ffn.is_multiple_of(tp) {
            return bad(format!("TP {tp} does not divide its FFN width {ffn}"));
        }
        if pp > shape.n_layers {
            return bad(format!(
                "PP {pp}: more stages than its {} layers",
                shape.n_layers
            ));
        }
        if ep > 1 {
            let Some(e) = &shape.experts else {
                return bad(format!("EP {ep}: it has no experts"));
            };
            if ep != tp {
                return bad(format!(
                    "EP {ep} must equal TP {tp} (the experts spread over the TP group's GPUs)"
                ));
            }
            if !e.n_expert.is_multiple_of(ep) {
                return bad(format!(
                    "EP {ep} does not divide its {} experts",
                    e.n_expert
                ));
            }
        }
        Ok(())
    }

    /// The shape one GPU of the slowest stage holds and runs (checked first).
    pub fn shard(&self, shape: &ModelShape) -> Result<ModelShape, PlanError> {
        self.check(shape)?;
        let Parallel { tp, pp, ep } = *self;
        let head = shape.q_dim / shape.n_heads.max(1);
        let experts = shape.experts.map(|e| {
            if ep > 1 {
                ExpertShape {
                    n_expert: e.n_expert / ep,
                    // Rounded up: the read share `k / E` stays at least the model's.
                    n_used: e.n_used.div_ceil(ep),
                    ..e
                }
            } else {
                ExpertShape {
                    ffn: e.ffn / tp,
                    ..e
                }
            }
        });
        Ok(ModelShape {
            name: format!("{} ({})", shape.name, self.label()),
            n_layers: shape.n_layers.div_ceil(pp),
            hidden: shape.hidden,
            n_heads: shape.n_heads / tp,
            n_kv_heads: self.kv_heads_per_gpu(shape),
            q_dim: shape.q_dim / tp,
            kv_dim: self.kv_heads_per_gpu(shape) * head,
            ffn: shape.ffn / tp,
            vocab: shape.vocab.div_ceil(tp),
            // A stage holds one vocabulary matrix (the first the embedding, the last the output
            // head): counted as tied, the output head's.
            tied_embeddings: shape.tied_embeddings || pp > 1,
            experts,
        })
    }
}

/// Share of each GPU's time idle in a decode round of `batch` sequences over `pp` stages: with
/// fewer micro-batches than stages, the stages without one wait.
pub fn pipeline_bubble(pp: usize, batch: usize) -> f64 {
    let m = batch.min(pp).max(1);
    1.0 - m as f64 / pp.max(1) as f64
}

/// Seconds of a ring all-reduce of `bytes` over `n` GPUs.
pub fn all_reduce_s(link: &Link, n: usize, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    2.0 * (n - 1) as f64 / n as f64 * bytes / link.one_way_bytes_s() + link.latency_us.value / 1e6
}

/// Seconds of an all-to-all in which each of `n` GPUs sends `bytes` spread over the others.
pub fn all_to_all_s(link: &Link, n: usize, bytes: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    (n - 1) as f64 / n as f64 * bytes / link.one_way_bytes_s() + link.latency_us.value / 1e6
}

/// Seconds to send `bytes` to the next stage.
pub fn send_s(link: &Link, bytes: f64) -> f64 {
    bytes / link.one_way_bytes_s() + link.latency_us.value / 1e6
}

/// A model split over GPUs: the step model of one GPU of the slowest stage, plus what the
/// split costs.
struct Split<'a> {
    machine: Machine<'a>,
    shard: ModelShape,
    full: &'a ModelShape,
    par: Parallel,
    link: Option<&'a Link>,
}

impl Split<'_> {
    /// Bytes of `tokens` tokens' activations (16-bit, as the engines exchange them).
    fn activation_bytes(&self, tokens: usize) -> f64 {
        (tokens * self.full.hidden * 2) as f64
    }

    /// Seconds of one stage's collectives for a step of `tokens` tokens: per layer, the
    /// attention's all-reduce, and the FFN's all-reduce (or, under EP, its two all-to-alls).
    fn collectives_s(&self, tokens: usize) -> f64 {
        let (Some(link), tp) = (self.link, self.par.tp) else {
            return 0.0;
        };
        if tp == 1 || tokens == 0 {
            return 0.0;
        }
        let act = self.activation_bytes(tokens);
        let attention = all_reduce_s(link, tp, act);
        let ffn = match (&self.full.experts, self.par.ep) {
            (Some(e), ep) if ep > 1 => {
                let routed = act * e.n_used as f64 / ep as f64;
                2.0 * all_to_all_s(link, ep, routed)
            }
            _ => all_reduce_s(link, tp, act),
        };
        self.shard.n_layers as f64 * (attention + ffn)
    }

    /// Seconds of one stage's step (compute and memory, then its collectives).
    fn stage_s(&self, decoding: usize, ctx: f64, prefill: usize) -> f64 {
        self.machine.step_s(&self.shard, decoding, ctx, prefill)
            + self.collectives_s(decoding + prefill)
    }

    /// Seconds of a stage's step and its send to the next stage.
    fn stage_and_send_s(&self, decoding: usize, ctx: f64, prefill: usize) -> f64 {
        let send = match self.link {
            Some(l) if self.par.pp > 1 => send_s(l, self.activation_bytes(decoding + prefill)),
            _ => 0.0,
        };
        self.stage_s(decoding, ctx, prefill) + send
    }
}

impl Steps for Split<'_> {
    fn step_s(&self, decoding: usize, ctx: f64, prefill: usize) -> f64 {
        let pp = self.par.pp;
        if pp == 1 {
            return self.stage_s(decoding, ctx, prefill);
        }
        if decoding == 0 {
            // A prefill chunk: in the steady state one leaves the last stage per stage step.
            return self.stage_and_send_s(0, 0.0, prefill);
        }
        // A decode round: m micro-batches round p stages.
        let m = decoding.min(pp);
        let per = decoding.div_ceil(m);
        pp as f64 * self.stage_and_send_s(per, ctx, prefill.div_ceil(m))
    }

    fn fill_s(&self, prefill: usize) -> f64 {
        (self.par.pp - 1) as f64 * self.stage_and_send_s(0, 0.0, prefill)
    }
}

/// The prediction for `shape` in `ty` split as `par` over GPUs like `device`, with the
/// calibration of `engine` (`None`: the device's backend, this engine's).
pub fn predict_parallel(
    table: &DeviceTable,
    device: &DeviceSpec,
    shape: &ModelShape,
    ty: WType,
    w: &Workload,
    par: Parallel,
    engine: Option<&str>,
) -> Result<Prediction, PlanError> {
    let engine = engine.unwrap_or(&device.backend);
    let cal = table
        .calibrations
        .get(engine)
        .ok_or_else(|| PlanError::NoCalibration {
            device: device.id.clone(),
            backend: engine.to_string(),
        })?;
    if !device.tflops.contains_key(&cal.compute_precision) {
        return Err(PlanError::Parallel(format!(
            "{} on {}: the device lists no tflops.{} (what {engine} computes at)",
            shape.name, device.id, cal.compute_precision
        )));
    }
    if par.gpus() > 1 && device.link.is_none() {
        return Err(PlanError::Parallel(format!(
            "{} over {}: no link in the device table, so it is planned alone (TP 1, PP 1)",
            shape.name, device.id
        )));
    }
    let shard = par.shard(shape)?;
    let steps = Split {
        machine: Machine { device, cal, ty },
        shard,
        full: shape,
        par,
        link: device.link.as_ref(),
    };
    let plan = PlanFor {
        machine: &steps.machine,
        engine,
        per_gpu: &steps.shard,
        parallel: par,
    };
    predict_with(&steps, &plan, w)
}

/// A published run beside its prediction.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PublishedCheck {
    pub device: String,
    pub row: PublishedRow,
    pub predicted: Prediction,
    /// (predicted - published) / published output tokens per second (infinite when the
    /// prediction has none: the configuration does not fit).
    pub err: f64,
}

/// The published runs of `device`, each predicted with its engine's calibration.
pub fn check_published(
    table: &DeviceTable,
    device: &DeviceSpec,
) -> Result<Vec<PublishedCheck>, PlanError> {
    let mut out = Vec::new();
    for r in &device.published {
        let a = RowAsks::published(device, r)?;
        let par = Parallel {
            tp: r.tp,
            pp: r.pp,
            ep: r.ep,
        };
        let (shape, w) = (&a.shape, &a.workload);
        let p = predict_parallel(table, device, shape, a.ty, w, par, Some(&r.engine))?;
        out.push(PublishedCheck {
            device: device.id.clone(),
            err: p
                .aggregate_tps
                .map_or(f64::INFINITY, |v| v / r.output_tps - 1.0),
            row: r.clone(),
            predicted: p,
        });
    }
    Ok(out)
}

impl PublishedCheck {
    /// "a100 vllm qwen2.5-72b BF16 TP4, prompt 1 -> 2048, 1 at once: published 31.4 tok/s,
    /// predicted 36.2 (+15.4%), held out".
    pub fn text(&self) -> String {
        let r = &self.row;
        let par = Parallel {
            tp: r.tp,
            pp: r.pp,
            ep: r.ep,
        };
        format!(
            "{} x{} {} {} {} {}, prompt {} -> {}, {} at once: published {:.1} tok/s, predicted {} ({}), {}",
            self.device,
            par.gpus(),
            r.engine,
            r.model,
            r.precision,
            par.label(),
            r.prompt_len,
            r.output_len,
            r.concurrency,
            r.output_tps,
            self.predicted
                .aggregate_tps
                .map_or_else(|| "— (does not fit)".into(), |v| format!("{v:.1}")),
            if self.err.is_finite() {
                format!("{:+.1}%", self.err * 100.0)
            } else {
                "no prediction".into()
            },
            if r.fitted { "fitted" } else { "held out" }
        )
    }
}

/// A grid of plans: every device x split x precision x concurrency, the prompt and output
/// lengths and token budget of each request, and whose calibration predicts (`None`: each
/// device's own backend).
#[derive(Debug, Clone)]
pub struct PlanGrid<'a> {
    pub devices: &'a [String],
    pub splits: &'a [Parallel],
    pub precisions: &'a [WType],
    pub concurrency: &'a [usize],
    pub prompt_len: usize,
    pub output_len: usize,
    pub token_budget: usize,
    pub engine: Option<&'a str>,
}

/// One row per (device, split, precision, concurrency) of `grid`, and the notes to show under
/// them: devices without a link skipped for a split, configurations that do not fit. The one
/// place `tpslab plan` and the window's Planner make their rows.
pub fn plan_grid(
    table: &DeviceTable,
    shape: &ModelShape,
    grid: &PlanGrid<'_>,
) -> Result<(Vec<Prediction>, Vec<String>), PlanError> {
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    for id in grid.devices {
        let d = table.device(id)?;
        for par in grid.splits {
            if par.gpus() > 1 && d.link.is_none() {
                notes.push(format!(
                    "{}: no link in the device table, so no {} rows (it is planned alone)",
                    d.id,
                    par.label()
                ));
                continue;
            }
            for &ty in grid.precisions {
                for (i, &c) in grid.concurrency.iter().enumerate() {
                    let w = Workload {
                        concurrency: c,
                        prompt_len: grid.prompt_len,
                        output_len: grid.output_len,
                        token_budget: grid.token_budget,
                    };
                    let p = predict_parallel(table, d, shape, ty, &w, *par, grid.engine)?;
                    if p.max_concurrency == 0 && i == 0 {
                        notes.push(format!(
                            "{} {} on {} x {} ({}): does not fit: {:.1} GiB of weights per GPU \
                             in {:.1} GiB (split it over more GPUs)",
                            shape.name,
                            p.precision,
                            p.gpus,
                            d.id,
                            par.label(),
                            p.weights_gib,
                            d.memory_gib.value,
                        ));
                    }
                    rows.push(p);
                }
            }
        }
    }
    Ok((rows, notes))
}

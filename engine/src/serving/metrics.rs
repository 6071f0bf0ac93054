//! Serving metrics with vLLM's definitions: per-request timings, the benchmark summary, live
//! sliding-window figures for the dashboard, a fixed-capacity ring buffer, cost and process memory.
//!
//! Everything here is plain computation on timestamps the caller supplies (seconds on any
//! monotonic clock), so results are reproducible in tests and nothing reads a clock by itself.
//!
//! The benchmark formulas follow `calculate_metrics` in vLLM's `vllm/benchmarks/serve.py` and the
//! summary serializes with the key names vLLM writes to its result JSON, so a TPS Lab figure can be
//! set next to a `vllm bench serve` figure. Percentiles are numpy's default (`np.percentile`,
//! linear interpolation), means and standard deviations are numpy's (`np.std` is the population
//! deviation), and an empty list gives 0 as vLLM's `np.mean(xs or 0)` does.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::device::ExpertLoad;
pub use crate::serving::ring::{MetricsError, Ring};
pub use crate::serving::rss::{parse_proc_status, process_rss_bytes};
use crate::serving::spec_metrics::{SpecCounters, SpecStep, SpecUsage, SpecWindow};

/// The percentiles reported for every latency distribution (vLLM's `--metric-percentiles 50,90,95,99`).
pub const SUMMARY_PERCENTILES: [f64; 4] = [50.0, 90.0, 95.0, 99.0];

// ---- Statistics with numpy's semantics ----

/// `np.percentile(values, p)` with the default linear method; `None` for an empty input.
///
/// `p` is clamped to [0, 100]. The input need not be sorted.
pub fn percentile(values: &[f64], p: f64) -> Option<f64> {
    let sorted = sorted_copy(values);
    percentile_sorted(&sorted, p)
}

/// As [`percentile`] for an already ascending slice (avoids re-sorting for several percentiles).
pub fn percentile_sorted(sorted: &[f64], p: f64) -> Option<f64> {
    let &last = sorted.last().filter(|_| !p.is_nan())?;
    let q = p.clamp(0.0, 100.0) / 100.0;
    // numpy: virtual index (n - 1) * q, neighbours floor / floor + 1, and the last value once the
    // index reaches the end.
    let last_index = (sorted.len() - 1) as f64;
    let virtual_index = last_index * q;
    if virtual_index >= last_index {
        return Some(last);
    }
    let lo = virtual_index.floor();
    let t = virtual_index - lo;
    let i = lo as usize;
    let (a, b) = (sorted[i], sorted[i + 1]);
    // numpy's `_lerp` interpolates from the nearer end, which keeps the result inside [a, b] and
    // makes our figures equal numpy's to the last bit rather than merely close.
    let diff = b - a;
    Some(if t >= 0.5 {
        b - diff * (1.0 - t)
    } else {
        a + diff * t
    })
}

/// `np.median`: the middle value, or the mean of the two middle values.
fn median_sorted(sorted: &[f64]) -> Option<f64> {
    let n = sorted.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(sorted[n / 2]),
        _ => Some((sorted[n / 2 - 1] + sorted[n / 2]) / 2.0),
    }
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// `np.std` (population, ddof = 0).
fn std_dev(values: &[f64]) -> Option<f64> {
    let m = mean(values)?;
    let var = values.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / values.len() as f64;
    Some(var.sqrt())
}

fn sorted_copy(values: &[f64]) -> Vec<f64> {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
}

/// Mean, median, std and percentiles of one latency list, in milliseconds, zeros when empty.
struct Described {
    mean: f64,
    median: f64,
    std: f64,
    p99: f64,
    percentiles: Vec<(f64, f64)>,
}

fn describe_ms(seconds: &[f64]) -> Described {
    let sorted = sorted_copy(seconds);
    let ms = |v: Option<f64>| v.unwrap_or(0.0) * 1000.0;
    // Mean and std over the values in their original order, as numpy sums them.
    Described {
        mean: ms(mean(seconds)),
        median: ms(median_sorted(&sorted)),
        std: ms(std_dev(seconds)),
        p99: ms(percentile_sorted(&sorted, 99.0)),
        percentiles: SUMMARY_PERCENTILES
            .iter()
            .map(|&p| (p, ms(percentile_sorted(&sorted, p))))
            .collect(),
    }
}

// ---- Per-request timings and the benchmark summary ----

/// What a client saw of one request: when it was sent and when each output token arrived.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestTiming {
    /// When the request was sent, in seconds on the same clock as `token_times`.
    pub sent: f64,
    /// When each output token (or streamed chunk) arrived, ascending.
    pub token_times: Vec<f64>,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// Generated tokens. Kept apart from `token_times.len()` because a stream may deliver several
    /// tokens in one chunk; vLLM likewise counts tokens, not chunks, for TPOT.
    pub output_tokens: usize,
    /// Completed normally (vLLM's `success`); false for errors and aborts.
    pub finished: bool,
    /// Speculative decoding's proposals for the request, from its usage.
    #[serde(default)]
    pub spec: SpecUsage,
}

impl RequestTiming {
    /// Time to first token (s); `None` when no token arrived.
    pub fn ttft(&self) -> Option<f64> {
        Some(self.token_times.first()? - self.sent)
    }

    /// End-to-end latency, sent to last token (s); `None` when no token arrived.
    pub fn e2el(&self) -> Option<f64> {
        Some(self.token_times.last()? - self.sent)
    }

    /// Gaps between consecutive token arrivals (s).
    pub fn itls(&self) -> impl Iterator<Item = f64> + '_ {
        self.token_times.windows(2).map(|w| w[1] - w[0])
    }

    /// Time per output token after the first (s): (E2EL - TTFT) / (output_tokens - 1), only when
    /// more than one token was generated (a single token has no decode time).
    pub fn tpot(&self) -> Option<f64> {
        if self.output_tokens <= 1 {
            return None;
        }
        Some((self.e2el()? - self.ttft()?) / (self.output_tokens - 1) as f64)
    }

    /// Per-request decode speed the user sees: 1 / TPOT, in tokens per second.
    pub fn tps(&self) -> Option<f64> {
        self.tpot().filter(|&t| t > 0.0).map(|t| 1.0 / t)
    }
}

/// Service-level objectives for goodput, in milliseconds (vLLM's `--goodput ttft:.. tpot:.. e2el:..`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Slo {
    pub ttft_ms: Option<f64>,
    pub tpot_ms: Option<f64>,
    pub e2el_ms: Option<f64>,
}

impl Slo {
    fn is_empty(&self) -> bool {
        self.ttft_ms.is_none() && self.tpot_ms.is_none() && self.e2el_ms.is_none()
    }

    /// Whether a completed request meets every objective that is set. As in vLLM, a request with
    /// at most one output token counts as TPOT 0, and the comparison is `slo / 1000 >= value_s`.
    /// A request with no token has no TTFT or E2EL, so it fails those objectives.
    fn is_met_by(&self, r: &RequestTiming) -> bool {
        let meets = |slo_ms: Option<f64>, value_s: Option<f64>| match (slo_ms, value_s) {
            (None, _) => true,
            (Some(slo), Some(v)) => slo / 1000.0 >= v,
            (Some(_), None) => false,
        };
        meets(self.ttft_ms, r.ttft())
            && meets(self.tpot_ms, Some(r.tpot().unwrap_or(0.0)))
            && meets(self.e2el_ms, r.e2el())
    }
}

/// A benchmark run's result with vLLM's field names and units (latencies in ms, rates per second).
///
/// `p99_*` are the flat keys vLLM writes with its default `--metric-percentiles 99`;
/// `percentiles_*` are vLLM's `BenchmarkMetrics` lists of `[p, value]` for [`SUMMARY_PERCENTILES`].
/// The `*_per_request_tps` fields are ours: the decode speed each user saw (1 / TPOT), with P10 as
/// the slow tail.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchSummary {
    pub duration: f64,
    pub completed: usize,
    pub failed: usize,
    pub total_input_tokens: usize,
    pub total_output_tokens: usize,
    pub request_throughput: f64,
    /// `None` (JSON null) when no SLO was given, as vLLM writes it.
    pub request_goodput: Option<f64>,
    pub output_throughput: f64,
    pub total_token_throughput: f64,
    pub max_output_tokens_per_s: f64,
    pub max_concurrent_requests: usize,
    pub mean_ttft_ms: f64,
    pub median_ttft_ms: f64,
    pub std_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    pub percentiles_ttft_ms: Vec<(f64, f64)>,
    pub mean_tpot_ms: f64,
    pub median_tpot_ms: f64,
    pub std_tpot_ms: f64,
    pub p99_tpot_ms: f64,
    pub percentiles_tpot_ms: Vec<(f64, f64)>,
    pub mean_itl_ms: f64,
    pub median_itl_ms: f64,
    pub std_itl_ms: f64,
    pub p99_itl_ms: f64,
    pub percentiles_itl_ms: Vec<(f64, f64)>,
    pub mean_e2el_ms: f64,
    pub median_e2el_ms: f64,
    pub std_e2el_ms: f64,
    pub p99_e2el_ms: f64,
    pub percentiles_e2el_ms: Vec<(f64, f64)>,
    pub mean_per_request_tps: Option<f64>,
    pub median_per_request_tps: Option<f64>,
    pub p10_per_request_tps: Option<f64>,
}

impl BenchSummary {
    /// Summarize a run of `duration_s` seconds. Only `finished` requests count toward latencies,
    /// tokens and throughput (vLLM's successful outputs); the others are `failed`. A zero or
    /// invalid duration gives zero rates rather than infinities.
    pub fn from_requests(requests: &[RequestTiming], duration_s: f64, slo: Option<Slo>) -> Self {
        let ok: Vec<&RequestTiming> = requests.iter().filter(|r| r.finished).collect();
        let ttfts: Vec<f64> = ok.iter().filter_map(|r| r.ttft()).collect();
        let e2els: Vec<f64> = ok.iter().filter_map(|r| r.e2el()).collect();
        let tpots: Vec<f64> = ok.iter().filter_map(|r| r.tpot()).collect();
        let itls: Vec<f64> = ok.iter().flat_map(|r| r.itls()).collect();
        let tps = sorted_copy(&ok.iter().filter_map(|r| r.tps()).collect::<Vec<_>>());

        let total_input_tokens: usize = ok.iter().map(|r| r.prompt_tokens).sum();
        let total_output_tokens: usize = ok.iter().map(|r| r.output_tokens).sum();
        // A zero or broken duration would give infinities or NaN; report no rate instead.
        let valid = duration_s > 0.0 && duration_s.is_finite();
        let per_s = |count: f64| if valid { count / duration_s } else { 0.0 };
        let request_goodput = (slo.filter(|s| !s.is_empty()))
            .map(|s| per_s(ok.iter().filter(|r| s.is_met_by(r)).count() as f64));
        let (max_output_tokens_per_s, max_concurrent_requests) = peaks(&ok);

        let (ttft, tpot) = (describe_ms(&ttfts), describe_ms(&tpots));
        let (itl, e2el) = (describe_ms(&itls), describe_ms(&e2els));
        Self {
            duration: duration_s,
            completed: ok.len(),
            failed: requests.len() - ok.len(),
            total_input_tokens,
            total_output_tokens,
            request_throughput: per_s(ok.len() as f64),
            request_goodput,
            output_throughput: per_s(total_output_tokens as f64),
            total_token_throughput: per_s((total_input_tokens + total_output_tokens) as f64),
            max_output_tokens_per_s,
            max_concurrent_requests,
            mean_ttft_ms: ttft.mean,
            median_ttft_ms: ttft.median,
            std_ttft_ms: ttft.std,
            p99_ttft_ms: ttft.p99,
            percentiles_ttft_ms: ttft.percentiles,
            mean_tpot_ms: tpot.mean,
            median_tpot_ms: tpot.median,
            std_tpot_ms: tpot.std,
            p99_tpot_ms: tpot.p99,
            percentiles_tpot_ms: tpot.percentiles,
            mean_itl_ms: itl.mean,
            median_itl_ms: itl.median,
            std_itl_ms: itl.std,
            p99_itl_ms: itl.p99,
            percentiles_itl_ms: itl.percentiles,
            mean_e2el_ms: e2el.mean,
            median_e2el_ms: e2el.median,
            std_e2el_ms: e2el.std,
            p99_e2el_ms: e2el.p99,
            percentiles_e2el_ms: e2el.percentiles,
            mean_per_request_tps: mean(&tps),
            median_per_request_tps: median_sorted(&tps),
            p10_per_request_tps: percentile_sorted(&tps, 10.0),
        }
    }
}

/// vLLM's peak figures: the most output tokens in any one-second bucket counted from the earliest
/// send, and the peak number of requests in flight (half-open [sent, last token) intervals).
fn peaks(ok: &[&RequestTiming]) -> (f64, usize) {
    let spans: Vec<(f64, f64)> = ok
        .iter()
        .filter_map(|r| Some((r.sent, r.sent + r.e2el()?)))
        .collect();
    let Some(min_start) = spans.iter().map(|s| s.0).min_by(f64::total_cmp) else {
        return (0.0, 0);
    };
    let max_end = spans.iter().map(|s| s.1).fold(min_start, f64::max);
    let buckets = (max_end - min_start).ceil() as usize + 1;
    let mut per_second = vec![0_u64; buckets];
    for t in ok.iter().flat_map(|r| &r.token_times) {
        // `as i64` truncates toward zero like Python's int(), so bucket indices match vLLM's.
        let b = (t - min_start) as i64;
        if let Some(slot) = usize::try_from(b).ok().and_then(|b| per_second.get_mut(b)) {
            *slot += 1;
        }
    }
    let mut events: Vec<(f64, i32)> = spans.iter().flat_map(|&(s, e)| [(s, 1), (e, -1)]).collect();
    // Ends sort before starts at the same instant: a request that ends as another starts does not
    // overlap it.
    events.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let (mut now, mut peak) = (0_i64, 0_i64);
    for (_, d) in events {
        now += i64::from(d);
        peak = peak.max(now);
    }
    let max_tokens = per_second.iter().copied().max().unwrap_or(0);
    (max_tokens as f64, usize::try_from(peak).unwrap_or(0))
}

// ---- Live metrics ----

/// What the engine measured in one step. Token and prefix-cache counts are for this step alone;
/// `preemptions_total` is the scheduler's running total.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StepStats {
    /// When the step ended (s, engine clock).
    pub t: f64,
    /// Requests in this step's batch.
    pub batch_size: usize,
    /// Tokens run through the model this step (prefill + decode).
    pub scheduled_tokens: usize,
    pub prefill_tokens: usize,
    pub decode_tokens: usize,
    pub kv_used_blocks: usize,
    pub kv_total_blocks: usize,
    pub running: usize,
    pub waiting: usize,
    pub preemptions_total: u64,
    /// Prompt tokens looked up in the prefix cache this step, and how many were found.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Process resident memory (CPU runs); `None` where unknown.
    pub rss_bytes: Option<u64>,
    /// Wall time of the step.
    pub step_ms: f64,
    /// Speculative decoding in this step.
    pub spec: SpecStep,
    /// The share of the mixture-of-experts weights the step read (`None` for a dense model).
    #[serde(default)]
    pub expert_share: Option<f64>,
}

/// Identifies a request to [`LiveMetrics`]; the engine's request id.
pub type RequestKey = u64;

/// How a request left the engine, for the live counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FinishKind {
    /// Ended by a stop condition (stop token, string or length).
    Finished,
    /// Cancelled by the user or dropped by the engine.
    Aborted,
}

/// Settings for [`LiveMetrics`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LiveConfig {
    /// Sliding window for the live rates and percentiles (s).
    pub window_s: f64,
    /// Steps kept for plotting.
    pub step_capacity: usize,
    /// Timestamped samples kept per windowed series (token bursts, TTFTs, per-request TPS). Must
    /// cover a window's worth of steps, or the window shrinks to what was kept (see
    /// [`LiveSnapshot::output_tps_window_s`]).
    pub sample_capacity: usize,
}

impl Default for LiveConfig {
    fn default() -> Self {
        Self {
            window_s: 5.0,
            step_capacity: 4096,
            sample_capacity: 8192,
        }
    }
}

/// One request in flight; dropped when it finishes.
#[derive(Debug, Clone, Copy, Default)]
struct InFlight {
    sent: Option<f64>,
    prompt_tokens: usize,
    first_token: Option<f64>,
    last_token: f64,
    tokens: u64,
}

impl InFlight {
    /// Decode speed so far, (tokens - 1) / (last - first), once two tokens are out.
    fn tps(&self) -> Option<f64> {
        let first = self.first_token?;
        let span = self.last_token - first;
        (self.tokens >= 2 && span > 0.0).then(|| (self.tokens - 1) as f64 / span)
    }
}

/// Totals since creation or the last [`LiveMetrics::reset`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LiveCounters {
    pub requests_finished: u64,
    pub requests_aborted: u64,
    /// Turned away by load shedding.
    pub requests_refused: u64,
    /// Prompt tokens of requests that got through prefill.
    pub prompt_tokens_total: u64,
    pub generation_tokens_total: u64,
    pub preemptions: u64,
    pub spec: SpecCounters,
    /// Mixture-of-experts weight bytes the steps read, and the bytes of every expert of the
    /// layers they ran: their ratio is the share of expert weights read per step, weighted by
    /// step. Zero for a dense model.
    #[serde(default)]
    pub expert_bytes_read: u64,
    #[serde(default)]
    pub expert_bytes_total: u64,
}

impl LiveCounters {
    /// The share of expert weights the steps read since the counters started (`None` for a
    /// dense model).
    pub fn expert_share(&self) -> Option<f64> {
        (self.expert_bytes_total > 0)
            .then(|| self.expert_bytes_read as f64 / self.expert_bytes_total as f64)
    }
}

/// The live figures at one instant, plain data for the UI. The caller attaches the settings label
/// (batch size, prompt / output length, precision) that gives them meaning.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveSnapshot {
    pub t: f64,
    pub window_s: f64,
    /// Aggregate output tokens per second over the window.
    pub output_tps: f64,
    /// The span `output_tps` was actually measured over: `window_s`, or less if the sample ring
    /// overflowed within the window.
    pub output_tps_window_s: f64,
    /// Output tokens per second since the first event after creation or reset.
    pub output_tps_run: f64,
    /// Per-request decode TPS over requests that finished in the window or are streaming with
    /// two or more tokens, the latest within the window.
    pub per_request_tps_mean: Option<f64>,
    pub per_request_tps_p10: Option<f64>,
    pub per_request_tps_samples: usize,
    /// TTFT of first tokens produced within the window.
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    /// Inter-token latency (the gap a streaming client waits between two deliveries of one
    /// request) of gaps that ended within the window.
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    /// Prefix-cache hits / queries over the steps in the window.
    pub prefix_cache_hit_rate: Option<f64>,
    pub requests_in_flight: usize,
    #[serde(flatten)]
    pub counters: LiveCounters,
    /// The latest step (batch size, queue depth, KV blocks, memory, step time).
    pub latest_step: Option<StepStats>,
    /// Speculative decoding over the window's steps.
    pub spec: SpecWindow,
    /// What the latest step of a mixture of experts read, and how many tokens each expert got.
    #[serde(default)]
    pub experts: Option<ExpertLoad>,
}

/// Live engine metrics, fed by the engine thread at every step and token and read by the UI.
///
/// Memory is bounded: per-request state lives only while a request is in flight, and windowed
/// series are rings of timestamped samples.
#[derive(Debug, Clone)]
pub struct LiveMetrics {
    config: LiveConfig,
    steps: Ring<StepStats>,
    /// (time, tokens produced at that time); tokens of one step share a timestamp and one entry.
    token_bursts: Ring<(f64, u64)>,
    /// Newest timestamp pushed out of `token_bursts`: counts after it are complete.
    tokens_evicted_until: f64,
    /// (time of first token, TTFT s).
    ttfts: Ring<(f64, f64)>,
    /// (time, gap s) between two token deliveries of one request.
    itls: Ring<(f64, f64)>,
    /// (finish time, decode TPS) of finished requests with two or more tokens.
    finished_tps: Ring<(f64, f64)>,
    in_flight: HashMap<RequestKey, InFlight>,
    run_start: Option<f64>,
    counters: LiveCounters,
    /// Scheduler's preemption total at the last reset, and the latest one seen.
    preemptions_base: u64,
    preemptions_seen: u64,
    /// The latest step's expert load (kept allocated from step to step).
    experts: Option<ExpertLoad>,
}

impl LiveMetrics {
    /// Empty metrics; fails on a non-positive window or a zero capacity.
    pub fn new(config: LiveConfig) -> Result<Self, MetricsError> {
        if !(config.window_s > 0.0 && config.window_s.is_finite()) {
            return Err(MetricsError::BadWindow(config.window_s));
        }
        Ok(Self {
            steps: Ring::new(config.step_capacity)?,
            token_bursts: Ring::new(config.sample_capacity)?,
            tokens_evicted_until: f64::NEG_INFINITY,
            ttfts: Ring::new(config.sample_capacity)?,
            itls: Ring::new(config.sample_capacity)?,
            finished_tps: Ring::new(config.sample_capacity)?,
            in_flight: HashMap::new(),
            run_start: None,
            counters: LiveCounters::default(),
            preemptions_base: 0,
            preemptions_seen: 0,
            experts: None,
            config,
        })
    }

    pub fn config(&self) -> &LiveConfig {
        &self.config
    }

    /// Step history for plotting, oldest first.
    pub fn steps(&self) -> &Ring<StepStats> {
        &self.steps
    }

    /// Forget everything measured so far (a new run); requests in flight are kept so their
    /// tokens and finishes still count.
    pub fn reset(&mut self) {
        self.steps.clear();
        self.token_bursts.clear();
        self.tokens_evicted_until = f64::NEG_INFINITY;
        self.ttfts.clear();
        self.itls.clear();
        self.finished_tps.clear();
        self.run_start = None;
        self.counters = LiveCounters::default();
        self.preemptions_base = self.preemptions_seen;
        self.experts = None;
    }

    fn mark(&mut self, t: f64) {
        self.run_start.get_or_insert(t);
    }

    /// A request was accepted at `t` (its TTFT is measured from here).
    pub fn on_arrival(&mut self, req: RequestKey, t: f64, prompt_tokens: usize) {
        self.mark(t);
        self.in_flight.insert(
            req,
            InFlight {
                sent: Some(t),
                prompt_tokens,
                ..InFlight::default()
            },
        );
    }

    /// A request was turned away by load shedding.
    pub fn on_refused(&mut self, t: f64) {
        self.mark(t);
        self.counters.requests_refused += 1;
    }

    /// One engine step finished.
    pub fn on_step(&mut self, stats: StepStats) {
        self.mark(stats.t);
        self.preemptions_seen = stats.preemptions_total;
        if stats.preemptions_total < self.preemptions_base {
            // The scheduler was rebuilt (e.g. new KV budget) and its total restarted.
            self.preemptions_base = 0;
        }
        self.counters.spec.add(&stats.spec);
        self.steps.push(stats);
    }

    /// What a mixture-of-experts step read (after its [`Self::on_step`]).
    pub fn on_experts(&mut self, load: &ExpertLoad) {
        self.counters.expert_bytes_read += load.bytes_read as u64;
        self.counters.expert_bytes_total += load.bytes_total as u64;
        match &mut self.experts {
            Some(latest) => latest.clone_from(load),
            None => self.experts = Some(load.clone()),
        }
    }

    /// One output token of `req` at `t`.
    pub fn on_token(&mut self, req: RequestKey, t: f64) {
        self.on_tokens(req, t, 1);
    }

    /// `n` output tokens of `req` at `t`. The first token of a request records its TTFT.
    pub fn on_tokens(&mut self, req: RequestKey, t: f64, n: u64) {
        if n == 0 {
            return;
        }
        self.mark(t);
        self.counters.generation_tokens_total += n;
        match self.token_bursts.latest_mut() {
            Some(last) if last.0 == t => last.1 += n,
            _ => {
                if let Some((old_t, _)) = self.token_bursts.push((t, n)) {
                    self.tokens_evicted_until = self.tokens_evicted_until.max(old_t);
                }
            }
        }
        // A token for a request we never saw arrive still counts; it only lacks a TTFT.
        let state = self.in_flight.entry(req).or_default();
        if state.first_token.is_none() {
            state.first_token = Some(t);
            // Prompt tokens count once prefilled, so requests dropped while queued do not.
            self.counters.prompt_tokens_total += state.prompt_tokens as u64;
            if let Some(sent) = state.sent {
                self.ttfts.push((t, t - sent));
            }
        } else {
            // One gap per delivery: tokens that arrive together (one burst) wait once.
            self.itls.push((t, t - state.last_token));
        }
        state.tokens += n;
        state.last_token = t;
    }

    /// `req` left the engine at `t`; its per-request state is dropped here.
    pub fn on_finish(&mut self, req: RequestKey, t: f64, kind: FinishKind) {
        self.mark(t);
        match kind {
            FinishKind::Finished => self.counters.requests_finished += 1,
            FinishKind::Aborted => self.counters.requests_aborted += 1,
        }
        if let Some(tps) = self.in_flight.remove(&req).and_then(|s| s.tps()) {
            self.finished_tps.push((t, tps));
        }
    }

    /// Output tokens per second over (now - window, now] and the span actually covered.
    pub fn output_tps_window(&self, now: f64) -> (f64, f64) {
        // If the ring dropped samples inside the window, measure over the part we still have
        // rather than report a rate that silently misses tokens.
        let from = (now - self.config.window_s).max(self.tokens_evicted_until);
        let span = now - from;
        if span <= 0.0 {
            return (0.0, 0.0);
        }
        let tokens: u64 = self
            .token_bursts
            .iter()
            .filter(|(t, _)| *t > from && *t <= now)
            .map(|(_, n)| n)
            .sum();
        (tokens as f64 / span, span)
    }

    fn in_window(&self, t: f64, now: f64) -> bool {
        t > now - self.config.window_s && t <= now
    }

    fn window_values(&self, samples: &Ring<(f64, f64)>, now: f64) -> Vec<f64> {
        let in_window = samples.iter().filter(|(t, _)| self.in_window(*t, now));
        in_window.map(|&(_, v)| v).collect()
    }

    /// The live figures at `now`.
    pub fn snapshot(&self, now: f64) -> LiveSnapshot {
        let (output_tps, output_tps_window_s) = self.output_tps_window(now);
        let elapsed = self.run_start.map_or(0.0, |start| now - start);
        let total = self.counters.generation_tokens_total as f64;
        let output_tps_run = if elapsed > 0.0 { total / elapsed } else { 0.0 };

        let mut tps = self.window_values(&self.finished_tps, now);
        let streaming = self.in_flight.values();
        tps.extend(
            streaming
                .filter(|s| self.in_window(s.last_token, now))
                .filter_map(InFlight::tps),
        );
        tps.sort_by(f64::total_cmp);
        let mut ttfts = self.window_values(&self.ttfts, now);
        ttfts.sort_by(f64::total_cmp);
        let mut itls = self.window_values(&self.itls, now);
        itls.sort_by(f64::total_cmp);
        let (queries, hits) = self
            .steps
            .iter()
            .filter(|s| self.in_window(s.t, now))
            .fold((0_u64, 0_u64), |(q, h), s| {
                (q + s.prefix_cache_queries, h + s.prefix_cache_hits)
            });

        LiveSnapshot {
            t: now,
            window_s: self.config.window_s,
            output_tps,
            output_tps_window_s,
            output_tps_run,
            per_request_tps_mean: mean(&tps),
            per_request_tps_p10: percentile_sorted(&tps, 10.0),
            per_request_tps_samples: tps.len(),
            ttft_p50_ms: percentile_sorted(&ttfts, 50.0).map(|v| v * 1000.0),
            ttft_p99_ms: percentile_sorted(&ttfts, 99.0).map(|v| v * 1000.0),
            itl_p50_ms: percentile_sorted(&itls, 50.0).map(|v| v * 1000.0),
            itl_p99_ms: percentile_sorted(&itls, 99.0).map(|v| v * 1000.0),
            prefix_cache_hit_rate: (queries > 0).then(|| hits as f64 / queries as f64),
            requests_in_flight: self.in_flight.len(),
            counters: LiveCounters {
                preemptions: self.preemptions_seen.saturating_sub(self.preemptions_base),
                ..self.counters.clone()
            },
            latest_step: self.steps.latest().cloned(),
            spec: SpecWindow::of(
                self.steps
                    .iter()
                    .filter(|s| self.in_window(s.t, now))
                    .map(|s| &s.spec),
            ),
            experts: self.experts.clone(),
        }
    }
}

// ---- Cost and process memory ----

/// Dollars per million output tokens at `dollars_per_hour` and a sustained `output_tokens_per_s`;
/// `None` when nothing is produced (the cost would be infinite).
pub fn cost_per_million_output_tokens(
    dollars_per_hour: f64,
    output_tokens_per_s: f64,
) -> Option<f64> {
    (output_tokens_per_s > 0.0 && output_tokens_per_s.is_finite())
        .then(|| dollars_per_hour / (output_tokens_per_s * 3600.0) * 1e6)
}

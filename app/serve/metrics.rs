//! `GET /metrics`: Prometheus text in the shape of vLLM's `vllm:*` family under `tpslab:`.
//! Latencies and token counts are measured here, from the events the server forwards (so they
//! count exactly the requests made through it); queue and KV gauges come from the engine's snapshot.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{EngineSnapshot, Event};
use tpslab_engine::tune::TraceEntry;

use super::trace::TraceWriter;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// Queue time (accepted -> first scheduled) is short on a local engine: finer low buckets than
/// vLLM's request-latency set it borrows for `request_queue_time_seconds`.
const QUEUE_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0,
    160.0, 640.0,
];

/// A cumulative histogram of seconds, lock-free (sums kept in microseconds).
struct Histogram {
    bounds: &'static [f64],
    counts: Vec<AtomicU64>,
    count: AtomicU64,
    sum_us: AtomicU64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: bounds.iter().map(|_| AtomicU64::new(0)).collect(),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }

    fn observe(&self, s: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| s <= b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_us
            .fetch_add((s * 1e6).round() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cum = 0;
        for (b, c) in self.bounds.iter().zip(&self.counts) {
            cum += c.load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b}\"}} {cum}");
        }
        let n = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {n}");
        let sum = self.sum_us.load(Ordering::Relaxed) as f64 / 1e6;
        let _ = writeln!(
            out,
            "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {n}"
        );
    }
}

/// The server's own counters and latency histograms.
pub struct ServerMetrics {
    model: String,
    prompt_tokens: AtomicU64,
    generation_tokens: AtomicU64,
    /// Finished requests by reason: stop, length, abort.
    success: [AtomicU64; 3],
    refused: AtomicU64,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    queue: Histogram,
    /// `--record-trace`: each finished request's arrival and token counts.
    trace: Option<TraceWriter>,
}

/// Times one request from submission to its last event.
pub struct RequestTimer<'a> {
    m: &'a ServerMetrics,
    sent: Instant,
    last_token: Option<Instant>,
    prompt_len: usize,
}

impl RequestTimer<'_> {
    pub fn observe(&mut self, ev: &Event) {
        let m = self.m;
        let now = Instant::now();
        match ev {
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
            Event::Token { .. } => {
                m.generation_tokens.fetch_add(1, Ordering::Relaxed);
                match self.last_token {
                    None => m.ttft.observe((now - self.sent).as_secs_f64()),
                    Some(t) => m.itl.observe((now - t).as_secs_f64()),
                }
                self.last_token = Some(now);
            }
            Event::Finished {
                reason,
                queue_time,
                usage,
                ..
            } => {
                if let Some(trace) = &m.trace {
                    let ago = (now - self.sent).as_secs_f64();
                    let unix = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0.0, |d| d.as_secs_f64());
                    trace.record(TraceEntry {
                        t: unix - ago,
                        prompt_tokens: self.prompt_len,
                        completion_tokens: usage.completion_tokens,
                    });
                }
                m.queue.observe(queue_time.as_secs_f64());
                let i = match reason {
                    FinishReason::Stop => 0,
                    FinishReason::Length => 1,
                    FinishReason::Abort => 2,
                };
                m.success[i].fetch_add(1, Ordering::Relaxed);
                m.prompt_tokens
                    .fetch_add(self.prompt_len as u64, Ordering::Relaxed);
                m.e2e.observe((now - self.sent).as_secs_f64());
            }
            Event::Refused { .. } => {
                m.refused.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

impl ServerMetrics {
    pub fn new(model: &str) -> Self {
        Self {
            model: model.replace(['"', '\\', '\n'], "_"),
            prompt_tokens: AtomicU64::new(0),
            generation_tokens: AtomicU64::new(0),
            success: Default::default(),
            refused: AtomicU64::new(0),
            ttft: Histogram::new(TTFT_BUCKETS),
            itl: Histogram::new(ITL_BUCKETS),
            e2e: Histogram::new(E2E_BUCKETS),
            queue: Histogram::new(QUEUE_BUCKETS),
            trace: None,
        }
    }

    /// Records every finished request to `trace` too.
    pub fn with_trace(self, trace: TraceWriter) -> Self {
        Self {
            trace: Some(trace),
            ..self
        }
    }

    pub fn start(&self, sent: Instant, prompt_len: usize) -> RequestTimer<'_> {
        RequestTimer {
            m: self,
            sent,
            last_token: None,
            prompt_len,
        }
    }

    /// The counters' (name, help, value), each exposed as `tpslab:{name}_total`.
    fn counter_rows(&self, snap: &EngineSnapshot) -> [(&'static str, &'static str, u64); 11] {
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let sc = &snap.live.counters.spec;
        [
            (
                "spec_decode_num_drafts",
                "Steps that verified a request's proposed tokens (speculative decoding).",
                sc.num_drafts,
            ),
            (
                "spec_decode_num_draft_tokens",
                "Proposed tokens verified.",
                sc.num_draft_tokens,
            ),
            (
                "spec_decode_num_accepted_tokens",
                "Proposed tokens accepted.",
                sc.num_accepted_tokens,
            ),
            (
                "expert_bytes_read",
                "Mixture-of-experts weight bytes the steps read (0 for a dense model).",
                snap.live.counters.expert_bytes_read,
            ),
            (
                "expert_bytes",
                "Bytes of every expert of the MoE layers the steps ran: expert_bytes_read over this is the share read.",
                snap.live.counters.expert_bytes_total,
            ),
            (
                "num_preemptions",
                "Cumulative number of preemptions.",
                snap.live.counters.preemptions,
            ),
            (
                "prompt_tokens",
                "Number of prefill tokens processed.",
                load(&self.prompt_tokens),
            ),
            (
                "generation_tokens",
                "Number of generation tokens processed.",
                load(&self.generation_tokens),
            ),
            (
                "prefix_cache_queries",
                "Prefix-cache queries, in tokens (since the KV pool was built).",
                snap.prefix_cache_queries,
            ),
            (
                "prefix_cache_hits",
                "Prefix-cache hits, in tokens (since the KV pool was built).",
                snap.prefix_cache_hits,
            ),
            (
                "request_refused",
                "Requests refused (queue full, bad input).",
                load(&self.refused),
            ),
        ]
    }

    /// The Prometheus text exposition (version 0.0.4).
    pub fn render(&self, snap: &EngineSnapshot) -> String {
        let mut out = String::new();
        let l = format!("model_name=\"{}\"", self.model);
        let kv_usage = if snap.kv_total_blocks == 0 {
            0.0
        } else {
            snap.kv_used_blocks as f64 / snap.kv_total_blocks as f64
        };
        let gauges: [(&str, &str, f64); 5] = [
            (
                "num_requests_running",
                "Requests in model execution batches.",
                snap.running as f64,
            ),
            (
                "num_requests_waiting",
                "Requests waiting to be processed.",
                snap.waiting as f64,
            ),
            (
                "kv_cache_usage_perc",
                "KV-cache usage. 1 means 100 percent usage.",
                kv_usage,
            ),
            (
                "kv_cache_capacity_tokens",
                "Tokens the KV pool holds (blocks x tokens per block).",
                kv_capacity_tokens(snap) as f64,
            ),
            (
                "max_num_seqs",
                "Most sequences running at once in the batch (--max-num-seqs, --parallel).",
                snap.knobs.scheduler.max_num_seqs as f64,
            ),
        ];
        for (name, help, v) in gauges {
            let _ = writeln!(
                out,
                "# HELP tpslab:{name} {help}\n# TYPE tpslab:{name} gauge\ntpslab:{name}{{{l}}} {v}"
            );
        }
        let sc = &snap.live.counters.spec;
        let counters = self.counter_rows(snap);
        for (name, help, v) in counters {
            let _ = writeln!(
                out,
                "# HELP tpslab:{name}_total {help}\n# TYPE tpslab:{name}_total counter\ntpslab:{name}_total{{{l}}} {v}"
            );
        }
        let _ = writeln!(
            out,
            "# HELP tpslab:request_success_total Count of successfully processed requests.\n# TYPE tpslab:request_success_total counter"
        );
        for (reason, c) in ["stop", "length", "abort"].iter().zip(&self.success) {
            let _ = writeln!(
                out,
                "tpslab:request_success_total{{{l},finished_reason=\"{reason}\"}} {}",
                c.load(Ordering::Relaxed)
            );
        }
        // Speculation's time, in seconds as Prometheus counts time.
        let secs = [
            (
                "spec_decode_propose_seconds",
                "Time spent proposing tokens (n-gram lookup or drafter forwards).",
                sc.propose_us,
            ),
            (
                "spec_decode_verify_seconds",
                "Time of the steps that verified proposed tokens (forward and verification).",
                sc.verify_us,
            ),
        ];
        for (name, help, us) in secs {
            let _ = writeln!(
                out,
                "# HELP tpslab:{name}_total {help}\n# TYPE tpslab:{name}_total counter\ntpslab:{name}_total{{{l}}} {}",
                us as f64 / 1e6
            );
        }
        render_accepted_per_pos(&mut out, &l, &sc.num_accepted_tokens_per_pos);
        self.render_histograms(&mut out, &l);
        out
    }

    /// The latency histograms, labelled `l`.
    fn render_histograms(&self, out: &mut String, l: &str) {
        let histograms = [
            (
                &self.ttft,
                "time_to_first_token_seconds",
                "Histogram of time to first token in seconds.",
            ),
            (
                &self.itl,
                "inter_token_latency_seconds",
                "Histogram of inter-token latency in seconds.",
            ),
            (
                &self.e2e,
                "e2e_request_latency_seconds",
                "Histogram of end to end request latency in seconds.",
            ),
            (
                &self.queue,
                "request_queue_time_seconds",
                "Histogram of time spent in WAITING phase for request.",
            ),
        ];
        for (h, name, help) in histograms {
            h.render(out, &format!("tpslab:{name}"), help, l);
        }
    }
}

/// Speculative decoding's accepted tokens by their position in the proposal, labelled `l`.
fn render_accepted_per_pos(out: &mut String, l: &str, per_pos: &[u64]) {
    let _ = writeln!(
        out,
        "# HELP tpslab:spec_decode_num_accepted_tokens_per_pos_total Accepted tokens by their position in the proposal.\n# TYPE tpslab:spec_decode_num_accepted_tokens_per_pos_total counter"
    );
    for (pos, n) in per_pos.iter().enumerate() {
        let _ = writeln!(
            out,
            "tpslab:spec_decode_num_accepted_tokens_per_pos_total{{{l},position=\"{pos}\"}} {n}"
        );
    }
}

/// Tokens the engine's KV pool holds: its blocks times the tokens in each.
pub fn kv_capacity_tokens(snap: &EngineSnapshot) -> usize {
    snap.kv_total_blocks
        .saturating_mul(snap.knobs.kv.block_size)
}

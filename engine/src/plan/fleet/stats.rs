//! What a replay records and reports: latency histograms (log bins 2% wide, so memory is bounded
//! however many tokens a replay emits), per time window and over the whole replay, with the
//! vLLM definitions of the design card: TTFT and E2E latency per request (counted in the window
//! the request arrived in), ITL as the gaps between a request's tokens (counted in the window
//! the token came out in), and the replicas ready and booting integrated over time.

use std::collections::BTreeMap;

use serde::Serialize;

/// The smallest latency told apart, ms, and each bin's width as a ratio.
const BASE_MS: f64 = 0.01;
const RATIO: f64 = 1.02;

/// Counts of latencies in log bins: a quantile comes back within one bin (2%).
#[derive(Debug, Clone, Default)]
pub struct Histogram {
    bins: BTreeMap<u16, u64>,
    n: u64,
}

impl Histogram {
    pub fn add(&mut self, secs: f64) {
        let ms = (secs * 1e3).max(BASE_MS);
        let bin = ((ms / BASE_MS).ln() / RATIO.ln())
            .floor()
            .min(f64::from(u16::MAX)) as u16;
        *self.bins.entry(bin).or_default() += 1;
        self.n += 1;
    }

    pub fn merge(&mut self, other: &Self) {
        for (&b, &c) in &other.bins {
            *self.bins.entry(b).or_default() += c;
        }
        self.n += other.n;
    }

    /// The `q` quantile in ms (the middle of its bin); `None` when empty.
    pub fn quantile_ms(&self, q: f64) -> Option<f64> {
        let rank = ((q * self.n as f64).ceil() as u64).clamp(1, self.n.max(1));
        let mut seen = 0;
        for (&b, &c) in &self.bins {
            seen += c;
            if seen >= rank {
                return Some(BASE_MS * RATIO.powf(f64::from(b) + 0.5));
            }
        }
        None
    }
}

/// One window's counts as they accumulate.
#[derive(Debug, Clone, Default)]
struct Acc {
    arrivals: u64,
    shed: u64,
    finished: u64,
    output_tokens: u64,
    ttft: Histogram,
    itl: Histogram,
    e2e: Histogram,
    /// Replica-seconds ready and booting within the window.
    ready_s: f64,
    booting_s: f64,
    max_ready: usize,
}

/// P50 and P99 of TTFT, ITL and E2E latency in ms, over a window or a replay (`None` where
/// nothing was measured).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Latency {
    pub ttft_p50_ms: Option<f64>,
    pub ttft_p99_ms: Option<f64>,
    pub itl_p50_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub e2e_p50_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
}

impl Latency {
    /// The figures CSV and tables print, in the order of [`Latency::NAMES`].
    pub const NAMES: [&'static str; 6] = [
        "ttft_p50_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
    ];

    /// The quantiles of three histograms.
    pub fn of(ttft: &Histogram, itl: &Histogram, e2e: &Histogram) -> Self {
        Self {
            ttft_p50_ms: ttft.quantile_ms(0.5),
            ttft_p99_ms: ttft.quantile_ms(0.99),
            itl_p50_ms: itl.quantile_ms(0.5),
            itl_p99_ms: itl.quantile_ms(0.99),
            e2e_p50_ms: e2e.quantile_ms(0.5),
            e2e_p99_ms: e2e.quantile_ms(0.99),
        }
    }

    /// The six figures, in the order of [`Latency::NAMES`].
    pub fn figures(&self) -> [Option<f64>; 6] {
        [
            self.ttft_p50_ms,
            self.ttft_p99_ms,
            self.itl_p50_ms,
            self.itl_p99_ms,
            self.e2e_p50_ms,
            self.e2e_p99_ms,
        ]
    }
}

/// One time window of a replay.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct WindowStats {
    pub start_s: f64,
    pub end_s: f64,
    pub arrivals: u64,
    pub shed: u64,
    pub finished: u64,
    pub output_tokens: u64,
    /// Its latency figures (flattened: the JSON keeps `ttft_p50_ms` and the rest at this level).
    #[serde(flatten)]
    pub latency: Latency,
    /// Mean replicas ready (taking requests) over the window, and the most at once.
    pub replicas_mean: f64,
    pub replicas_max: usize,
    /// Mean replicas scaling up or loading their weights.
    pub booting_mean: f64,
}

/// A whole replay's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub requests: u64,
    pub finished: u64,
    /// Refused at the shedding limit.
    pub shed: u64,
    /// Refused because prompt and output together pass a replica's KV capacity.
    pub too_long: u64,
    /// Still running or queued when the replay's time ran out.
    pub unfinished: u64,
    pub output_tokens: u64,
    pub preemptions: u64,
    /// Its latency figures (flattened: the JSON keeps `ttft_p50_ms` and the rest at this level).
    #[serde(flatten)]
    pub latency: Latency,
    /// From the first arrival (t = 0) to the last event.
    pub span_s: f64,
    pub gpu_hours: f64,
    pub usd: f64,
    /// `None` when nothing came out.
    pub usd_per_million_output_tokens: Option<f64>,
    pub max_replicas: usize,
}

/// Records a replay's events into windows of `window_s`.
#[derive(Debug)]
pub struct Recorder {
    window_s: f64,
    windows: Vec<Acc>,
    pub shed: u64,
    pub too_long: u64,
}

impl Recorder {
    /// A recorder of `n_windows` windows of `window_s`: events past the last one count in it.
    pub fn new(window_s: f64, n_windows: usize) -> Self {
        Self {
            window_s,
            windows: vec![Acc::default(); n_windows.max(1)],
            shed: 0,
            too_long: 0,
        }
    }

    fn at(&mut self, t: f64) -> &mut Acc {
        let last = self.windows.len() - 1;
        let i = ((t / self.window_s).floor().max(0.0) as usize).min(last);
        &mut self.windows[i]
    }

    pub fn arrival(&mut self, t: f64) {
        self.at(t).arrivals += 1;
    }

    pub fn shed(&mut self, t: f64) {
        self.at(t).shed += 1;
        self.shed += 1;
    }

    pub fn too_long(&mut self, t: f64) {
        self.at(t).shed += 1;
        self.too_long += 1;
    }

    pub fn token(&mut self, t: f64) {
        self.at(t).output_tokens += 1;
    }

    pub fn first_token(&mut self, arrival: f64, ttft_s: f64) {
        self.at(arrival).ttft.add(ttft_s);
    }

    pub fn inter_token(&mut self, t: f64, gap_s: f64) {
        self.at(t).itl.add(gap_s);
    }

    pub fn finished(&mut self, arrival: f64, e2e_s: f64) {
        let w = self.at(arrival);
        w.finished += 1;
        w.e2e.add(e2e_s);
    }

    /// `ready` replicas ready and `booting` booting from `from` to `to`, split over windows.
    pub fn replicas(&mut self, from: f64, to: f64, ready: usize, booting: usize) {
        let mut t = from;
        while t < to {
            let i = ((t / self.window_s).floor() as usize).min(self.windows.len() - 1);
            let end = if i + 1 == self.windows.len() {
                to
            } else {
                (((i + 1) as f64) * self.window_s).min(to)
            };
            let w = &mut self.windows[i];
            w.ready_s += (end - t) * ready as f64;
            w.booting_s += (end - t) * booting as f64;
            w.max_ready = w.max_ready.max(ready);
            // A window boundary that rounding leaves at or before t ends the walk.
            if end <= t {
                break;
            }
            t = end;
        }
    }

    /// The windows up to `end_s` (the replay's span), and the figures over all of them.
    pub fn finish(&self, end_s: f64) -> (Vec<WindowStats>, Histograms) {
        let mut all = Histograms::default();
        let n = ((end_s / self.window_s).ceil() as usize).clamp(1, self.windows.len());
        let mut out = Vec::with_capacity(n);
        for (i, w) in self.windows.iter().enumerate().take(n) {
            let start_s = i as f64 * self.window_s;
            let end = if i + 1 == n {
                end_s.max(start_s)
            } else {
                start_s + self.window_s
            };
            let len = (end - start_s).max(1e-9);
            all.ttft.merge(&w.ttft);
            all.itl.merge(&w.itl);
            all.e2e.merge(&w.e2e);
            all.output_tokens += w.output_tokens;
            all.finished += w.finished;
            all.requests += w.arrivals;
            out.push(WindowStats {
                start_s,
                end_s: end,
                arrivals: w.arrivals,
                shed: w.shed,
                finished: w.finished,
                output_tokens: w.output_tokens,
                latency: Latency::of(&w.ttft, &w.itl, &w.e2e),
                replicas_mean: w.ready_s / len,
                replicas_max: w.max_ready,
                booting_mean: w.booting_s / len,
            });
        }
        (out, all)
    }
}

/// The histograms and counts over a whole replay.
#[derive(Debug, Default)]
pub struct Histograms {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub e2e: Histogram,
    pub output_tokens: u64,
    pub finished: u64,
    pub requests: u64,
}

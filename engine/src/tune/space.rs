//! What the tuner searches and how it judges: the knobs of one candidate, the space they are
//! drawn from, the service-level objectives, and a measured run's figures and score.

use rand::SeedableRng;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use serde::{Deserialize, Serialize};

use crate::serving::engine::Knobs;
use crate::serving::metrics::{BenchSummary, RequestTiming, percentile};
use crate::spec::SpecMethod;

/// Why a service-level objective does not parse (which key, and what is wrong with it).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SloError(pub String);

/// One setting of the knobs the tuner turns.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Candidate {
    pub max_num_seqs: usize,
    pub max_num_batched_tokens: usize,
    pub chunked_prefill: bool,
    pub spec: SpecMethod,
    pub adaptive_budget: bool,
    /// Weight type name ("Q8_0"); `None`: the precision the model was loaded at.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
}

impl Candidate {
    /// The candidate `knobs` are (at the loaded precision).
    pub fn of_knobs(k: &Knobs) -> Self {
        Self {
            max_num_seqs: k.scheduler.max_num_seqs,
            max_num_batched_tokens: k.scheduler.max_num_batched_tokens,
            chunked_prefill: k.scheduler.chunked_prefill,
            spec: k.spec.method,
            adaptive_budget: k.scheduler.adaptive_budget,
            precision: None,
        }
    }

    /// `base` with this candidate's knobs; the adaptive budget aims at `itl_target_ms` when one
    /// is given (the ITL objective), else at `base`'s target.
    pub fn knobs(&self, base: &Knobs, itl_target_ms: Option<f64>) -> Knobs {
        let mut k = base.clone();
        let s = &mut k.scheduler;
        s.max_num_seqs = self.max_num_seqs;
        s.max_num_batched_tokens = self.max_num_batched_tokens;
        s.chunked_prefill = self.chunked_prefill;
        s.adaptive_budget = self.adaptive_budget;
        if let Some(t) = itl_target_ms.filter(|t| t.is_finite() && *t >= 1.0) {
            s.itl_target_ms = t.min(f64::from(u32::MAX)) as u32;
        }
        k.spec.method = self.spec;
        k
    }

    /// One line: "seqs 16 · budget 512 · chunked · spec off · adaptive · Q4_1".
    pub fn label(&self) -> String {
        let mut s = format!(
            "seqs {} · budget {} · {} · spec {}",
            self.max_num_seqs,
            self.max_num_batched_tokens,
            if self.chunked_prefill {
                "chunked"
            } else {
                "whole prompts"
            },
            self.spec
        );
        if self.adaptive_budget {
            s.push_str(" · adaptive");
        }
        if let Some(p) = &self.precision {
            s.push_str(" · ");
            s.push_str(p);
        }
        s
    }
}

/// The values each knob may take; candidates are drawn from their product.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Space {
    pub max_num_seqs: Vec<usize>,
    pub max_num_batched_tokens: Vec<usize>,
    pub chunked_prefill: Vec<bool>,
    pub spec: Vec<SpecMethod>,
    pub adaptive_budget: Vec<bool>,
    /// Weight types to re-quantize to; `None` is the loaded precision.
    pub precision: Vec<Option<String>>,
}

impl Space {
    /// Batch caps up to the load's concurrency (more would never fill), several token
    /// budgets, chunked prefill on and off, speculation off / n-gram / self-drafting, the
    /// adaptive budget on and off, at the loaded precision.
    pub fn default_for(concurrency: usize) -> Self {
        let top = concurrency.clamp(1, 256);
        let mut seqs: Vec<usize> = [1, 2, 4, 8, 16, 32, 64, 128, 256]
            .into_iter()
            .filter(|&s| s < top)
            .collect();
        seqs.push(top);
        Self {
            max_num_seqs: seqs,
            max_num_batched_tokens: vec![64, 256, 512, 2048],
            chunked_prefill: vec![true, false],
            spec: vec![SpecMethod::Off, SpecMethod::Ngram, SpecMethod::SelfDraft],
            adaptive_budget: vec![false, true],
            precision: vec![None],
        }
    }

    /// Settings in the whole product.
    pub fn size(&self) -> usize {
        self.max_num_seqs.len()
            * self.max_num_batched_tokens.len()
            * self.chunked_prefill.len()
            * self.spec.len()
            * self.adaptive_budget.len()
            * self.precision.len()
    }

    /// Setting `i` of the product (`i < size()`), the last knob varying fastest.
    fn nth(&self, mut i: usize) -> Option<Candidate> {
        let mut pick = |len: usize| {
            let at = i % len.max(1);
            i /= len.max(1);
            at
        };
        let precision = self.precision.get(pick(self.precision.len()))?.clone();
        let adaptive_budget = *self.adaptive_budget.get(pick(self.adaptive_budget.len()))?;
        let spec = *self.spec.get(pick(self.spec.len()))?;
        let chunked_prefill = *self.chunked_prefill.get(pick(self.chunked_prefill.len()))?;
        let tokens = pick(self.max_num_batched_tokens.len());
        let max_num_batched_tokens = *self.max_num_batched_tokens.get(tokens)?;
        let max_num_seqs = *self.max_num_seqs.get(pick(self.max_num_seqs.len()))?;
        Some(Candidate {
            max_num_seqs,
            max_num_batched_tokens,
            chunked_prefill,
            spec,
            adaptive_budget,
            precision,
        })
    }

    /// `n` distinct candidates: `first` (the defaults, always measured), then settings drawn
    /// without replacement from the product with `seed`.
    pub fn sample(&self, n: usize, seed: u64, first: &Candidate) -> Vec<Candidate> {
        let mut order: Vec<usize> = (0..self.size()).collect();
        order.shuffle(&mut StdRng::seed_from_u64(seed));
        let mut out = vec![first.clone()];
        for c in order.into_iter().filter_map(|i| self.nth(i)) {
            if out.len() >= n {
                break;
            }
            if !out.contains(&c) {
                out.push(c);
            }
        }
        out.truncate(n.max(1));
        out
    }
}

/// The objectives: P99 bounds on TTFT, ITL, TPOT and end-to-end latency (ms) and a least
/// per-request decode speed (tokens/s); any may be unset.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct TuneSlo {
    pub ttft_p99_ms: Option<f64>,
    pub itl_p99_ms: Option<f64>,
    pub tpot_p99_ms: Option<f64>,
    pub e2e_p99_ms: Option<f64>,
    pub min_tps: Option<f64>,
}

impl TuneSlo {
    /// The longest a request of `output_len` tokens can take and still meet these objectives,
    /// in seconds: the E2E objective, or the TTFT objective plus the rest of the output at the
    /// ITL / TPOT bound or the `min_tps` floor (the loosest of them). `None` when the
    /// objectives bound no request's length (TTFT alone, say).
    pub fn longest_request_s(&self, output_len: usize) -> Option<f64> {
        if let Some(e2e) = self.e2e_p99_ms {
            return Some(e2e / 1e3);
        }
        let ttft = self.ttft_p99_ms? / 1e3;
        let rest = output_len.saturating_sub(1) as f64;
        let per_token = [self.itl_p99_ms, self.tpot_p99_ms]
            .into_iter()
            .flatten()
            .map(|ms| ms / 1e3)
            .chain(self.min_tps.map(|t| 1.0 / t))
            .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))))?;
        Some(ttft + rest * per_token)
    }

    /// `ttft_p99_ms=500,itl_p99_ms=100,min_tps=5`: each key once at most, positive finite
    /// numbers, at least one objective.
    pub fn parse(text: &str) -> Result<Self, SloError> {
        let mut slo = Self::default();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| {
                SloError(format!(
                    "{part:?}: expected KEY=VALUE, e.g. ttft_p99_ms=500"
                ))
            })?;
            let k = k.trim();
            let v: f64 = v
                .trim()
                .parse()
                .map_err(|_| SloError(format!("{k}: {v:?} is not a number")))?;
            if !(v.is_finite() && v > 0.0) {
                return Err(SloError(format!(
                    "{k}: the objective must be a positive number"
                )));
            }
            let slot = match k {
                "ttft_p99_ms" => &mut slo.ttft_p99_ms,
                "itl_p99_ms" => &mut slo.itl_p99_ms,
                "tpot_p99_ms" => &mut slo.tpot_p99_ms,
                "e2e_p99_ms" => &mut slo.e2e_p99_ms,
                "min_tps" => &mut slo.min_tps,
                _ => {
                    return Err(SloError(format!(
                        "{k:?}: the objectives are ttft_p99_ms, itl_p99_ms, tpot_p99_ms, e2e_p99_ms and min_tps"
                    )));
                }
            };
            if slot.replace(v).is_some() {
                return Err(SloError(format!("{k} is given twice")));
            }
        }
        if slo == Self::default() {
            return Err(SloError(
                "no objective given (e.g. ttft_p99_ms=500,itl_p99_ms=100)".into(),
            ));
        }
        Ok(slo)
    }

    /// Whether one finished request met every objective (vLLM's goodput, per request): its
    /// TTFT, the P99 of its own inter-token gaps, its TPOT and its end-to-end latency within
    /// the bounds, and its decode speed at least `min_tps`. As in vLLM, a request with one
    /// token has no TPOT (nor decode speed) and passes those.
    pub fn request_meets(&self, r: &RequestTiming) -> bool {
        let ms = |s: Option<f64>| s.map(|s| s * 1000.0);
        let gaps: Vec<f64> = r.itls().collect();
        let within = |bound: Option<f64>, v: Option<f64>, none_ok: bool| match (bound, v) {
            (None, _) => true,
            (Some(b), Some(v)) => v <= b,
            (Some(_), None) => none_ok,
        };
        r.finished
            && within(self.ttft_p99_ms, ms(r.ttft()), false)
            && within(self.e2e_p99_ms, ms(r.e2el()), false)
            && within(self.itl_p99_ms, ms(percentile(&gaps, 99.0)), true)
            && within(self.tpot_p99_ms, ms(r.tpot()), true)
            && self.min_tps.is_none_or(|m| r.tps().is_none_or(|t| t >= m))
    }
}

/// A measured run's figures: goodput (finished requests meeting every objective, per second
/// of the run), how many met them, and the run's percentiles.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Measured {
    /// Requests that finished, that met every objective, and that were refused or failed.
    pub requests: usize,
    pub good: usize,
    pub failed: usize,
    pub duration_s: f64,
    /// Good requests per second.
    pub goodput: f64,
    /// Good requests / requests sent (refused and failed ones count as missed).
    pub slo_attainment: f64,
    pub request_throughput: f64,
    pub output_tps: f64,
    pub per_request_tps_mean: Option<f64>,
    pub ttft_p99_ms: f64,
    pub itl_p99_ms: f64,
    pub tpot_p99_ms: f64,
    pub e2e_p99_ms: f64,
    /// The slow tail of per-request decode speed (P1), what `min_tps` is held against.
    pub tps_p1: Option<f64>,
    /// Requests still running at the run's deadline, cancelled. Each counts as missing its
    /// objectives (the deadline leaves a request that meets them time to finish), and in
    /// `failed`; the percentiles are of the requests that finished.
    #[serde(default)]
    pub cut: usize,
    /// The run as a whole met every objective: its P99s within the bounds, its P1 decode speed
    /// at least `min_tps`, at least one request finished, and no more than 1% of the requests
    /// sent (the share a P99 allows) were cut at the deadline.
    pub meets_slo: bool,
}

impl Measured {
    /// The figures of a load generator's run.
    pub fn of_run(r: &crate::serving::loadgen::LoadResult, slo: &TuneSlo) -> Self {
        let mut m = Self::of(&r.timings, r.refused.len() + r.cut, r.duration_s, slo);
        m.cut = r.cut;
        let sent = r.timings.len() + r.refused.len() + r.cut;
        m.meets_slo &= r.cut * 100 <= sent;
        m
    }

    /// The figures of a run's timings over `duration_s`; `refused` requests were turned away
    /// (or cut at the deadline).
    pub fn of(timings: &[RequestTiming], refused: usize, duration_s: f64, slo: &TuneSlo) -> Self {
        let s = BenchSummary::from_requests(timings, duration_s, None);
        let good = timings.iter().filter(|r| slo.request_meets(r)).count();
        let sent = timings.len() + refused;
        let tps: Vec<f64> = (timings.iter().filter(|r| r.finished))
            .filter_map(RequestTiming::tps)
            .collect();
        let tps_p1 = percentile(&tps, 1.0);
        let within = |bound: Option<f64>, v: f64| bound.is_none_or(|b| v <= b);
        let meets_slo = s.completed > 0
            && within(slo.ttft_p99_ms, s.p99_ttft_ms)
            && within(slo.itl_p99_ms, s.p99_itl_ms)
            && within(slo.tpot_p99_ms, s.p99_tpot_ms)
            && within(slo.e2e_p99_ms, s.p99_e2el_ms)
            && slo.min_tps.is_none_or(|m| tps_p1.is_none_or(|t| t >= m));
        let valid = duration_s > 0.0 && duration_s.is_finite();
        Self {
            requests: s.completed,
            good,
            failed: s.failed + refused,
            duration_s,
            goodput: if valid { good as f64 / duration_s } else { 0.0 },
            slo_attainment: if sent > 0 {
                good as f64 / sent as f64
            } else {
                0.0
            },
            request_throughput: s.request_throughput,
            output_tps: s.output_throughput,
            per_request_tps_mean: s.mean_per_request_tps,
            ttft_p99_ms: s.p99_ttft_ms,
            itl_p99_ms: s.p99_itl_ms,
            tpot_p99_ms: s.p99_tpot_ms,
            e2e_p99_ms: s.p99_e2el_ms,
            tps_p1,
            cut: 0,
            meets_slo,
        }
    }

    /// One line: goodput, how many met the objectives, whether the run did, its P99s and
    /// per-request decode speed.
    pub fn describe(&self) -> String {
        let tps = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
        format!(
            "goodput {:.2} req/s ({} of {} requests met every objective) · meets SLO: {} · P99 TTFT {:.0} ms, ITL {:.0} ms, TPOT {:.1} ms, E2E {:.0} ms · per-request TPS mean {}, P1 {}",
            self.goodput,
            self.good,
            self.requests,
            if self.meets_slo { "yes" } else { "no" },
            self.ttft_p99_ms,
            self.itl_p99_ms,
            self.tpot_p99_ms,
            self.e2e_p99_ms,
            tps(self.per_request_tps_mean),
            tps(self.tps_p1),
        ) + &if self.cut > 0 {
            format!(" · {} cut at the deadline", self.cut)
        } else {
            String::new()
        }
    }

    /// How candidates rank: goodput, then the share that met the objectives, then output
    /// throughput (so runs where nothing met them still rank by how close they came).
    pub fn score(&self) -> (f64, f64, f64) {
        (self.goodput, self.slo_attainment, self.output_tps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timing(sent: f64, gaps: &[f64]) -> RequestTiming {
        let mut t = sent;
        let token_times = gaps
            .iter()
            .map(|g| {
                t += g;
                t
            })
            .collect::<Vec<_>>();
        RequestTiming {
            sent,
            output_tokens: token_times.len(),
            token_times,
            prompt_tokens: 8,
            finished: true,
            ..RequestTiming::default()
        }
    }

    #[test]
    fn objectives_parse_and_refuse_nonsense() {
        let s = TuneSlo::parse("ttft_p99_ms=500, itl_p99_ms=100,min_tps=5").expect("ok");
        assert_eq!(s.ttft_p99_ms, Some(500.0));
        assert_eq!(s.itl_p99_ms, Some(100.0));
        assert_eq!(s.min_tps, Some(5.0));
        assert_eq!(s.e2e_p99_ms, None);
        for bad in [
            "",
            "ttft=5",
            "ttft_p99_ms",
            "ttft_p99_ms=-1",
            "ttft_p99_ms=NaN",
            "ttft_p99_ms=1,ttft_p99_ms=2",
            "itl_p99_ms=abc",
        ] {
            assert!(TuneSlo::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn goodput_counts_requests_meeting_every_objective() {
        let slo = TuneSlo::parse("ttft_p99_ms=100,itl_p99_ms=50").expect("ok");
        let fast = timing(0.0, &[0.05, 0.02, 0.02]);
        let slow_start = timing(0.0, &[0.2, 0.02, 0.02]);
        let stutter = timing(0.0, &[0.05, 0.02, 0.09]);
        let mut aborted = fast.clone();
        aborted.finished = false;
        assert!(slo.request_meets(&fast));
        assert!(!slo.request_meets(&slow_start));
        assert!(!slo.request_meets(&stutter));
        assert!(!slo.request_meets(&aborted));
        let m = Measured::of(&[fast, slow_start, stutter, aborted], 1, 2.0, &slo);
        assert_eq!((m.requests, m.good, m.failed), (3, 1, 2));
        assert_eq!(m.goodput, 0.5);
        assert_eq!(m.slo_attainment, 1.0 / 5.0);
        // The run's P99 TTFT is near the slow start's 200 ms: over the bound.
        assert!(m.ttft_p99_ms > 100.0);
        assert!(!m.meets_slo);
    }

    #[test]
    fn a_run_meets_the_objectives_when_its_percentiles_do() {
        let slo = TuneSlo::parse("ttft_p99_ms=100,tpot_p99_ms=30,min_tps=40").expect("ok");
        let runs: Vec<RequestTiming> = (0..10)
            .map(|i| timing(i as f64, &[0.05, 0.02, 0.02]))
            .collect();
        let m = Measured::of(&runs, 0, 10.0, &slo);
        assert!(m.meets_slo);
        assert_eq!(m.good, 10);
        assert!((m.tpot_p99_ms - 20.0).abs() < 1e-6);
        assert!((m.tps_p1.expect("tps") - 50.0).abs() < 1e-6);
        let strict = TuneSlo::parse("min_tps=60").expect("ok");
        assert!(!Measured::of(&runs, 0, 10.0, &strict).meets_slo);
        // Nothing finished: nothing is met.
        assert!(!Measured::of(&[], 3, 1.0, &slo).meets_slo);
    }

    #[test]
    fn requests_cut_at_the_deadline_are_missed_objectives() {
        let slo = TuneSlo::parse("ttft_p99_ms=100,tpot_p99_ms=30").expect("ok");
        let run = |n: usize, cut: usize| crate::serving::loadgen::LoadResult {
            timings: (0..n)
                .map(|i| timing(i as f64, &[0.05, 0.02, 0.02]))
                .collect(),
            duration_s: 10.0,
            cut,
            ..Default::default()
        };
        let all = Measured::of_run(&run(200, 0), &slo);
        assert!(all.meets_slo && all.cut == 0);
        // 2 cut of 200 sent: within the 1% a P99 allows; 3 of 200 is not.
        let two = Measured::of_run(&run(198, 2), &slo);
        assert!(two.meets_slo, "{}", two.describe());
        assert_eq!((two.cut, two.failed, two.good), (2, 2, 198));
        assert!((two.slo_attainment - 198.0 / 200.0).abs() < 1e-12);
        let three = Measured::of_run(&run(197, 3), &slo);
        assert!(!three.meets_slo);
        assert!(three.describe().contains("3 cut at the deadline"));
    }

    #[test]
    fn the_longest_request_follows_from_the_objectives() {
        let p = |s: &str| TuneSlo::parse(s).expect("ok");
        assert_eq!(
            p("e2e_p99_ms=3000,ttft_p99_ms=1").longest_request_s(10),
            Some(3.0)
        );
        // TTFT, then 9 more tokens at the loosest per-token bound (50 ms, or 20 tok/s).
        let l = p("ttft_p99_ms=500,itl_p99_ms=40,tpot_p99_ms=50").longest_request_s(10);
        assert!((l.expect("bound") - 0.95).abs() < 1e-9);
        let l = p("ttft_p99_ms=500,min_tps=20").longest_request_s(10);
        assert!((l.expect("bound") - 0.95).abs() < 1e-9);
        assert_eq!(p("ttft_p99_ms=500").longest_request_s(10), None);
        assert_eq!(p("itl_p99_ms=40").longest_request_s(10), None);
    }

    #[test]
    fn the_space_samples_distinct_candidates_with_the_defaults_first() {
        let space = Space::default_for(16);
        assert_eq!(space.max_num_seqs, vec![1, 2, 4, 8, 16]);
        assert_eq!(space.size(), 5 * 4 * 2 * 3 * 2);
        let first = Candidate::of_knobs(&Knobs::default());
        let c = space.sample(12, 7, &first);
        assert_eq!(c.len(), 12);
        assert_eq!(c[0], first);
        for (i, a) in c.iter().enumerate() {
            assert!(c[i + 1..].iter().all(|b| b != a), "duplicate {a:?}");
        }
        assert_eq!(
            c,
            space.sample(12, 7, &first),
            "the same seed draws the same"
        );
        // Asking for more than there are gives each once.
        let tiny = Space {
            max_num_seqs: vec![1, 2],
            max_num_batched_tokens: vec![64],
            chunked_prefill: vec![true],
            spec: vec![SpecMethod::Off],
            adaptive_budget: vec![false],
            precision: vec![None],
        };
        assert_eq!(tiny.sample(10, 0, &first).len(), 3);
    }

    #[test]
    fn a_candidate_sets_its_knobs_and_keeps_the_rest() {
        let base = Knobs::default();
        let c = Candidate {
            max_num_seqs: 4,
            max_num_batched_tokens: 128,
            chunked_prefill: false,
            spec: SpecMethod::Ngram,
            adaptive_budget: true,
            precision: None,
        };
        let k = c.knobs(&base, Some(40.0));
        assert_eq!(k.scheduler.max_num_seqs, 4);
        assert_eq!(k.scheduler.max_num_batched_tokens, 128);
        assert!(!k.scheduler.chunked_prefill && k.scheduler.adaptive_budget);
        assert_eq!(k.scheduler.itl_target_ms, 40);
        assert_eq!(k.spec.method, SpecMethod::Ngram);
        assert_eq!(k.kv, base.kv);
        assert_eq!(Candidate::of_knobs(&k), c);
        assert_eq!(
            c.label(),
            "seqs 4 · budget 128 · whole prompts · spec ngram · adaptive"
        );
    }
}

//! The tuner's loop over a live engine: each candidate's knobs applied through the engine's
//! knob message (and a re-quantization where its precision differs), a time-boxed run of the
//! load generator, its figures; successive halving over a sample of the space; then fresh
//! verification runs of the winner and of the default knobs, in the same session.

use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tpslab_kernels::WType;

use super::halving::{Plan, pareto_front, successive_halving};
use super::space::{Candidate, Measured, Space, TuneSlo};
use super::workload::Workload;
use crate::serving::engine::{EngineHandle, Knobs};
use crate::serving::loadgen::{self, LoadTarget, PromptSet};

/// A target whose knobs the tuner can set: the in-process engine.
pub trait Tunable: LoadTarget {
    /// Puts `knobs` (and the weights at `precision`) in force; returns once they are, or why
    /// they could not be.
    fn apply(&self, knobs: &Knobs, precision: WType, stop: &AtomicBool) -> Result<(), ApplyError>;
    /// The precision the weights are at now.
    fn precision(&self) -> Option<WType>;
}

/// Why knobs could not be put in force.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The engine's own error for the change (a KV pool that does not fit, a failed
    /// re-quantization).
    #[error("{0}")]
    Engine(String),
    #[error("stopped")]
    Stopped,
    #[error("the engine did not take the knobs in time")]
    Timeout,
}

/// How long a knob change or a re-quantization may take before the tuner gives up on it.
const APPLY_TIMEOUT: Duration = Duration::from_secs(300);

impl Tunable for EngineHandle {
    fn apply(&self, knobs: &Knobs, precision: WType, stop: &AtomicBool) -> Result<(), ApplyError> {
        self.set_knobs(knobs.clone());
        let requant = Tunable::precision(self) != Some(precision);
        if requant {
            self.set_precision(precision);
        }
        let sent = Instant::now();
        loop {
            let s = self.stats();
            let at = s.precision.map(|p| p.main) == Some(precision);
            if s.knobs == *knobs && s.requantizing.is_none() && at {
                return Ok(());
            }
            // Errors of this change show once the engine has taken it (the knob message clears
            // the last error first); give it a moment so an older error is not read as ours.
            if let Some(e) = s
                .last_error
                .filter(|_| sent.elapsed() > Duration::from_millis(300))
                && s.requantizing.is_none()
            {
                return Err(ApplyError::Engine(e));
            }
            if stop.load(Ordering::Relaxed) {
                return Err(ApplyError::Stopped);
            }
            if sent.elapsed() > APPLY_TIMEOUT {
                return Err(ApplyError::Timeout);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn precision(&self) -> Option<WType> {
        self.stats().precision.map(|p| p.main)
    }
}

/// A tuning session's settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneConfig {
    pub slo: TuneSlo,
    pub workload: Workload,
    /// Seconds of measured runs in all (the halving gets 70%, each verification 15%).
    pub budget_s: f64,
    /// The shortest run of the first rung.
    pub min_run_s: f64,
    pub max_candidates: usize,
    pub space: Space,
    pub seed: u64,
}

impl TuneConfig {
    /// How long a run that submits for `seconds` waits for its requests after that: the
    /// longest a request can take and meet the objectives ([`TuneSlo::longest_request_s`]),
    /// plus a second of slack, or as long again as it submitted when they bound no request's
    /// length. A request cut then has missed its objectives, so a slow candidate costs its
    /// own goodput and not the session's budget.
    pub fn drain_s(&self, seconds: f64) -> f64 {
        self.slo
            .longest_request_s(self.workload.output_len.max())
            .map_or(seconds, |s| s + 1.0)
    }
}

/// One measured run of one candidate: `K` is what the search turns (the engine's knobs, or a
/// client's concurrency against a remote server).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CandidateRun<K = Candidate> {
    /// Index in the report's `candidates`.
    pub candidate: usize,
    pub rung: usize,
    /// The run's time box (requests were sent during it).
    pub seconds: f64,
    pub knobs: K,
    pub measured: Measured,
    /// Why its knobs could not be applied (then nothing was measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A fresh run with fixed knobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verified<K = Candidate> {
    pub knobs: K,
    #[serde(flatten)]
    pub measured: Measured,
}

/// What the tuner reports as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum TuneEvent<K = Candidate> {
    Started {
        candidates: usize,
        runs: usize,
    },
    Measured(CandidateRun<K>),
    /// A verification run starts ("best" or "default").
    Verifying(&'static str),
}

/// A session's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TuneReport<K = Candidate> {
    pub slo: TuneSlo,
    pub workload: Workload,
    pub budget_s: f64,
    pub elapsed_s: f64,
    pub plan: Plan,
    /// The winner's knobs.
    pub best: K,
    /// A fresh run with the winner's knobs.
    pub verified: Measured,
    /// A fresh run with the default knobs, in the same session.
    pub default: Verified<K>,
    pub candidates: Vec<K>,
    /// Every measured rung of every candidate, in the order run.
    pub runs: Vec<CandidateRun<K>>,
    /// Candidates on the Pareto frontier of goodput against mean per-request TPS (each at its
    /// last rung), by ascending goodput.
    pub frontier: Vec<usize>,
    /// Stopped before the end (then `verified` and `default` may be empty runs).
    pub stopped: bool,
}

/// What a client controls against a remote server: how many requests it keeps in flight, and
/// under an arrival rate, the rate it sends at.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ClientKnobs {
    pub concurrency: usize,
    /// Requests per second (`None`: a closed loop).
    pub rate: Option<f64>,
}

/// The rates a client search tries around the workload's: it finds how much of the offered
/// load the server takes within the objectives.
const RATE_STEPS: [f64; 4] = [0.25, 0.5, 1.5, 2.0];

/// A setting the search turns, as one line for tables.
pub trait Knob {
    fn label(&self) -> String;
}

impl Knob for Candidate {
    fn label(&self) -> String {
        Candidate::label(self)
    }
}

impl Knob for ClientKnobs {
    fn label(&self) -> String {
        match self.rate {
            Some(r) => format!("concurrency {}, {r:.3} req/s", self.concurrency),
            None => format!("concurrency {}", self.concurrency),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TuneError {
    #[error("{0}")]
    Config(String),
    #[error(transparent)]
    Workload(#[from] crate::tune::workload::WorkloadError),
    #[error("the engine reports no weight precision yet")]
    NoPrecision,
}

/// The last rung's figures of each candidate (`None` where it never ran).
pub fn last_runs<K>(candidates: usize, runs: &[CandidateRun<K>]) -> Vec<Option<&CandidateRun<K>>> {
    let mut last = vec![None; candidates];
    for r in runs {
        if let Some(slot) = last.get_mut(r.candidate) {
            *slot = Some(r);
        }
    }
    last
}

/// The frontier of goodput against mean per-request TPS over each candidate's last rung.
pub fn frontier<K>(candidates: usize, runs: &[CandidateRun<K>]) -> Vec<usize> {
    let points: Vec<(f64, f64)> = last_runs(candidates, runs)
        .into_iter()
        .map(|r| match r.filter(|r| r.error.is_none()) {
            Some(r) => (
                r.measured.goodput,
                r.measured.per_request_tps_mean.unwrap_or(f64::NAN),
            ),
            None => (f64::NAN, f64::NAN),
        })
        .collect();
    pareto_front(&points)
}

/// Checks what every search needs.
fn check(cfg: &TuneConfig) -> Result<(), TuneError> {
    cfg.workload.check()?;
    if !(cfg.budget_s.is_finite() && cfg.budget_s > 0.0) {
        return Err(TuneError::Config(
            "the budget must be a positive number of seconds".into(),
        ));
    }
    if !(cfg.min_run_s.is_finite() && cfg.min_run_s > 0.0) {
        return Err(TuneError::Config(
            "the shortest run must be a positive number of seconds".into(),
        ));
    }
    Ok(())
}

/// How many candidates the budget lets the halving start with (at most `max`).
fn start_count(cfg: &TuneConfig, max: usize) -> usize {
    Plan::for_budget(cfg.budget_s * 0.7, cfg.min_run_s, max.max(1)).rungs[0].candidates
}

/// The search both tuners share: successive halving over `candidates` with 70% of the budget,
/// then fresh runs of the winner and of `default` (15% each). `measure(k, seconds)` runs
/// candidate `k` for a time box of `seconds`.
fn search<K: Clone>(
    candidates: Vec<K>,
    default: K,
    cfg: &TuneConfig,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(TuneEvent<K>),
    measure: &mut dyn FnMut(&K, f64) -> Result<Measured, String>,
) -> TuneReport<K> {
    let started = Instant::now();
    let verify_s = (cfg.budget_s * 0.15).max(cfg.min_run_s.min(cfg.budget_s));
    let plan = Plan::with(candidates.len(), cfg.budget_s * 0.7);
    progress(TuneEvent::Started {
        candidates: candidates.len(),
        runs: plan.runs(),
    });
    let empty = || Measured::of(&[], 0, 0.0, &cfg.slo);
    let mut runs: Vec<CandidateRun<K>> = Vec::new();
    let halving = successive_halving(candidates.len(), &plan, &mut |i, rung, seconds| {
        if stop.load(Ordering::Relaxed) {
            return None;
        }
        let (measured, error) = match measure(&candidates[i], seconds) {
            Ok(m) => (m, None),
            Err(e) => (empty(), Some(e)),
        };
        // A candidate whose knobs failed ranks last.
        let score = match error {
            None => measured.score(),
            Some(_) => (f64::NEG_INFINITY, 0.0, 0.0),
        };
        let run = CandidateRun {
            candidate: i,
            rung,
            seconds,
            knobs: candidates[i].clone(),
            measured,
            error,
        };
        progress(TuneEvent::Measured(run.clone()));
        runs.push(run);
        Some(score)
    });
    let best = candidates[halving.winner.unwrap_or(0)].clone();
    let mut verify = |label: &'static str, k: &K| {
        progress(TuneEvent::Verifying(label));
        measure(k, verify_s).unwrap_or_else(|_| empty())
    };
    let verified = verify("best", &best);
    let default_run = verify("default", &default);
    TuneReport {
        slo: cfg.slo,
        workload: cfg.workload.clone(),
        budget_s: cfg.budget_s,
        elapsed_s: started.elapsed().as_secs_f64(),
        frontier: frontier(candidates.len(), &runs),
        plan,
        best,
        verified,
        default: Verified {
            knobs: default,
            measured: default_run,
        },
        candidates,
        runs,
        stopped: halving.stopped || stop.load(Ordering::Relaxed),
    }
}

/// The tuner over the in-process engine: `base` is the engine's knobs now (what the
/// candidates change, and the default they are compared with), at the precision it runs now.
/// The engine is left on the default knobs (verified last). `stop` ends it early.
pub fn tune(
    target: &dyn Tunable,
    prompts: &PromptSet,
    base: &Knobs,
    cfg: &TuneConfig,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(TuneEvent),
) -> Result<TuneReport, TuneError> {
    check(cfg)?;
    let loaded = target.precision().ok_or(TuneError::NoPrecision)?;
    let parse = |p: &Option<String>| -> Result<WType, TuneError> {
        p.as_deref().map_or(Ok(loaded), |name| {
            name.parse()
                .map_err(|e| TuneError::Config(format!("precision {name}: {e}")))
        })
    };
    for p in &cfg.space.precision {
        parse(p)?;
    }
    let default = Candidate::of_knobs(base);
    let n = start_count(cfg, cfg.max_candidates);
    let candidates = cfg.space.sample(n, cfg.seed, &default);
    let itl_target = cfg.slo.itl_p99_ms.or(cfg.slo.tpot_p99_ms);
    let mut seed = cfg.seed.wrapping_mul(1000);
    let mut measure = |c: &Candidate, seconds: f64| -> Result<Measured, String> {
        let knobs = c.knobs(base, itl_target);
        target
            .apply(
                &knobs,
                parse(&c.precision).map_err(|e| e.to_string())?,
                stop,
            )
            .map_err(|e| e.to_string())?;
        seed += 1;
        let spec = cfg.workload.load_spec(seconds, cfg.drain_s(seconds), seed);
        let r = loadgen::run(&target, prompts, &spec, stop, &mut |_, _| {});
        Ok(Measured::of_run(&r, &cfg.slo))
    };
    Ok(search(
        candidates,
        default,
        cfg,
        stop,
        progress,
        &mut measure,
    ))
}

/// The tuner against a server it does not control (a remote endpoint): only what a client
/// sets is searched, the most requests it keeps in flight (1, 2, 4, ... up to twice the
/// workload's concurrency, or 256 under a rate alone) and, under an arrival rate, the rate
/// (a quarter of it to twice it: how much of that load the server takes within the
/// objectives); the default is the workload's own.
pub fn tune_client(
    target: &dyn LoadTarget,
    prompts: &PromptSet,
    cfg: &TuneConfig,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(TuneEvent<ClientKnobs>),
) -> Result<TuneReport<ClientKnobs>, TuneError> {
    check(cfg)?;
    let top = cfg
        .workload
        .concurrency
        .map_or(256, |c| c.saturating_mul(2))
        .max(1);
    let rate = cfg.workload.rate;
    let default = ClientKnobs {
        concurrency: cfg.workload.concurrency.unwrap_or(top),
        rate,
    };
    let levels =
        std::iter::successors(Some(1usize), |c| c.checked_mul(2)).take_while(|&c| c <= top);
    let mut candidates = vec![default];
    // Under a rate, the rate first (at the default cap), then the caps at the workload's rate.
    if let Some(r) = rate {
        candidates.extend(RATE_STEPS.iter().map(|f| ClientKnobs {
            rate: Some(r * f),
            ..default
        }));
    }
    candidates.extend(
        levels
            .filter(|&c| c != default.concurrency)
            .map(|concurrency| ClientKnobs { concurrency, rate }),
    );
    candidates.truncate(start_count(cfg, cfg.max_candidates.min(candidates.len())));
    let mut seed = cfg.seed.wrapping_mul(1000);
    let mut measure = |k: &ClientKnobs, seconds: f64| -> Result<Measured, String> {
        seed += 1;
        let w = Workload {
            concurrency: Some(k.concurrency),
            rate: k.rate,
            ..cfg.workload.clone()
        };
        let r = loadgen::run(
            target,
            prompts,
            &w.load_spec(seconds, cfg.drain_s(seconds), seed),
            stop,
            &mut |_, _| {},
        );
        Ok(Measured::of_run(&r, &cfg.slo))
    };
    Ok(search(
        candidates,
        default,
        cfg,
        stop,
        progress,
        &mut measure,
    ))
}

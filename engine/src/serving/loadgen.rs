//! Load generator: drives an engine with many requests at a fixed concurrency or with Poisson
//! arrivals at a rate, with exact prompt and output lengths (end-of-sequence ignored), and
//! times every token on the client side as vLLM's benchmark does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::sched::stop::{FinishReason, StopCriteria};
use crate::sched::{ClientId, RequestId};
use crate::serving::constraint::Constraint;
use crate::serving::engine::{EngineHandle, Event, Request, Usage};
use crate::serving::metrics::{FinishKind, LiveCounters, LiveMetrics, RequestTiming};
use crate::serving::sampler::SamplingParams;

/// The bundled prompt text requests are cut from.
pub const PROMPT_TEXT: &str = include_str!("../../../assets/prompts/bench.txt");

/// A length: fixed, drawn uniformly from a range (inclusive), or drawn uniformly from a list of
/// lengths seen (a recorded trace's: its empirical distribution).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum LenDist {
    Fixed(usize),
    Uniform { min: usize, max: usize },
    Samples(Vec<usize>),
}

impl LenDist {
    /// One length drawn with `rng`.
    pub fn draw(&self, rng: &mut StdRng) -> usize {
        match self {
            LenDist::Fixed(n) => *n,
            LenDist::Uniform { min, max } => rng.random_range(*min.min(max)..=*max.max(min)),
            LenDist::Samples(v) if v.is_empty() => 1,
            LenDist::Samples(v) => v[rng.random_range(0..v.len())],
        }
    }

    pub fn max(&self) -> usize {
        match self {
            LenDist::Fixed(n) => *n,
            LenDist::Uniform { min, max } => *min.max(max),
            LenDist::Samples(v) => v.iter().copied().max().unwrap_or(1),
        }
    }

    pub fn min(&self) -> usize {
        match self {
            LenDist::Fixed(n) => *n,
            LenDist::Uniform { min, max } => *min.min(max),
            LenDist::Samples(v) => v.iter().copied().min().unwrap_or(1),
        }
    }

    pub fn mean(&self) -> f64 {
        match self {
            LenDist::Fixed(n) => *n as f64,
            LenDist::Uniform { min, max } => (min + max) as f64 / 2.0,
            LenDist::Samples(v) if v.is_empty() => 1.0,
            LenDist::Samples(v) => v.iter().sum::<usize>() as f64 / v.len() as f64,
        }
    }
}

impl std::fmt::Display for LenDist {
    /// "128", "64-512", "12-900, mean 210, of 350 recorded".
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LenDist::Fixed(n) => write!(f, "{n}"),
            LenDist::Uniform { .. } => write!(f, "{}-{}", self.min(), self.max()),
            LenDist::Samples(v) => write!(
                f,
                "{}-{}, mean {:.0}, of {} recorded",
                self.min(),
                self.max(),
                self.mean(),
                v.len()
            ),
        }
    }
}

/// How to load the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadSpec {
    /// Most requests in flight at once (`None` = no cap; then `rate` must be set).
    pub concurrency: Option<usize>,
    /// Poisson arrivals at this many requests per second (`None` = all at once, capped by
    /// `concurrency`).
    pub rate: Option<f64>,
    pub num_requests: usize,
    pub prompt_len: LenDist,
    pub output_len: LenDist,
    pub seed: u64,
    /// Every request's scheduling priority (lower runs first under `Policy::Priority`).
    pub priority: i32,
    /// A time-boxed run: requests are submitted only during the first this many seconds (at
    /// most `num_requests` of them), then the run ends once those in flight have finished
    /// (none is cut off, so a slow tail is measured, not dropped). `None`: no time box.
    #[serde(default)]
    pub submit_for_s: Option<f64>,
    /// A deadline for the whole run: requests still in flight this many seconds after it
    /// started are cancelled and counted in [`LoadResult::cut`] (a tuner's slow candidate
    /// cannot hold the session past its budget). `None`: every request runs to its end.
    #[serde(default)]
    pub cut_after_s: Option<f64>,
    /// Sampling temperature of every request: 0 is greedy; above it each request samples with
    /// its own seed (the run's seed plus its number), so runs repeat.
    #[serde(default)]
    pub temperature: f32,
}

impl LoadSpec {
    /// `n` requests of `prompt_len` tokens in and `output_len` out, all submitted at once: a
    /// closed loop of `n`, as `tpslab bench` and the planner's calibration measure.
    pub fn all_at_once(n: usize, prompt_len: usize, output_len: usize, seed: u64) -> Self {
        Self {
            concurrency: Some(n),
            rate: None,
            num_requests: n,
            prompt_len: LenDist::Fixed(prompt_len),
            output_len: LenDist::Fixed(output_len),
            seed,
            priority: 0,
            submit_for_s: None,
            cut_after_s: None,
            temperature: 0.0,
        }
    }
}

/// Token ids cut from the bundled text, so prompts are real language of an exact length.
#[derive(Debug, Clone)]
pub struct PromptSet {
    tokens: Vec<u32>,
    /// Copy-heavy prompts: a passage, then the passage again up to the prompt's length, so the
    /// natural continuation repeats text already in the prompt (editing or quoting work, where
    /// prompt lookup pays).
    copy: bool,
}

impl PromptSet {
    pub fn new(tokens: Vec<u32>) -> Option<Self> {
        (!tokens.is_empty()).then_some(Self {
            tokens,
            copy: false,
        })
    }

    /// The same text, cut into copy-heavy prompts (see `copy`).
    pub fn copying(self) -> Self {
        Self { copy: true, ..self }
    }

    /// Prompt `i` of length `len`: a window of the text starting at an offset that differs per
    /// request, so prompts don't share prefixes (no accidental prefix-cache hits). Copy-heavy:
    /// a window of `len / 2 + 1` tokens, then its start again up to `len`.
    pub fn prompt(&self, i: usize, len: usize) -> Vec<u32> {
        let start = (i * 97) % self.tokens.len();
        let window = if self.copy { len / 2 + 1 } else { len };
        let text: Vec<u32> = self
            .tokens
            .iter()
            .copied()
            .cycle()
            .skip(start)
            .take(window)
            .collect();
        text.iter().copied().cycle().take(len).collect()
    }
}

/// Everything measured in one load run.
#[derive(Debug, Clone, Default)]
pub struct LoadResult {
    pub timings: Vec<RequestTiming>,
    pub duration_s: f64,
    pub refused: Vec<String>,
    pub aborted: usize,
    /// Requests still in flight at the run's deadline (`LoadSpec::cut_after_s`), cancelled.
    pub cut: usize,
}

struct InFlight {
    timing: RequestTiming,
}

/// What a load run drives: the in-process engine, or a remote server through its API (the app's
/// `remote` client). Events come back on the request's channel in the engine's order (`Started`,
/// `Token`s, then `Finished` or `Refused`); a remote target may send one `Token` per streamed
/// chunk and give the true counts in `Finished`'s usage, which the run then takes.
pub trait LoadTarget {
    fn submit(&self, req: Request, events: mpsc::Sender<Event>) -> RequestId;
    fn cancel(&self, id: RequestId);
    /// What the engine behind the target counted since it started (`None` where the target
    /// cannot see its engine, as a remote server).
    fn counters(&self) -> Option<LiveCounters> {
        None
    }
}

impl LoadTarget for EngineHandle {
    fn submit(&self, req: Request, events: mpsc::Sender<Event>) -> RequestId {
        EngineHandle::submit(self, req, events)
    }
    fn cancel(&self, id: RequestId) {
        EngineHandle::cancel(self, id);
    }
    fn counters(&self) -> Option<LiveCounters> {
        Some(self.stats().live.counters)
    }
}

impl<T: LoadTarget + ?Sized> LoadTarget for &T {
    fn submit(&self, req: Request, events: mpsc::Sender<Event>) -> RequestId {
        (**self).submit(req, events)
    }
    fn cancel(&self, id: RequestId) {
        (**self).cancel(id);
    }
    fn counters(&self) -> Option<LiveCounters> {
        (**self).counters()
    }
}

/// A load target whose every request is constrained to one grammar (each request runs its own
/// copy): what `tpslab bench --json-schema` measures structured output's cost with.
pub struct ConstrainedTarget<T> {
    pub inner: T,
    pub constraint: Constraint,
}

impl<T: LoadTarget> LoadTarget for ConstrainedTarget<T> {
    fn submit(&self, mut req: Request, events: mpsc::Sender<Event>) -> RequestId {
        req.constraint = Some(self.constraint.clone());
        self.inner.submit(req, events)
    }
    fn cancel(&self, id: RequestId) {
        self.inner.cancel(id);
    }
    fn counters(&self) -> Option<LiveCounters> {
        self.inner.counters()
    }
}

/// Runs `spec` against `engine` until every request has ended or `stop` is set (then the
/// requests still in flight are cancelled). `progress(done, total)` is called as requests end.
pub fn run(
    engine: &dyn LoadTarget,
    prompts: &PromptSet,
    spec: &LoadSpec,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(usize, usize),
) -> LoadResult {
    run_observed(engine, prompts, spec, stop, progress, None)
}

/// [`run`], also feeding `live` as the requests arrive, stream and end: the live figures of a
/// target that publishes none itself (a remote server), measured on this side.
/// A finished request into the result: counted if aborted, else its timing, with the token
/// counts of its usage (a remote stream may carry several tokens in one chunk).
fn record_finish(
    result: &mut LoadResult,
    mut timing: RequestTiming,
    reason: FinishReason,
    usage: &Usage,
) {
    if reason == FinishReason::Abort {
        result.aborted += 1;
        return;
    }
    timing.finished = true;
    if usage.completion_tokens > 0 {
        timing.output_tokens = usage.completion_tokens;
    }
    if usage.prompt_tokens > 0 {
        timing.prompt_tokens = usage.prompt_tokens;
    }
    timing.spec = usage.spec;
    result.timings.push(timing);
}

/// Request number `i` of a run: lengths drawn from the spec, greedy (or sampled at the spec's
/// temperature), end-of-sequence ignored.
/// Returns it with its prompt and output lengths.
fn next_request(
    prompts: &PromptSet,
    spec: &LoadSpec,
    rng: &mut StdRng,
    i: usize,
) -> (Request, usize, usize) {
    let plen = spec.prompt_len.draw(rng).max(1);
    let olen = spec.output_len.draw(rng).max(1);
    let req = Request {
        // Runs of another seed (the levels of a sweep) get other prompts, so a server that
        // keeps its prefix cache across runs finds nothing from the last one.
        prompt: prompts.prompt(i + spec.seed as usize * spec.num_requests, plen),
        sampling: if spec.temperature > 0.0 {
            SamplingParams {
                temperature: spec.temperature,
                seed: Some(spec.seed.wrapping_mul(1_000_003).wrapping_add(i as u64)),
                ..SamplingParams::default()
            }
        } else {
            SamplingParams::greedy()
        },
        stop: StopCriteria {
            max_tokens: Some(olen),
            ignore_eos: true,
            ..StopCriteria::default()
        },
        priority: spec.priority,
        client: ClientId::LOCAL,
        constraint: None,
        logprobs: None,
        prompt_logprobs: None,
        embed: None,
    };
    (req, plen, olen)
}

impl InFlight {
    /// A request sent at `sent` with a prompt of `plen` tokens, to generate `olen`.
    fn sent(sent: f64, plen: usize, olen: usize) -> Self {
        Self {
            timing: RequestTiming {
                sent,
                token_times: Vec::with_capacity(olen),
                prompt_tokens: plen,
                ..RequestTiming::default()
            },
        }
    }
}

/// Cancels every request in flight, tells `aborted` of each, forgets them all, and says how many.
fn cut_in_flight(
    engine: &dyn LoadTarget,
    flying: &mut HashMap<RequestId, InFlight>,
    mut aborted: impl FnMut(RequestId),
) -> usize {
    for id in flying.keys() {
        engine.cancel(*id);
        aborted(*id);
    }
    let n = flying.len();
    flying.clear();
    n
}

pub fn run_observed(
    engine: &dyn LoadTarget,
    prompts: &PromptSet,
    spec: &LoadSpec,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(usize, usize),
    live: Option<&Mutex<LiveMetrics>>,
) -> LoadResult {
    let observe = |f: &mut dyn FnMut(&mut LiveMetrics)| {
        if let Some(m) = live
            && let Ok(mut m) = m.lock()
        {
            f(&mut m);
        }
    };
    let (tx, rx) = mpsc::channel();
    let mut rng = StdRng::seed_from_u64(spec.seed);
    let origin = Instant::now();
    let now = || origin.elapsed().as_secs_f64();
    let cap = spec.concurrency.unwrap_or(usize::MAX).max(1);
    let mut next_arrival = 0.0f64;
    let mut submitted = 0usize;
    let mut done = 0usize;
    let mut flying: HashMap<RequestId, InFlight> = HashMap::new();
    let mut result = LoadResult::default();
    let mut cancelled = false;
    // Whether requests may still be submitted at `t` (the time box and the deadline, if any).
    let past_deadline = |t: f64| spec.cut_after_s.is_some_and(|d| t >= d);
    let open = |t: f64| spec.submit_for_s.is_none_or(|d| t < d) && !past_deadline(t);
    while done < spec.num_requests {
        if past_deadline(now()) && !flying.is_empty() {
            // The deadline: what is still running is cut, and its later events are ignored.
            let cut = cut_in_flight(engine, &mut flying, |id| {
                observe(&mut |m| m.on_finish(id, now(), FinishKind::Aborted))
            });
            result.cut += cut;
            done += cut;
            progress(done, spec.num_requests);
        }
        if stop.load(Ordering::Relaxed) && !cancelled {
            cancelled = true;
            flying.keys().for_each(|id| engine.cancel(*id));
        }
        // Submit whatever is due.
        while !cancelled
            && submitted < spec.num_requests
            && flying.len() < cap
            && now() >= next_arrival
            && open(now())
        {
            let (req, plen, olen) = next_request(prompts, spec, &mut rng, submitted);
            let sent = now();
            let id = engine.submit(req, tx.clone());
            observe(&mut |m| m.on_arrival(id, sent, plen));
            flying.insert(id, InFlight::sent(sent, plen, olen));
            submitted += 1;
            if let Some(rate) = spec.rate.filter(|r| *r > 0.0) {
                // Exponential gaps: a Poisson process at `rate` requests per second.
                let u: f64 = rng.random_range(f64::EPSILON..1.0);
                next_arrival += -u.ln() / rate;
            }
        }
        if (cancelled || !open(now())) && flying.is_empty() {
            break;
        }
        let wait =
            if submitted < spec.num_requests && flying.len() < cap && !cancelled && open(now()) {
                Duration::from_secs_f64((next_arrival - now()).clamp(0.0, 0.05))
            } else {
                let to_deadline = spec.cut_after_s.map_or(0.05, |d| d - now());
                Duration::from_secs_f64(to_deadline.clamp(0.0, 0.05))
            };
        let Ok(ev) = rx.recv_timeout(wait) else {
            continue;
        };
        let t = now();
        for ev in std::iter::once(ev).chain(rx.try_iter()) {
            let id = ev.id();
            match ev {
                Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
                Event::Token { .. } => {
                    if let Some(f) = flying.get_mut(&id) {
                        f.timing.token_times.push(t);
                        f.timing.output_tokens += 1;
                        observe(&mut |m| m.on_token(id, t));
                    }
                }
                Event::Finished { reason, usage, .. } => {
                    if let Some(f) = flying.remove(&id) {
                        done += 1;
                        let kind = match reason {
                            FinishReason::Abort => FinishKind::Aborted,
                            _ => FinishKind::Finished,
                        };
                        observe(&mut |m| m.on_finish(id, t, kind));
                        record_finish(&mut result, f.timing, reason, &usage);
                        progress(done, spec.num_requests);
                    }
                }
                Event::Refused { reason, .. } => {
                    if flying.remove(&id).is_some() {
                        done += 1;
                        observe(&mut |m| m.on_refused(t));
                        result.refused.push(reason.to_string());
                        progress(done, spec.num_requests);
                    }
                }
            }
        }
    }
    result.duration_s = now();
    result
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A target that records each prompt and ends each request at once with one token.
    struct Recorder(Mutex<Vec<Vec<u32>>>);

    impl LoadTarget for Recorder {
        fn submit(&self, req: Request, events: mpsc::Sender<Event>) -> RequestId {
            let mut seen = self.0.lock().expect("lock");
            seen.push(req.prompt);
            let id = seen.len() as RequestId;
            let _ = events.send(Event::Started { id });
            let _ = events.send(Event::Token {
                id,
                token: 1,
                text: String::new(),
                logprob: None,
            });
            let _ = events.send(Event::Finished {
                id,
                reason: FinishReason::Length,
                usage: Usage::default(),
                text: String::new(),
                queue_time: Duration::ZERO,
            });
            id
        }
        fn cancel(&self, _: RequestId) {}
    }

    #[test]
    fn runs_of_other_seeds_send_other_prompts() {
        let prompts = PromptSet::new((0..5000).collect()).expect("tokens");
        let spec = |seed| LoadSpec {
            concurrency: Some(2),
            rate: None,
            num_requests: 4,
            prompt_len: LenDist::Fixed(16),
            output_len: LenDist::Fixed(1),
            seed,
            priority: 0,
            submit_for_s: None,
            cut_after_s: None,
            temperature: 0.0,
        };
        let target = Recorder(Mutex::new(Vec::new()));
        for seed in [0, 1, 0] {
            let r = run(
                &target,
                &prompts,
                &spec(seed),
                &AtomicBool::new(false),
                &mut |_, _| {},
            );
            assert_eq!(r.timings.len(), 4);
        }
        let seen = target.0.lock().expect("lock");
        let (a, b, again) = (&seen[0..4], &seen[4..8], &seen[8..12]);
        assert!(a.iter().all(|p| p.len() == 16));
        assert!(
            a.iter().all(|p| !b.contains(p)),
            "seed 1 repeated a prompt of seed 0"
        );
        assert_eq!(a, again, "the same seed sends the same prompts");
    }

    /// A target whose requests never end; it records what was cancelled.
    #[derive(Default)]
    struct Stuck {
        sent: Mutex<usize>,
        cancelled: Mutex<Vec<RequestId>>,
    }

    impl LoadTarget for Stuck {
        fn submit(&self, _: Request, events: mpsc::Sender<Event>) -> RequestId {
            let mut n = self.sent.lock().expect("lock");
            *n += 1;
            let id = *n as RequestId;
            let _ = events.send(Event::Started { id });
            id
        }
        fn cancel(&self, id: RequestId) {
            self.cancelled.lock().expect("lock").push(id);
        }
    }

    #[test]
    fn the_deadline_cuts_what_is_still_running() {
        let prompts = PromptSet::new((0..5000).collect()).expect("tokens");
        let spec = LoadSpec {
            concurrency: Some(3),
            rate: None,
            num_requests: 1 << 20,
            prompt_len: LenDist::Fixed(8),
            output_len: LenDist::Fixed(4),
            seed: 0,
            priority: 0,
            submit_for_s: Some(0.05),
            cut_after_s: Some(0.2),
            temperature: 0.0,
        };
        let target = Stuck::default();
        let r = run(
            &target,
            &prompts,
            &spec,
            &AtomicBool::new(false),
            &mut |_, _| {},
        );
        // Without the deadline this run would never end: nothing finishes.
        assert_eq!(r.cut, 3, "the three in flight are cut");
        assert!(r.timings.is_empty() && r.refused.is_empty());
        let mut cancelled = target.cancelled.lock().expect("lock").clone();
        cancelled.sort_unstable();
        assert_eq!(cancelled, [1, 2, 3]);
        assert_eq!(*target.sent.lock().expect("lock"), 3);
    }
}

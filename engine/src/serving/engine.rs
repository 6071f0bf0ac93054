//! The engine thread and its handle: continuous batching of many requests over one model.
//!
//! The thread owns every piece of mutable engine state (model workspace, KV cache, scheduler,
//! per-request samplers and detokenizers, metrics). Everything else talks to it by message:
//! requests, cancels and knob changes in; events on each request's own channel, and a stats
//! snapshot, out. One step = one `schedule()`, ONE batched forward for every scheduled token of
//! every request, sampling, `update()`, stop checks, events.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tpslab_kernels::WType;

use serde::{Deserialize, Serialize};

use crate::device::{Backend, DeviceChoice, MemoryUse};
use crate::model::LoadedModel;
use crate::model::pooling::{Pooled, Pooling};
use crate::model::precision::Precision;
use crate::sched::stop::{FinishReason, StopChecker};
use crate::sched::{RequestId, SchedRequest, Scheduler, SchedulerConfig};
use crate::serving::admission::Admission;
use crate::serving::constraint::ConstraintRun;
use crate::serving::logprobs::{MAX_TOP_LOGPROBS, TokenLogprob};
use crate::serving::metrics::{
    FinishKind, LiveConfig, LiveMetrics, LiveSnapshot, process_rss_bytes,
};
use crate::serving::requant::{RequantError, RequantReport};
use crate::serving::sampler::Sampler;
use crate::serving::spec_metrics::SpecUsage;
use crate::spec::payoff::Acceptance;
use crate::spec::{SpecConfig, SpecPause};
use crate::text::detok::Detokenizer;
use crate::text::reasoning::ReasoningTags;

pub use crate::serving::request::{DecodeBatch, Event, Refusal, RefusalKind, Request, Usage};

pub use crate::kv::KvSettings;

/// Every knob the user can turn while the engine runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Knobs {
    pub scheduler: SchedulerConfig,
    pub kv: KvSettings,
    /// Speculative decoding: method, proposed tokens, the policy that pauses it.
    pub spec: SpecConfig,
}

enum Command {
    Submit {
        id: RequestId,
        req: Request,
        events: Sender<Event>,
    },
    Cancel(RequestId),
    SetKnobs(Knobs),
    /// Re-quantize the weights to this type on a worker; the engine serves on meanwhile.
    SetPrecision(WType),
    /// The worker's result: the model at the new precision, swapped in between two steps.
    /// Boxed: a whole model is far larger than the other commands.
    PrecisionReady(Box<Result<(LoadedModel, RequantReport), RequantError>>),
    ResetMetrics,
    /// The draft model of [`SpecMethod::Draft`](crate::spec::SpecMethod::Draft) from now on.
    SetDraft(Option<Arc<LoadedModel>>),
    Shutdown,
}

/// Engine-wide settings fixed at start.
#[derive(Debug, Clone, Default)]
pub struct EngineConfig {
    /// Compute threads (0 = one per core).
    pub threads: usize,
    pub knobs: Knobs,
    /// Where the model runs.
    pub device: DeviceChoice,
    /// On a GPU, when above 0: the KV budget is this fraction of the memory left free after the
    /// weights (vLLM's `gpu_memory_utilization` in spirit), instead of `knobs.kv.budget_bytes`.
    pub gpu_kv_fraction: f32,
    /// On a GPU: the experts of the first this many blocks stay in host memory and run on the
    /// CPU (llama.cpp's `--n-cpu-moe`), for a mixture of experts larger than the GPU's memory.
    pub cpu_moe_layers: usize,
    /// The draft model `knobs.spec`'s [`SpecMethod::Draft`](crate::spec::SpecMethod::Draft)
    /// proposes with; it must share the model's tokenizer.
    pub draft: Option<Arc<LoadedModel>>,
}

/// How often the stats snapshot is refreshed while the engine is busy.
const PUBLISH_EVERY: Duration = Duration::from_millis(50);

/// Called after every step that produced events (the UI passes `ctx.request_repaint`).
pub type Notify = Box<dyn Fn() + Send>;

/// The handle: cheap to clone, usable from any thread. Dropping the last one stops the engine.
#[derive(Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
    snapshot: Arc<Mutex<EngineSnapshot>>,
    _guard: Arc<ShutdownGuard>,
}

struct ShutdownGuard {
    tx: Sender<Command>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Drop for ShutdownGuard {
    fn drop(&mut self) {
        let _ = self.tx.send(Command::Shutdown);
        if let Some(t) = self.thread.lock().ok().and_then(|mut t| t.take()) {
            let _ = t.join();
        }
    }
}

/// What the engine publishes after every step for anyone to read without waiting on it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct EngineSnapshot {
    pub live: LiveSnapshot,
    pub knobs: Knobs,
    pub threads: usize,
    pub kv_bytes: usize,
    pub weights_bytes: usize,
    /// The device running the model ("CPU, 2 threads", "CUDA cuda:0 NVIDIA H200").
    pub device: String,
    /// Why the engine is on the CPU when a GPU was asked for with `auto`.
    pub device_note: Option<String>,
    /// Weights, KV pool, activations and device memory (on a GPU).
    pub memory: MemoryUse,
    pub steps: u64,
    /// Scheduler state now (not as of the last step): requests and KV blocks.
    pub running: usize,
    pub waiting: usize,
    pub kv_used_blocks: usize,
    pub kv_total_blocks: usize,
    /// Weight precision of the model being served ("Q4_1"; the live knob changes it); `None`
    /// before the engine's first report.
    pub precision: Option<Precision>,
    /// Set while the weights are being re-quantized to this type.
    #[serde(serialize_with = "crate::model::precision::serialize_type")]
    pub requantizing: Option<WType>,
    /// The last precision change: from, to, weight bytes before and after, seconds taken.
    pub last_requant: Option<(Precision, Precision, usize, usize, f64)>,
    /// Prefix-cache lookups and hits in tokens since the scheduler was built (vLLM's
    /// `prefix_cache_queries` / `prefix_cache_hits`); a KV pool rebuild starts them again.
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Set when a knob change could not be applied.
    pub last_error: Option<String>,
    /// Why speculative decoding is not proposing now (`None` while it runs).
    pub spec_pause: Option<SpecPause>,
    /// Times the speculation policy turned proposals on or off.
    pub spec_switches: u64,
    /// The draft model's file, when one is set (used by the draft-model method).
    pub spec_draft: Option<PathBuf>,
}

impl EngineHandle {
    /// Starts the engine thread over a loaded model.
    pub fn start(
        model: Arc<LoadedModel>,
        config: EngineConfig,
        notify: Option<Notify>,
    ) -> Result<Self, EngineError> {
        let (tx, rx) = mpsc::channel();
        let snapshot = Arc::new(Mutex::new(EngineSnapshot::default()));
        let mut state = EngineThread::new(
            model,
            &config,
            rx,
            tx.clone(),
            Arc::clone(&snapshot),
            notify,
        )?;
        // The first snapshot (device, memory, pool) is there before `start` returns.
        state.publish();
        let thread = std::thread::Builder::new()
            .name("tpslab-engine".into())
            .spawn(move || state.run())
            .map_err(|e| EngineError::Start(e.to_string()))?;
        let guard = ShutdownGuard {
            tx: tx.clone(),
            thread: Mutex::new(Some(thread)),
        };
        Ok(Self {
            tx,
            next_id: Arc::new(AtomicU64::new(1)),
            snapshot,
            _guard: Arc::new(guard),
        })
    }

    /// Queues a request; its events arrive on `events`. Returns the request id at once; a
    /// refusal (see [`crate::serving::admission`]: queue full, prompt too long, ...) arrives as
    /// `Event::Refused`.
    pub fn submit(&self, req: Request, events: Sender<Event>) -> RequestId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if let Err(mpsc::SendError(Command::Submit { events, .. })) =
            self.tx.send(Command::Submit { id, req, events })
        {
            let _ = events.send(Event::Refused {
                id,
                reason: Refusal::Stopped,
            });
        }
        id
    }

    /// Cancels a request (ends with `FinishReason::Abort` and frees its KV blocks at once).
    pub fn cancel(&self, id: RequestId) {
        let _ = self.tx.send(Command::Cancel(id));
    }

    /// Applies new knobs from the next step on (a KV change rebuilds the pool).
    pub fn set_knobs(&self, knobs: Knobs) {
        let _ = self.tx.send(Command::SetKnobs(knobs));
    }

    /// Switches the weight precision: the weights are re-quantized in memory on a worker (from
    /// the model file when there is one) while requests keep running on the old ones; then the
    /// new weights are swapped in between two steps and the requests in flight are recomputed on
    /// them (nothing is lost). `stats().requantizing` is set meanwhile, `precision` after; a
    /// failure lands in `stats().last_error` and the old weights stay.
    pub fn set_precision(&self, ty: WType) {
        let _ = self.tx.send(Command::SetPrecision(ty));
    }

    pub fn reset_metrics(&self) {
        let _ = self.tx.send(Command::ResetMetrics);
    }

    /// The draft model that the draft-model method proposes with, from the next step on (a model
    /// loaded on a worker: the engine never reads a file). One with another vocabulary is
    /// refused: `stats().last_error` says why and the previous one stays; `stats().spec_draft`
    /// names the one in use.
    pub fn set_draft(&self, draft: Option<Arc<LoadedModel>>) {
        let _ = self.tx.send(Command::SetDraft(draft));
    }

    /// Whether `other` is a handle of the same engine thread.
    pub fn same_engine(&self, other: &EngineHandle) -> bool {
        Arc::ptr_eq(&self._guard, &other._guard)
    }

    /// The latest published stats (never waits on the engine's step).
    pub fn stats(&self) -> EngineSnapshot {
        self.snapshot.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot start the engine thread: {0}")]
    Start(String),
    #[error("KV cache: {0}")]
    Kv(String),
    #[error(transparent)]
    Device(#[from] crate::device::BackendError),
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// Per-request state the engine keeps besides the scheduler's token bookkeeping (the
/// scheduler holds the token history, prompt and generated, for the sampler's penalties too).
struct Live {
    events: Sender<Event>,
    sampler: Sampler,
    detok: Detokenizer,
    /// Decides when the request ends and why (stop tokens, stop strings, `max_tokens`); it sees
    /// every generated token, so its count is the completion's.
    stop: StopChecker,
    prompt_len: usize,
    /// Structured output: the grammar's mask for each token, advanced as tokens are committed.
    constraint: Option<ConstraintRun>,
    accepted: Instant,
    /// Set by the first step that schedules the request.
    queue_time: Option<Duration>,
    /// Whether proposals are made for it (requests whose sampling a proposal cannot be
    /// verified under are decoded without).
    speculate: bool,
    /// Its proposals verified so far.
    spec: SpecUsage,
    /// The batches its tokens were sampled in.
    batch: DecodeBatch,
    /// How its proposals fare, for the pay-off policy.
    accept: Acceptance,
    /// `Some(n)`: each token's log-probability and `n` alternatives go with its event.
    logprobs: Option<usize>,
    /// The log-probabilities of the tokens this step emitted, in order, until their events go.
    pending_logprobs: VecDeque<TokenLogprob>,
    /// `Some(n)`: the prompt's log-probabilities with `n` alternatives, gathered here (entry
    /// `i` scores prompt token `i + 1`) until they go out before the first token.
    prompt_logprobs: Option<usize>,
    prompt_lp: Vec<TokenLogprob>,
    /// An embedding request's vector, being pooled from its prompt's states.
    pooled: Option<Pooled>,
}

struct EngineThread {
    lm: Arc<LoadedModel>,
    /// For workers that report back (precision changes).
    inbox: Sender<Command>,
    requantizing: Option<WType>,
    last_requant: Option<(Precision, Precision, usize, usize, f64)>,
    threads: usize,
    backend: Box<dyn Backend>,
    device_note: Option<String>,
    rx: Receiver<Command>,
    snapshot: Arc<Mutex<EngineSnapshot>>,
    notify: Option<Notify>,
    knobs: Knobs,
    sched: Scheduler,
    live: HashMap<RequestId, Live>,
    metrics: LiveMetrics,
    origin: Instant,
    steps: u64,
    last_error: Option<String>,
    /// Prefix-cache (queries, hits) totals at the last step, for per-step deltas.
    cache_seen: (u64, u64),
    last_publish: Instant,
    /// Resident memory as of the last publish.
    rss: Option<u64>,
    spec: SpecState,
}

/// Threads the CPU backend computes on for a setting of `threads` (0 = one per core).
fn backend_threads(threads: usize) -> usize {
    if threads > 0 {
        threads
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    }
}

impl EngineThread {
    fn new(
        lm: Arc<LoadedModel>,
        config: &EngineConfig,
        rx: Receiver<Command>,
        inbox: Sender<Command>,
        snapshot: Arc<Mutex<EngineSnapshot>>,
        notify: Option<Notify>,
    ) -> Result<Self, EngineError> {
        // The backend sizes the pool from the budget (`KvTypes::pool_for_budget`).
        let opened = crate::device::open(
            Arc::clone(&lm),
            config.device,
            config.threads,
            &config.knobs.kv,
            config.gpu_kv_fraction,
            config.cpu_moe_layers,
        )
        .map_err(EngineError::Device)?;
        let backend = opened.backend;
        let mut knobs = config.knobs.clone();
        if config.gpu_kv_fraction > 0.0 {
            // The pool actually built (a GPU sizes it from its free memory).
            knobs.kv.budget_bytes = backend.memory().kv;
        }
        let mut sched = Scheduler::new(
            config.knobs.scheduler.clone(),
            backend.num_blocks(),
            backend.block_size(),
        )
        .map_err(|e| EngineError::Kv(e.to_string()))?;
        sched.set_window(lm.model.cfg.full_window());
        let metrics =
            LiveMetrics::new(LiveConfig::default()).map_err(|e| EngineError::Kv(e.to_string()))?;
        let proposer = spec_step::build(
            &config.knobs.spec,
            &lm,
            config.draft.as_ref(),
            backend_threads(config.threads),
            backend.block_size(),
            backend.num_blocks(),
            backend.kv_types(),
        )?;
        let spec = SpecState {
            proposer,
            draft_lm: config.draft.clone(),
            ..SpecState::default()
        };
        Ok(Self {
            spec,
            backend,
            device_note: opened.note,
            threads: backend_threads(config.threads),
            lm,
            inbox,
            requantizing: None,
            last_requant: None,
            rx,
            snapshot,
            notify,
            knobs,
            sched,
            live: HashMap::new(),
            metrics,
            cache_seen: (0, 0),
            last_publish: Instant::now(),
            rss: None,
            origin: Instant::now(),
            steps: 0,
            last_error: None,
        })
    }

    fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    fn run(mut self) {
        loop {
            // Idle: block until something arrives; busy: take what is there and step.
            let first = if self.live.is_empty() {
                match self.rx.recv_timeout(Duration::from_millis(250)) {
                    Ok(c) => Some(c),
                    Err(RecvTimeoutError::Timeout) => {
                        self.publish();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            } else {
                None
            };
            let mut cmds: Vec<Command> = first.into_iter().collect();
            cmds.extend(self.rx.try_iter());
            for c in cmds {
                if !self.handle(c) {
                    return;
                }
            }
            if self.live.is_empty() {
                self.publish();
            } else {
                self.step();
            }
        }
    }

    /// Applies one command; false means shut down.
    fn handle(&mut self, cmd: Command) -> bool {
        match cmd {
            Command::Submit { id, req, events } => self.submit(id, req, events),
            Command::Cancel(id) => self.end(id, FinishReason::Abort),
            Command::SetKnobs(k) => self.set_knobs(k),
            Command::SetPrecision(ty) => self.start_requant(ty),
            Command::PrecisionReady(r) => self.finish_requant(*r),
            Command::ResetMetrics => self.metrics.reset(),
            Command::SetDraft(d) => self.set_draft(d),
            Command::Shutdown => return false,
        }
        true
    }

    /// What requests are checked against now: the model, and the pool as it is.
    fn admission(&self) -> Admission {
        Admission::with_pool(&self.lm.model.cfg, self.sched.kv_pool())
    }

    /// Every path in (server, window, CLI) comes through here: the one admission check, then
    /// the scheduler's queue (which trusts what was admitted).
    fn submit(&mut self, id: RequestId, req: Request, events: Sender<Event>) {
        if req.embed.is_some() && !self.backend.embeds() {
            let device = self.backend.describe();
            return self.refuse(id, &events, Refusal::NoEmbeddings { device });
        }
        let admitted = match self.admission().check(&req) {
            Ok(a) => a,
            Err(e) => return self.refuse(id, &events, e),
        };
        let Request {
            prompt,
            sampling,
            mut stop,
            priority,
            client,
            constraint,
            logprobs,
            prompt_logprobs,
            embed,
        } = req;
        // An embedding generates nothing: the one slot after its prompt is all it holds.
        let max_tokens = if embed.is_some() {
            1
        } else {
            admitted.max_tokens
        };
        stop.max_tokens = Some(max_tokens);
        let prompt_len = prompt.len();
        let sr_prompt_one = if prompt_len == 1 {
            prompt.clone()
        } else {
            Vec::new()
        };
        let prompt_rows = prompt_logprobs.is_some() && prompt_len > 1;
        let sr = SchedRequest {
            id,
            prompt,
            max_tokens,
            priority,
            client,
            prompt_rows,
            whole_prompt: embed.is_some_and(Pooling::needs_every_token),
        };
        if let Err(e) = self.sched.add_admitted(sr) {
            return self.refuse(id, &events, e.into());
        }
        let _ = events.send(Event::Started { id });
        if prompt_logprobs.is_some() && prompt_len == 1 {
            // Nothing to score: the one token has no context.
            let _ = events.send(Event::PromptLogprobs {
                id,
                prompt: sr_prompt_one,
                logprobs: Vec::new(),
            });
        }
        self.metrics.on_arrival(id, self.now(), prompt_len);
        // A proposal would have to be checked against the grammar first; an embedding has
        // nothing to propose.
        let speculate = constraint.is_none() && embed.is_none();
        let width = self.lm.model.cfg.hidden;
        self.live.insert(
            id,
            Live {
                events,
                sampler: Sampler::new(&sampling),
                // Harmony's channel markers are control tokens its answer is split by.
                detok: Detokenizer::new(
                    !ReasoningTags::for_template(self.lm.template.source()).keeps_control_tokens(),
                ),
                stop: StopChecker::new(stop),
                prompt_len,
                constraint: constraint.map(ConstraintRun::start),
                accepted: Instant::now(),
                queue_time: None,
                speculate,
                spec: SpecUsage::default(),
                batch: DecodeBatch::default(),
                accept: Acceptance::seeded(&self.spec.overall),
                logprobs: logprobs.map(|n| n.min(MAX_TOP_LOGPROBS)),
                pending_logprobs: VecDeque::new(),
                prompt_logprobs: prompt_logprobs
                    .filter(|_| prompt_len > 1)
                    .map(|n| n.min(MAX_TOP_LOGPROBS)),
                prompt_lp: Vec::new(),
                pooled: embed.map(|rule| Pooled::new(rule, prompt_len, width)),
            },
        );
    }

    fn refuse(&mut self, id: RequestId, events: &Sender<Event>, reason: Refusal) {
        self.metrics.on_refused(self.now());
        let _ = events.send(Event::Refused { id, reason });
    }

    /// Ends a request (finished or cancelled): frees its blocks and sends its last event.
    fn end(&mut self, id: RequestId, reason: FinishReason) {
        self.sched.finish(&[id], reason);
        self.spec_forget(id);
        if let Some(mut l) = self.live.remove(&id) {
            if let Some(p) = l.pooled.take().filter(Pooled::done) {
                let vector = p.finish();
                let _ = l.events.send(Event::Embedding { id, vector });
            }
            let tail = l.stop.flush(&l.detok.finish());
            let usage = Usage {
                prompt_tokens: l.prompt_len,
                completion_tokens: l.stop.n_tokens(),
                spec: l.spec,
                batch: l.batch,
            };
            let _ = l.events.send(Event::Finished {
                id,
                reason,
                usage,
                text: tail.text,
                queue_time: l.queue_time.unwrap_or_else(|| l.accepted.elapsed()),
            });
            let kind = if reason == FinishReason::Abort {
                FinishKind::Aborted
            } else {
                FinishKind::Finished
            };
            self.metrics.on_finish(id, self.now(), kind);
        }
    }

    fn publish(&mut self) {
        self.last_publish = Instant::now();
        self.rss = process_rss_bytes().map(|(cur, _)| cur);
        let st = self.sched.stats();
        let mem = self.backend.memory();
        let snap = EngineSnapshot {
            running: st.running,
            waiting: st.waiting,
            kv_used_blocks: st.kv_used_blocks,
            kv_total_blocks: st.kv_total_blocks,
            prefix_cache_queries: st.prefix_cache_queries,
            prefix_cache_hits: st.prefix_cache_hits,
            precision: Some(self.lm.precision),
            requantizing: self.requantizing,
            last_requant: self.last_requant,
            live: self.metrics.snapshot(self.now()),
            knobs: self.knobs.clone(),
            threads: self.backend.threads(),
            kv_bytes: mem.kv,
            weights_bytes: mem.weights,
            device: self.backend.describe(),
            device_note: self.device_note.clone(),
            memory: mem,
            steps: self.steps,
            last_error: self.last_error.clone(),
            spec_pause: self.spec.gate.pause().cloned(),
            spec_switches: self.spec.gate.switches,
            spec_draft: self.spec.draft_lm.as_ref().map(|d| d.path.clone()),
        };
        if let Ok(mut s) = self.snapshot.lock() {
            *s = snap;
        }
    }
}

// One step of the loop: schedule, forward, sample, stop checks, metrics.
#[path = "engine_step.rs"]
mod step;
// Changes while it runs: knobs, the KV pool, the draft model, the weights' precision.
#[path = "engine_changes.rs"]
mod changes;
// Speculative decoding: proposals before a step, verification in it.
#[path = "spec_step.rs"]
mod spec_step;
pub use spec_step::SpecError;
use spec_step::SpecState;
pub use step::batch_from;

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;

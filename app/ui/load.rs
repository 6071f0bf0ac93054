//! Load generator and concurrency sweep, each on its own thread with a stop flag; the UI polls
//! their results every frame and never waits on them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tpslab_engine::model::precision::Precision;
use tpslab_engine::serving::engine::{EngineHandle, EngineSnapshot};
use tpslab_engine::serving::loadgen::{self, LenDist, LoadSpec, LoadTarget, PromptSet};

use crate::remote::RemoteTarget;
use tpslab_engine::serving::metrics::{BenchSummary, LiveConfig, LiveMetrics, Slo};

/// The load the user asks for (saved).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LoadSettings {
    pub concurrency: usize,
    /// Poisson arrivals per second; 0 = closed loop at `concurrency`.
    pub rate: f64,
    pub prompt_len: usize,
    pub output_len: usize,
    /// Highest concurrency level of a sweep (levels 1, 2, 4, ... up to it).
    pub sweep_max: usize,
    /// Requests per sweep level, per unit of concurrency.
    pub sweep_requests_per_slot: usize,
    /// Where sweep results are saved (`.json` and `.csv` beside each other).
    pub sweep_path: String,
    /// Load a remote OpenAI-compatible server instead of this window's engine.
    pub remote: RemoteSettings,
    /// Goodput objectives (vLLM's `--goodput`), ms; 0 = not set.
    pub slo_ttft_ms: f64,
    pub slo_tpot_ms: f64,
}

/// A remote endpoint as the load generator's target (saved, but for the key).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RemoteSettings {
    pub enabled: bool,
    /// http(s)://host:port (a trailing /v1 is fine).
    pub url: String,
    /// The served model; empty: the first one the server lists.
    pub model: String,
    #[serde(skip)]
    pub api_key: String,
}

/// What a run's thread drives: the engine, or a remote server it connects to itself (the
/// connection check may take seconds, which the frame must not wait on).
#[derive(Clone)]
pub enum TargetSpec {
    Local(EngineHandle),
    Remote(RemoteSettings),
}

enum Target {
    Local(EngineHandle),
    Remote(Box<RemoteTarget>),
}

impl TargetSpec {
    pub fn of(engine: &EngineHandle, s: &LoadSettings) -> Self {
        if s.remote.enabled {
            Self::Remote(s.remote.clone())
        } else {
            Self::Local(engine.clone())
        }
    }

    fn open(self) -> Result<Target, String> {
        match self {
            Self::Local(e) => Ok(Target::Local(e)),
            Self::Remote(r) => {
                let key = Some(r.api_key.trim().to_string()).filter(|k| !k.is_empty());
                let model = Some(r.model.trim()).filter(|m| !m.is_empty());
                RemoteTarget::connect(&r.url, key, model)
                    .map(|t| Target::Remote(Box::new(t)))
                    .map_err(|e| format!("remote endpoint: {e}"))
            }
        }
    }
}

impl Target {
    fn as_dyn(&self) -> &dyn LoadTarget {
        match self {
            Self::Local(e) => e,
            Self::Remote(r) => r.as_ref(),
        }
    }

    /// The backend label of the figures: the engine's device, or "remote URL (model)".
    fn device(&self) -> String {
        match self {
            Self::Local(e) => e.stats().device,
            Self::Remote(r) => format!("remote {} ({})", r.url(), r.model()),
        }
    }

    /// The engine's batch cap (0 for a remote server: not known).
    fn max_batch(&self) -> usize {
        match self {
            Self::Local(e) => e.stats().knobs.scheduler.max_num_seqs,
            Self::Remote(_) => 0,
        }
    }
}

impl Default for LoadSettings {
    fn default() -> Self {
        let sweep_path = tpslab_engine::library::home_dir()
            .map(|h| h.join("sweeps").join("sweep"))
            .unwrap_or_else(|_| PathBuf::from("sweep"));
        Self {
            concurrency: 8,
            rate: 0.0,
            prompt_len: 128,
            output_len: 64,
            sweep_max: 64,
            sweep_requests_per_slot: 2,
            sweep_path: sweep_path.display().to_string(),
            remote: RemoteSettings::default(),
            slo_ttft_ms: 0.0,
            slo_tpot_ms: 0.0,
        }
    }
}

impl LoadSettings {
    /// "8 × 128->64 tok" (or "2.0 req/s × ...").
    /// The goodput objectives that are set (`None`: none).
    pub fn slo(&self) -> Option<Slo> {
        let ms = |v: f64| (v > 0.0 && v.is_finite()).then_some(v);
        let s = Slo {
            ttft_ms: ms(self.slo_ttft_ms),
            tpot_ms: ms(self.slo_tpot_ms),
            e2el_ms: None,
        };
        (s.ttft_ms.is_some() || s.tpot_ms.is_some()).then_some(s)
    }

    pub fn label(&self) -> String {
        let shape = if self.rate > 0.0 {
            format!("{:.1} req/s, <={}", self.rate, self.concurrency)
        } else {
            format!("{} concurrent", self.concurrency)
        };
        let target = if self.remote.enabled {
            format!(" -> {}", self.remote.url.trim())
        } else {
            String::new()
        };
        format!(
            "{shape}, prompt {} -> output {} tok{target}",
            self.prompt_len, self.output_len
        )
    }

    fn spec(&self, concurrency: usize, num_requests: usize, seed: u64) -> LoadSpec {
        LoadSpec {
            concurrency: Some(concurrency.max(1)),
            rate: (self.rate > 0.0).then_some(self.rate),
            num_requests,
            prompt_len: LenDist::Fixed(self.prompt_len.max(1)),
            output_len: LenDist::Fixed(self.output_len.max(1)),
            seed,
            priority: LOAD_PRIORITY,
            submit_for_s: None,
            cut_after_s: None,
            temperature: 0.0,
        }
    }
}

/// The window's load requests queue behind its chats (priority 0) under the Priority policy, and
/// give up their batch slot to one: a chat answers during a load test even with the batch full.
pub const LOAD_PRIORITY: i32 = 1;

/// Live figures measured on this side, for a target that publishes none (a remote server).
pub struct ClientLive {
    pub metrics: Mutex<LiveMetrics>,
    /// When the run started (the metrics' clock is seconds since then).
    pub start: OnceLock<Instant>,
    /// "remote URL (model)", once connected.
    pub device: OnceLock<String>,
}

impl ClientLive {
    fn new() -> Option<Arc<Self>> {
        Some(Arc::new(Self {
            metrics: Mutex::new(LiveMetrics::new(LiveConfig::default()).ok()?),
            start: OnceLock::new(),
            device: OnceLock::new(),
        }))
    }

    /// The figures now, as the engine's snapshot would carry them (no batch, queue or KV: the
    /// server's own are not known here).
    pub fn snapshot(&self) -> Option<EngineSnapshot> {
        let t = self.start.get()?.elapsed().as_secs_f64();
        let live = self.metrics.lock().ok()?.snapshot(t);
        Some(EngineSnapshot {
            live,
            device: self.device.get().cloned().unwrap_or_default(),
            // The remote server's precision is not known here (its label says "remote").
            ..EngineSnapshot::default()
        })
    }
}

/// A load run in progress: the flag that stops it and the figures it reports.
pub struct LoadRun {
    pub label: String,
    /// Set for a remote target: its live figures, measured here.
    pub client_live: Option<Arc<ClientLive>>,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicUsize>,
    rx: Receiver<LoadOutcome>,
}

/// What a finished (or stopped) load run measured.
#[derive(Debug, Clone)]
pub struct LoadOutcome {
    pub label: String,
    pub summary: BenchSummary,
    pub refused: usize,
    pub aborted: usize,
    /// The run could not start (a remote endpoint unreachable, say).
    pub error: Option<String>,
}

impl LoadRun {
    /// Starts a closed-loop (or Poisson) load that runs until stopped.
    pub fn start(
        target: TargetSpec,
        prompts: &PromptSet,
        settings: &LoadSettings,
        ctx: &egui::Context,
    ) -> Result<Self, String> {
        // "Until stopped": enough requests for hours at any rate this machine reaches.
        let spec = settings.spec(settings.concurrency, 1_000_000, 0);
        let label = settings.label();
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicUsize::new(0));
        let (tx, rx) = mpsc::channel();
        let (prompts, ctx) = (prompts.clone(), ctx.clone());
        let (t_stop, t_done, t_label) = (Arc::clone(&stop), Arc::clone(&done), label.clone());
        let client_live = matches!(target, TargetSpec::Remote(_))
            .then(ClientLive::new)
            .flatten();
        let t_live = client_live.clone();
        let slo = settings.slo();
        std::thread::Builder::new()
            .name("tpslab-load".into())
            .spawn(move || {
                let outcome = match target.open() {
                    Ok(target) => {
                        if let Some(l) = &t_live {
                            let _ = l.device.set(target.device());
                            let _ = l.start.set(Instant::now());
                        }
                        let result = loadgen::run_observed(
                            target.as_dyn(),
                            &prompts,
                            &spec,
                            &t_stop,
                            &mut |d, _| t_done.store(d, Ordering::Relaxed),
                            t_live.as_ref().map(|l| &l.metrics),
                        );
                        LoadOutcome {
                            label: t_label,
                            summary: BenchSummary::from_requests(
                                &result.timings,
                                result.duration_s,
                                slo,
                            ),
                            refused: result.refused.len(),
                            aborted: result.aborted,
                            error: None,
                        }
                    }
                    Err(e) => LoadOutcome {
                        label: t_label,
                        summary: BenchSummary::from_requests(&[], 0.0, None),
                        refused: 0,
                        aborted: 0,
                        error: Some(e),
                    },
                };
                let _ = tx.send(outcome);
                ctx.request_repaint();
            })
            .map_err(|e| format!("cannot start the load thread: {e}"))?;
        Ok(Self {
            label,
            client_live,
            stop,
            done,
            rx,
        })
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    pub fn done(&self) -> usize {
        self.done.load(Ordering::Relaxed)
    }

    /// The outcome once the thread has ended.
    pub fn poll(&self) -> Option<LoadOutcome> {
        match self.rx.try_recv() {
            Ok(o) => Some(o),
            Err(TryRecvError::Empty) => None,
            Err(TryRecvError::Disconnected) => Some(LoadOutcome {
                label: self.label.clone(),
                summary: BenchSummary::from_requests(&[], 0.0, None),
                refused: 0,
                aborted: 0,
                error: None,
            }),
        }
    }
}

/// One level of a sweep.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub concurrency: usize,
    pub prompt_len: usize,
    pub output_len: usize,
    /// The engine's weight precision; `None` for a remote server's, which is not known here.
    pub precision: Option<Precision>,
    pub completed: usize,
    pub duration_s: f64,
    pub output_throughput: f64,
    pub mean_per_request_tps: Option<f64>,
    pub p10_per_request_tps: Option<f64>,
    pub median_ttft_ms: f64,
    pub p99_ttft_ms: f64,
    /// The engine's batch cap (max running sequences) during the level.
    #[serde(default)]
    pub max_batch: usize,
    /// The backend, as the engine reports it ("CPU, 2 threads").
    #[serde(default)]
    pub device: String,
}

impl SweepPoint {
    /// The precision as the sweep's labels and files write it ("remote" where not known).
    pub fn precision_label(&self) -> String {
        self.precision
            .map_or_else(|| "remote".into(), |p| p.to_string())
    }
}

/// A sweep in progress: levels arrive one by one.
pub struct SweepRun {
    pub levels: Vec<usize>,
    stop: Arc<AtomicBool>,
    rx: Receiver<Result<SweepPoint, String>>,
    pub finished: bool,
    /// Why the sweep could not run (a remote endpoint unreachable, say); taken by the app.
    pub error: Option<String>,
}

/// Concurrency levels 1, 2, 4, ... up to `max` (and `max` itself if it is not a power of two).
pub fn sweep_levels(max: usize) -> Vec<usize> {
    let max = max.max(1);
    let mut levels: Vec<usize> = std::iter::successors(Some(1usize), |l| l.checked_mul(2))
        .take_while(|l| *l <= max)
        .collect();
    if levels.last() != Some(&max) {
        levels.push(max);
    }
    levels
}

impl SweepRun {
    pub fn start(
        target: TargetSpec,
        prompts: &PromptSet,
        settings: &LoadSettings,
        precision: Option<Precision>,
        ctx: &egui::Context,
    ) -> Result<Self, String> {
        let levels = sweep_levels(settings.sweep_max);
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (prompts, ctx) = (prompts.clone(), ctx.clone());
        let (t_stop, t_levels, settings) = (Arc::clone(&stop), levels.clone(), settings.clone());
        std::thread::Builder::new()
            .name("tpslab-sweep".into())
            .spawn(move || {
                let target = match target.open() {
                    Ok(t) => t,
                    Err(e) => {
                        let _ = tx.send(Err(e));
                        ctx.request_repaint();
                        return;
                    }
                };
                let precision = match &target {
                    Target::Local(_) => precision,
                    Target::Remote(_) => None,
                };
                for (i, &c) in t_levels.iter().enumerate() {
                    if t_stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let n = c * settings.sweep_requests_per_slot.max(1);
                    let spec = settings.spec(c, n, i as u64);
                    let r = loadgen::run(target.as_dyn(), &prompts, &spec, &t_stop, &mut |_, _| {});
                    if t_stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let s = BenchSummary::from_requests(&r.timings, r.duration_s, None);
                    let point = SweepPoint {
                        concurrency: c,
                        prompt_len: settings.prompt_len,
                        output_len: settings.output_len,
                        precision,
                        completed: s.completed,
                        duration_s: s.duration,
                        output_throughput: s.output_throughput,
                        mean_per_request_tps: s.mean_per_request_tps,
                        p10_per_request_tps: s.p10_per_request_tps,
                        median_ttft_ms: s.median_ttft_ms,
                        p99_ttft_ms: s.p99_ttft_ms,
                        max_batch: target.max_batch(),
                        device: target.device(),
                    };
                    if tx.send(Ok(point)).is_err() {
                        break;
                    }
                    ctx.request_repaint();
                }
                ctx.request_repaint();
            })
            .map_err(|e| format!("cannot start the sweep thread: {e}"))?;
        Ok(Self {
            levels,
            stop,
            rx,
            finished: false,
            error: None,
        })
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Moves any new points into `points`; marks the run finished when the thread has ended.
    pub fn poll(&mut self, points: &mut Vec<SweepPoint>) {
        loop {
            match self.rx.try_recv() {
                Ok(Ok(p)) => points.push(p),
                Ok(Err(e)) => self.error = Some(e),
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    self.finished = true;
                    return;
                }
            }
        }
    }
}

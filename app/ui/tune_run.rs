//! The Tuner tab at run time. A tuning run on its own thread: it reads the recorded trace the
//! workload names (a file: never in the frame), drives the window's engine through its handle
//! (knob messages and the load generator; the engine thread keeps its state), sends each
//! measured rung and the report back, and wakes the frame; the UI polls it and never waits.
//! The trace file is chosen through the dialog seam, on a worker too.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};

use tpslab_engine::serving::engine::{EngineHandle, Knobs};
use tpslab_engine::serving::loadgen::PromptSet;
use tpslab_engine::tune::workload::MAX_TRACE_LEN;
use tpslab_engine::tune::{CandidateRun, Trace, TuneConfig, TuneEvent, TuneReport, tune};

use super::files::{DialogAnswer, DialogRequest, Dialogs, FileDialog, PendingOpen};

enum Msg {
    Workload(String),
    Event(Box<TuneEvent>),
    Done(Box<Result<TuneReport, String>>),
}

/// The tuner's jobs: the run in progress (or the last one) and a trace dialog.
#[derive(Default)]
pub struct Tuner {
    pub run: Option<TuneRun>,
    dialog: Option<PendingOpen>,
}

impl Tuner {
    pub fn running(&self) -> bool {
        self.run.as_ref().is_some_and(TuneRun::running)
    }

    pub fn stop(&self) {
        if let Some(r) = &self.run {
            r.stop();
        }
    }

    /// The workers' news: the run's, and the trace dialog's answer once there is one (a chosen
    /// file, or an error to show; nothing when it was cancelled).
    pub fn poll(&mut self) -> Option<Result<PathBuf, String>> {
        if let Some(r) = &mut self.run {
            r.poll();
        }
        let answer = self.dialog.as_ref().and_then(PendingOpen::poll)?;
        self.dialog = None;
        match answer {
            DialogAnswer::Chosen(p) => Some(Ok(p)),
            DialogAnswer::Cancelled => None,
            DialogAnswer::Unavailable(why) => Some(Err(format!("cannot choose a trace: {why}"))),
        }
    }

    /// Whether the trace dialog is open.
    pub fn choosing_trace(&self) -> bool {
        self.dialog.is_some()
    }

    /// Asks for a trace file on a worker, starting at `at`; [`Tuner::poll`] takes the answer.
    pub fn choose_trace(
        &mut self,
        dialogs: &Dialogs,
        ctx: &egui::Context,
        at: &std::path::Path,
    ) -> Result<(), String> {
        if self.dialog.is_some() {
            return Ok(());
        }
        let mut req = DialogRequest::for_path("Choose a recorded trace", at);
        req.filters = vec![("JSON lines".into(), vec!["jsonl".into(), "json".into()])];
        let ask = move |d: &dyn FileDialog| d.open_path(&req);
        self.dialog = Some(PendingOpen::start(dialogs, ctx, ask)?);
        Ok(())
    }
}

/// A tuning run, in progress or ended: what it has measured so far and its report.
pub struct TuneRun {
    stop: Arc<AtomicBool>,
    rx: Receiver<Msg>,
    /// Every measured rung so far, in the order run.
    pub runs: Vec<CandidateRun>,
    /// Candidates and runs the halving plans (once it has started).
    pub planned: Option<(usize, usize)>,
    /// What it is doing now ("measuring", "verifying the best knobs", "done").
    pub phase: String,
    /// The load it measures under (a trace's once read).
    pub workload: String,
    /// The report (or why there is none) once the thread has ended.
    pub outcome: Option<Result<TuneReport, String>>,
}

impl TuneRun {
    /// Starts tuning `engine` from its knobs now (`base`). With a `trace`, its lengths (and its
    /// arrival rate, when `cfg` sets none) replace the workload's, read on the tuner's thread.
    pub fn start(
        engine: EngineHandle,
        prompts: &PromptSet,
        base: Knobs,
        mut cfg: TuneConfig,
        trace: Option<PathBuf>,
        ctx: &egui::Context,
    ) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (t_stop, prompts, ctx) = (Arc::clone(&stop), prompts.clone(), ctx.clone());
        let workload = match &trace {
            Some(p) => format!("reading the trace {}", p.display()),
            None => cfg.workload.label(),
        };
        std::thread::Builder::new()
            .name("tpslab-tune".into())
            .spawn(move || {
                let send = |m: Msg| {
                    let _ = tx.send(m);
                    ctx.request_repaint();
                };
                let result = match trace.map(|p| replay(&p, &mut cfg, &send)) {
                    Some(Err(e)) => Err(e),
                    _ => tune(&engine, &prompts, &base, &cfg, &t_stop, &mut |ev| {
                        send(Msg::Event(Box::new(ev)));
                    })
                    .map_err(|e| e.to_string()),
                };
                send(Msg::Done(Box::new(result)));
            })
            .map_err(|e| format!("cannot start the tuner thread: {e}"))?;
        Ok(Self {
            stop,
            rx,
            runs: Vec::new(),
            planned: None,
            phase: "starting".into(),
            workload,
            outcome: None,
        })
    }

    /// Takes what the thread has sent since the last frame.
    pub fn poll(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Workload(w)) => self.workload = w,
                Ok(Msg::Event(ev)) => self.on_event(*ev),
                Ok(Msg::Done(r)) => {
                    self.phase = match r.as_ref() {
                        Ok(rep) if rep.stopped => "stopped".into(),
                        Ok(_) => "done".into(),
                        Err(_) => "failed".into(),
                    };
                    self.outcome = Some(*r);
                }
                Err(TryRecvError::Empty) => return,
                Err(TryRecvError::Disconnected) => {
                    if self.outcome.is_none() {
                        self.outcome = Some(Err("the tuner thread ended".into()));
                        self.phase = "failed".into();
                    }
                    return;
                }
            }
        }
    }

    fn on_event(&mut self, ev: TuneEvent) {
        match ev {
            TuneEvent::Started { candidates, runs } => {
                self.planned = Some((candidates, runs));
                self.phase = "measuring candidates".into();
            }
            TuneEvent::Measured(r) => self.runs.push(r),
            TuneEvent::Verifying(what) => {
                self.phase = format!("verifying the {what} knobs with a fresh run");
            }
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    pub fn running(&self) -> bool {
        self.outcome.is_none()
    }
}

/// Reads the trace at `path` into `cfg`'s workload (its rate too when `cfg` sets none) and
/// says what it holds.
fn replay(path: &std::path::Path, cfg: &mut TuneConfig, send: &dyn Fn(Msg)) -> Result<(), String> {
    let t = Trace::read(path, MAX_TRACE_LEN).map_err(|e| e.to_string())?;
    let summary = t.summary();
    let w = &mut cfg.workload;
    t.apply(w, w.rate.is_none());
    w.check().map_err(|e| e.to_string())?;
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    send(Msg::Workload(format!(
        "trace {name} ({summary}): {}",
        w.label()
    )));
    Ok(())
}

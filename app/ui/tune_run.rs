//! A tuning run on its own thread: it drives the window's engine through its handle (knob
//! messages and the load generator; the engine thread keeps its state), sends each measured
//! rung and the report back, and wakes the frame; the UI polls it and never waits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, TryRecvError};

use tpslab_engine::serving::engine::{EngineHandle, Knobs};
use tpslab_engine::serving::loadgen::PromptSet;
use tpslab_engine::tune::{CandidateRun, TuneConfig, TuneEvent, TuneReport, tune};

enum Msg {
    Event(Box<TuneEvent>),
    Done(Box<Result<TuneReport, String>>),
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
    /// The report (or why there is none) once the thread has ended.
    pub outcome: Option<Result<TuneReport, String>>,
}

impl TuneRun {
    /// Starts tuning `engine` from its knobs now (`base`).
    pub fn start(
        engine: EngineHandle,
        prompts: &PromptSet,
        base: Knobs,
        cfg: TuneConfig,
        ctx: &egui::Context,
    ) -> Result<Self, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, rx) = mpsc::channel();
        let (t_stop, prompts, ctx) = (Arc::clone(&stop), prompts.clone(), ctx.clone());
        std::thread::Builder::new()
            .name("tpslab-tune".into())
            .spawn(move || {
                let result = tune(&engine, &prompts, &base, &cfg, &t_stop, &mut |ev| {
                    let _ = tx.send(Msg::Event(Box::new(ev)));
                    ctx.request_repaint();
                });
                let _ = tx.send(Msg::Done(Box::new(result.map_err(|e| e.to_string()))));
                ctx.request_repaint();
            })
            .map_err(|e| format!("cannot start the tuner thread: {e}"))?;
        Ok(Self {
            stop,
            rx,
            runs: Vec::new(),
            planned: None,
            phase: "starting".into(),
            outcome: None,
        })
    }

    /// Takes what the thread has sent since the last frame.
    pub fn poll(&mut self) {
        loop {
            match self.rx.try_recv() {
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

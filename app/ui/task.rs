//! A long job on a worker thread (import, download, quantization, perplexity): it reports
//! progress and then one result through a channel, stops between steps when its cancel flag is
//! set, and wakes the UI; the UI polls it each frame and never waits on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

/// How far a job is: `done` of `total` units (bytes, tensors, windows), and what it is doing.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Progress {
    pub done: u64,
    pub total: u64,
    pub text: String,
    /// Speed and time left as the job measured them (else the task works them out).
    pub rate: Option<f64>,
    pub eta: Option<Duration>,
}

enum Msg<T> {
    Progress(Progress),
    Done(Result<T, String>),
}

/// The worker's side: reports progress (at most every 50 ms, and always the last step) and
/// reads the cancel flag.
pub struct Reporter<T> {
    tx: Sender<Msg<T>>,
    ctx: egui::Context,
    cancel: Arc<AtomicBool>,
    last: Option<Instant>,
}

const REPORT_EVERY: Duration = Duration::from_millis(50);

impl<T> Reporter<T> {
    pub fn report(&mut self, done: u64, total: u64, text: &str) {
        self.report_rate(done, total, text, None, None);
    }

    /// [`report`](Self::report) with the speed (units per second) and time left the job measured.
    pub fn report_rate(
        &mut self,
        done: u64,
        total: u64,
        text: &str,
        rate: Option<f64>,
        eta: Option<Duration>,
    ) {
        let now = Instant::now();
        if done < total && self.last.is_some_and(|l| now - l < REPORT_EVERY) {
            return;
        }
        self.last = Some(now);
        let p = Progress {
            done,
            total,
            text: text.to_owned(),
            rate: rate.filter(|r| *r > 0.0),
            eta,
        };
        let _ = self.tx.send(Msg::Progress(p));
        self.ctx.request_repaint();
    }

    /// The flag the job checks between steps (the engine's cancel options take it as is); a
    /// handle of its own, so the job can hold it while it reports.
    pub fn cancel_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.cancel)
    }
}

/// A job in flight, as the UI holds it.
pub struct Task<T> {
    /// What it is, for the panel ("Quantizing to Q8_0").
    pub what: String,
    pub progress: Progress,
    rx: Receiver<Msg<T>>,
    cancel: Arc<AtomicBool>,
    started: Instant,
    /// When the first progress arrived, and at what count (speed is measured from there, so
    /// setup time such as opening a file does not count as slowness).
    first: Option<(Instant, u64)>,
}

impl<T: Send + 'static> Task<T> {
    /// Runs `work` on a thread named `tpslab-<name>`; its result comes back through [`poll`](Self::poll).
    pub fn spawn(
        name: &str,
        what: String,
        ctx: &egui::Context,
        work: impl FnOnce(&mut Reporter<T>) -> Result<T, String> + Send + 'static,
    ) -> Result<Self, String> {
        let (tx, rx) = mpsc::channel();
        let cancel = Arc::new(AtomicBool::new(false));
        let mut reporter = Reporter {
            tx,
            ctx: ctx.clone(),
            cancel: Arc::clone(&cancel),
            last: None,
        };
        std::thread::Builder::new()
            .name(format!("tpslab-{name}"))
            .spawn(move || {
                let result = work(&mut reporter);
                // The result first, then the repaint that reads it.
                let _ = reporter.tx.send(Msg::Done(result));
                reporter.ctx.request_repaint();
            })
            .map_err(|e| format!("cannot start the {name} thread: {e}"))?;
        Ok(Self {
            what,
            progress: Progress::default(),
            rx,
            cancel,
            started: Instant::now(),
            first: None,
        })
    }

    /// Takes in the progress sent so far; the result once the job has ended.
    pub fn poll(&mut self) -> Option<Result<T, String>> {
        loop {
            match self.rx.try_recv() {
                Ok(Msg::Progress(p)) => {
                    if self.first.is_none() {
                        self.first = Some((Instant::now(), p.done));
                    }
                    self.progress = p;
                }
                Ok(Msg::Done(r)) => return Some(r),
                Err(TryRecvError::Empty) => return None,
                Err(TryRecvError::Disconnected) => {
                    return Some(Err(format!("{} stopped unexpectedly", self.what)));
                }
            }
        }
    }

    pub fn cancel(&self) {
        self.cancel.store(true, Ordering::Relaxed);
    }

    pub fn cancelling(&self) -> bool {
        self.cancel.load(Ordering::Relaxed)
    }

    /// Units per second since the first report, once there is something to measure.
    pub fn rate(&self) -> Option<f64> {
        if self.progress.rate.is_some() {
            return self.progress.rate;
        }
        let (t0, d0) = self.first?;
        let secs = t0.elapsed().as_secs_f64();
        let units = self.progress.done.saturating_sub(d0);
        (secs > 0.2 && units > 0).then(|| units as f64 / secs)
    }

    /// The time left at the current rate.
    pub fn eta(&self) -> Option<Duration> {
        if self.progress.eta.is_some() {
            return self.progress.eta;
        }
        let left = self.progress.total.saturating_sub(self.progress.done);
        self.rate()
            .map(|r| Duration::from_secs_f64(left as f64 / r))
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// The progress bar ("42%  12.3 MiB/s  ETA 8 s  blk.3.ffn_up.weight") and a Cancel button
    /// (`cancel_label` names it, so two jobs on screen have different buttons). `bytes` says the
    /// units are bytes (speed in MiB/s) rather than steps.
    pub fn progress_ui(&self, ui: &mut egui::Ui, bytes: bool, cancel_label: Option<&str>) {
        let p = &self.progress;
        let frac = if p.total > 0 {
            (p.done as f64 / p.total as f64) as f32
        } else {
            0.0
        };
        let mut text = format!("{:.0}%", frac * 100.0);
        if let Some(r) = self.rate() {
            if bytes {
                text += &format!("  {:.1} MiB/s", r / (1u64 << 20) as f64);
            } else {
                text += &format!("  {r:.1}/s");
            }
        }
        if let Some(eta) = self.eta() {
            text += &format!("  ETA {}", duration_text(eta));
        }
        ui.label(format!("{}: {}", self.what, p.text));
        ui.horizontal(|ui| {
            if let Some(label) = cancel_label {
                let b = ui.add_enabled(!self.cancelling(), egui::Button::new(label));
                if b.clicked() {
                    self.cancel();
                }
            }
            ui.add(egui::ProgressBar::new(frac).text(text).animate(true));
        });
    }
}

/// "8 s", "3 min 05 s", "1 h 02 min".
pub fn duration_text(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {:02} s", s / 60, s % 60),
        _ => format!("{} h {:02} min", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_task_reports_progress_then_its_result_and_stops_when_cancelled() {
        let ctx = egui::Context::default();
        let wait = |t: &mut Task<u64>| loop {
            if let Some(r) = t.poll() {
                return r;
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let mut t = Task::spawn("t", "Counting".into(), &ctx, |r| {
            for i in 1..=3 {
                r.report(i, 3, "step");
            }
            Ok(3)
        })
        .expect("thread");
        assert_eq!(wait(&mut t), Ok(3));
        assert_eq!(t.progress.done, 3, "the last step always reports");
        let mut t = Task::spawn("t", "Waiting".into(), &ctx, |r| {
            while !r.cancel_flag().load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err("cancelled".into())
        })
        .expect("thread");
        t.cancel();
        assert_eq!(wait(&mut t), Err("cancelled".into()));
        assert_eq!(duration_text(Duration::from_secs(185)), "3 min 05 s");
    }
}

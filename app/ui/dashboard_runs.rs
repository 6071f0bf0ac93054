//! The dashboard's runs as the app drives them: the tuner's, the load generator's, the sweep's
//! and the KV quality run's news each frame; a sweep started and saved; a KV quality run
//! started on the loaded model.

use std::path::PathBuf;

use tpslab_engine::kv::KvTypes;

use super::TpsApp;
use super::files::{DialogOutcome, DialogRequest, DialogTask};
use super::load::{LoadRun, SweepPoint, SweepRun, TargetSpec};
use super::sweep_file;

impl TpsApp {
    /// The tuner's, the load run's and the sweep's news: a finished load or sweep leaves its
    /// outcome and the speed one user saw.
    pub(super) fn poll_runs(&mut self) {
        self.rt.kv_quality.poll();
        match self.rt.tuner.poll() {
            Some(Ok(trace)) => self.state.tuner.trace = Some(trace),
            Some(Err(e)) => self.rt.errors.push(e),
            None => {}
        }
        if let Some(mut outcome) = self.rt.load.as_ref().and_then(LoadRun::poll) {
            if let Some(e) = outcome.error.take() {
                self.rt.errors.push(e);
            }
            self.record_speed(&outcome.label, outcome.summary.mean_per_request_tps);
            self.rt.last_load = Some(outcome);
            self.rt.load = None;
        }
        if let Some(sweep) = &mut self.rt.sweep {
            sweep.poll(&mut self.rt.sweep_points);
            if let Some(e) = sweep.error.take() {
                self.rt.errors.push(e);
            }
            if sweep.finished {
                self.rt.sweep = None;
                // The lowest concurrency measured: the decode speed one user sees.
                if let Some(p) = self.rt.sweep_points.iter().min_by_key(|p| p.concurrency) {
                    let label = format!("sweep, {} concurrent", p.concurrency);
                    self.record_speed(&label, p.mean_per_request_tps);
                }
            }
        }
    }

    /// Starts a sweep over the concurrency levels (not beside the tuner).
    pub(super) fn start_sweep(&mut self, ctx: &egui::Context) -> Result<(), String> {
        self.not_tuning()?;
        let b = self.link().ok_or("the model is not loaded yet")?;
        let settings = &self.state.dash.load;
        let run = SweepRun::start(
            TargetSpec::of(&b.engine, settings),
            &b.prompts,
            settings,
            self.precision_now(),
            ctx,
        )?;
        // A new sweep replaces the points of its own target and keeps the others', so
        // this engine and a remote server can be compared side by side.
        let remote = format!("remote {}", settings.remote.url.trim());
        let mine = |p: &SweepPoint| match settings.remote.enabled {
            true => p.device.starts_with(&remote),
            false => !p.device.starts_with("remote "),
        };
        self.rt.sweep_points.retain(|p| !mine(p));
        self.rt.sweep = Some(run);
        Ok(())
    }

    /// Asks where to save the sweep and writes it there, on a worker (the dialog may stay open
    /// for minutes); with no dialog available it goes to the default path, and the notice says so.
    pub(super) fn save_sweep(&mut self, ctx: &egui::Context) -> Result<(), String> {
        if self.rt.saving.is_some() {
            return Err("a save is already in progress".into());
        }
        let default = PathBuf::from(&self.state.dash.load.sweep_path).with_extension("json");
        let mut req =
            DialogRequest::for_path("Save the sweep (JSON; CSV and PNG beside it)", &default);
        req.filters = vec![("JSON".into(), vec!["json".into()])];
        let points = self.rt.sweep_points.clone();
        let job = DialogTask::save(&self.dialogs, req, default, ctx, move |path| {
            sweep_file::save_sweep(path, &points)
        })?;
        self.rt.saving = Some(job);
        self.rt.notice = Some("Saving the sweep…".into());
        Ok(())
    }

    pub(super) fn saved(&mut self, outcome: DialogOutcome<[PathBuf; 3]>) {
        self.rt.notice = match outcome {
            DialogOutcome::Done { value, fallback } => {
                let [j, c, p] = value.map(|p| p.display().to_string());
                Some(match fallback {
                    None => format!("Sweep saved: {j}, {c} and {p}"),
                    Some(why) => {
                        format!("Sweep saved to the default place ({why}): {j}, {c} and {p}")
                    }
                })
            }
            DialogOutcome::Cancelled => Some("Save cancelled".into()),
            DialogOutcome::Failed(e) => {
                self.rt.errors.push(format!("cannot save the sweep: {e}"));
                None
            }
        };
    }

    /// Measures what `types` cost in quality on the loaded model, on a worker.
    pub(super) fn start_kv_quality(
        &mut self,
        types: KvTypes,
        ctx: &egui::Context,
    ) -> Result<(), String> {
        let b = self.link().ok_or("the model is not loaded yet")?;
        let lm = std::sync::Arc::clone(&b.lm);
        self.rt
            .kv_quality
            .start(lm, types, self.options.threads, ctx)
    }
}

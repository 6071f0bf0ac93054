//! The Tuner tab in the window: its form and plots (`panels::tuner`) over the run in progress
//! (`tune_run`), and the window's checks before a run starts (never beside a load or a sweep:
//! they would share the engine).

use std::path::PathBuf;

use super::command::Command;
use super::panels::tuner;
use super::tune_run::TuneRun;
use super::{TpsApp, renderer};

impl TpsApp {
    pub(super) fn tuner_tab_ui(&mut self, ui: &mut egui::Ui, cmds: &mut Vec<Command>) {
        let view = tuner::TunerView {
            run: self.rt.tuner.run.as_ref(),
            engine_knobs: self.rt.snapshot.as_ref().map(|s| &s.knobs),
            choosing_trace: self.rt.tuner.choosing_trace(),
        };
        let (s, dash) = (&mut self.state.tuner, &mut self.state.dash.knobs);
        renderer::central_panel(ui).show(ui, |ui| tuner::ui(ui, s, dash, &view, cmds));
    }

    /// Refuses a load or a sweep while the tuner measures the engine.
    pub(super) fn not_tuning(&self) -> Result<(), String> {
        match self.rt.tuner.running() {
            true => Err("stop the tuning run first: it measures the engine alone".into()),
            false => Ok(()),
        }
    }

    /// Starts the tuner over the engine (not beside a load or a sweep: they would share it).
    pub(super) fn start_tune(&mut self, ctx: &egui::Context) -> Result<(), String> {
        if self.rt.tuner.running() {
            return Err("a tuning run is already going".into());
        }
        if self.rt.load.is_some() || self.rt.sweep.is_some() {
            return Err(
                "stop the load or the sweep first: the tuner measures the engine alone".into(),
            );
        }
        let cfg = self.state.tuner.config()?;
        let trace = self.state.tuner.trace.clone();
        let b = self.link().ok_or("the model is not loaded yet")?;
        let base = b.engine.stats().knobs;
        let run = TuneRun::start(b.engine.clone(), &b.prompts, base, cfg, trace, ctx)?;
        self.rt.tuner.run = Some(run);
        Ok(())
    }

    /// Asks for a trace file on a worker; the frame's poll puts the answer in the form.
    pub(super) fn choose_trace(&mut self, ctx: &egui::Context) -> Result<(), String> {
        let at = (self.state.tuner.trace.clone()).unwrap_or_else(|| PathBuf::from("trace.jsonl"));
        self.rt.tuner.choose_trace(&self.dialogs, ctx, &at)
    }
}

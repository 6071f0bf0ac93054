//! The planner tab at run time: its device table ([`super::planner_table`]: the bundled one, a
//! file opened through the dialog seam or given as `tpslab --devices`, or this CPU's row
//! calibrated on the window's engine) and saving it for `tpslab plan --devices` /
//! `tpslab --devices`. The dialog, the calibration and the save run on workers; the frame only
//! polls them.

use std::path::{Path, PathBuf};

use tpslab_engine::plan::calibrate::{self, LEVELS, THIS_CPU};
use tpslab_engine::plan::{ModelShape, calibrate_device};

use super::TpsApp;
use super::files::{DialogRequest, DialogTask, FileDialog, PendingOpen};
use super::panels::planner::{self, TableAction};
use super::task::Task;

impl TpsApp {
    /// The planner tab's device table from `path` (one `tpslab plan --calibrate --save-devices`
    /// wrote, or an edited copy) instead of the bundled one; a table that does not load or
    /// check is shown in the tab as its error.
    pub fn set_device_table(&mut self, path: &Path) {
        self.rt.planner.load(path);
    }

    pub(super) fn planner_tab_ui(&mut self, ui: &mut egui::Ui) {
        self.rt.planner.poll();
        let loaded = self.link().map(|l| {
            let m = &l.lm.model;
            ModelShape::from_config(&l.model_name(), &m.cfg, m.weights.lm_head.is_none())
        });
        let busy = self.rt.planner.busy();
        let p = &mut self.rt.planner;
        // First use reads the bundled table.
        let _ = p.table();
        let view = planner::PlannerView {
            table: match &p.table {
                Some(Ok(t)) => Ok(t),
                Some(Err(e)) => Err(e.as_str()),
                None => Err("no device table"),
            },
            loaded: loaded.as_ref(),
            origin: &p.origin,
            busy,
            message: p.message.as_ref(),
        };
        let settings = &mut self.state.planner;
        let action = super::renderer::central_panel(ui)
            .show(ui, |ui| planner::ui(ui, settings, &view))
            .inner;
        if let Some(a) = action
            && let Err(e) = self.table_action(a, ui.ctx())
        {
            self.rt.planner.message = Some(Err(e));
        }
    }

    fn table_action(&mut self, a: TableAction, ctx: &egui::Context) -> Result<(), String> {
        match a {
            TableAction::Open => {
                let mut req = DialogRequest::for_path("Open a device table", &default_path());
                req.filters = vec![("JSON".into(), vec!["json".into()])];
                let ask = move |d: &dyn FileDialog| d.open_path(&req);
                self.rt.planner.opening = Some(PendingOpen::start(&self.dialogs, ctx, ask)?);
            }
            TableAction::Save => {
                let table = self.rt.planner.table()?.clone();
                let mut req = DialogRequest::for_path("Save the device table", &default_path());
                req.filters = vec![("JSON".into(), vec!["json".into()])];
                let job = DialogTask::save(&self.dialogs, req, default_path(), ctx, move |p| {
                    let text = serde_json::to_string_pretty(&table).map_err(|e| e.to_string())?;
                    std::fs::write(p, text).map_err(|e| format!("{}: {e}", p.display()))?;
                    Ok(p.to_path_buf())
                })?;
                self.rt.planner.saving = Some(job);
            }
            TableAction::Calibrate => self.start_calibration(ctx)?,
            TableAction::StopCalibration => {
                if let Some(t) = &self.rt.planner.calibrating {
                    t.cancel();
                }
            }
        }
        Ok(())
    }

    /// Measures the default model on the window's engine, alone on it, and refits `this-cpu`.
    fn start_calibration(&mut self, ctx: &egui::Context) -> Result<(), String> {
        self.not_tuning()?;
        if self.rt.load.is_some() || self.rt.sweep.is_some() {
            return Err(
                "stop the load test or the sweep first: the calibration measures the engine alone"
                    .into(),
            );
        }
        let b = self.link().ok_or("the model is not loaded yet")?;
        let m = &b.lm.model;
        let here = ModelShape::from_config(calibrate::SHAPE, &m.cfg, m.weights.lm_head.is_none());
        let default = ModelShape::synthetic(calibrate::SHAPE).map_err(|e| e.to_string())?;
        if here != default || b.lm.precision.to_string() != calibrate::PRECISION.to_string() {
            return Err(format!(
                "the calibration measures the default model ({}, {}); load it first",
                calibrate::SHAPE,
                calibrate::PRECISION
            ));
        }
        let stats = b.engine.stats();
        let knobs = stats.knobs;
        let need = LEVELS[LEVELS.len() - 1];
        if knobs.scheduler.max_num_seqs < need {
            return Err(format!(
                "the calibration runs {need} requests at once; raise the batch cap to {need} first"
            ));
        }
        let budget = knobs.scheduler.max_num_batched_tokens;
        let (engine, prompts) = (b.engine.clone(), b.prompts.clone());
        let threads = stats.threads;
        let table = self.rt.planner.table()?.clone();
        let task = Task::spawn("calibrate", "Calibrating this CPU".into(), ctx, move |r| {
            let stop = r.cancel_flag();
            let source = calibrate::run_source("the window's planner", threads);
            let mut rows = Vec::new();
            for (i, c) in LEVELS.iter().enumerate() {
                r.report(i as u64, LEVELS.len() as u64, &format!("{c} concurrent"));
                rows.push(
                    calibrate::measure_level(&engine, &prompts, i, budget, &source, &stop)
                        .map_err(|e| e.to_string())?,
                );
            }
            let device = table.device(THIS_CPU).map_err(|e| e.to_string())?;
            calibrate_device(&table, device, rows, &source).map_err(|e| e.to_string())
        })?;
        self.rt.planner.calibrating = Some(task);
        self.rt.planner.message = None;
        Ok(())
    }
}

/// Where a table is proposed to be saved and opened: `devices.json` in the app's home folder.
fn default_path() -> PathBuf {
    tpslab_engine::library::home_dir()
        .map(|h| h.join("devices.json"))
        .unwrap_or_else(|_| PathBuf::from("devices.json"))
}

//! The planner tab's device table as state: the bundled one (read on first use), a file, or
//! one whose `this-cpu` row was calibrated here; the jobs on it (a dialog, a calibration, a
//! save), each on a worker, polled once per frame. `planner_run` starts the jobs.

use std::path::{Path, PathBuf};

use tpslab_engine::plan::{DeviceSpec, DeviceTable};

use super::files::{DialogAnswer, DialogOutcome, DialogTask, PendingOpen};
use super::task::Task;

/// The planner's device table and the jobs on it.
#[derive(Default)]
pub struct PlannerTable {
    /// Read on first use (the bundled table), or opened, or calibrated.
    pub(super) table: Option<Result<DeviceTable, String>>,
    /// Where the table came from.
    pub(super) origin: String,
    pub(super) opening: Option<PendingOpen>,
    pub(super) calibrating: Option<Task<DeviceSpec>>,
    pub(super) saving: Option<DialogTask<PathBuf>>,
    /// The last job's outcome, for the tab.
    pub(super) message: Option<Result<String, String>>,
}

impl PlannerTable {
    /// The table from `path`; one that does not load or check is the tab's error.
    pub fn load(&mut self, path: &Path) {
        self.table = Some(DeviceTable::load(path).map_err(|e| e.to_string()));
        self.origin = path.display().to_string();
    }

    pub(super) fn table(&mut self) -> Result<&DeviceTable, &str> {
        if self.table.is_none() {
            self.table = Some(DeviceTable::bundled().map_err(|e| e.to_string()));
            self.origin = "bundled".into();
        }
        match &self.table {
            Some(Ok(t)) => Ok(t),
            Some(Err(e)) => Err(e),
            None => Err("no device table"),
        }
    }

    /// The workers' news.
    pub(super) fn poll(&mut self) {
        if let Some(answer) = self.opening.as_ref().and_then(PendingOpen::poll) {
            self.opening = None;
            match answer {
                DialogAnswer::Chosen(p) => {
                    self.load(&p);
                    self.message = None;
                }
                DialogAnswer::Cancelled => {}
                DialogAnswer::Unavailable(why) => {
                    self.message = Some(Err(format!("cannot open a table: {why}")));
                }
            }
        }
        if let Some(done) = self.calibrating.as_mut().and_then(Task::poll) {
            self.calibrating = None;
            self.message = Some(done.and_then(|d| self.calibrated(d)));
        }
        if let Some(outcome) = self.saving.as_ref().and_then(DialogTask::poll) {
            self.saving = None;
            self.message = match outcome {
                DialogOutcome::Done { value, fallback } => Some(Ok(match fallback {
                    None => format!("Table saved: {}", value.display()),
                    Some(why) => format!(
                        "Table saved to the default place ({why}): {}",
                        value.display()
                    ),
                })),
                DialogOutcome::Cancelled => None,
                DialogOutcome::Failed(e) => Some(Err(format!("cannot save the table: {e}"))),
            };
        }
    }

    /// Puts the calibrated row in the table; says what moved and what the held-out runs say.
    fn calibrated(&mut self, new: DeviceSpec) -> Result<String, String> {
        let Some(Ok(table)) = &mut self.table else {
            return Err("the table went away during the calibration".into());
        };
        let old = table.replace_device(new).map_err(|e| e.to_string())?;
        let new = table.device(&old.id).map_err(|e| e.to_string())?;
        self.origin = format!("{} with {} calibrated here", self.origin, old.id);
        let held_out =
            tpslab_engine::plan::source(table, new).map_or_else(|e| e.to_string(), |s| s.text);
        Ok(format!(
            "{} calibrated: bandwidth {:.1} GB/s (was {:.1}). {held_out}",
            old.id, new.bandwidth_gb_s.value, old.bandwidth_gb_s.value
        ))
    }

    pub(super) fn busy(&self) -> Option<String> {
        if let Some(t) = &self.calibrating {
            return Some(format!("{}: {}", t.what, t.progress.text));
        }
        (self.opening.is_some() || self.saving.is_some())
            .then(|| "waiting for the file dialog".into())
    }
}

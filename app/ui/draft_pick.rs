//! The draft model of speculative decoding, chosen in the window: loaded from the library on a
//! worker, then handed to the engine, which checks that it shares the model's vocabulary.

use std::path::PathBuf;
use std::sync::Arc;

use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::engine::EngineHandle;

use crate::ui::task::Task;

/// A draft model being loaded for an engine.
pub struct DraftLoad {
    task: Task<Arc<LoadedModel>>,
    engine: EngineHandle,
}

impl DraftLoad {
    /// Loads `path` on a worker for `engine`.
    pub fn start(path: PathBuf, engine: EngineHandle, ctx: &egui::Context) -> Result<Self, String> {
        let what = format!("Loading the draft model {}", path.display());
        let task = Task::spawn("draft-load", what, ctx, move |_| {
            LoadedModel::load(&path)
                .map(Arc::new)
                .map_err(|e| format!("cannot load the draft model {}: {e}", path.display()))
        })?;
        Ok(Self { task, engine })
    }

    /// Once loaded, hands the model to the engine (whose snapshot then names it, or says why it
    /// was refused); `Some` when the load is over: the engine, or the error of a failed load.
    pub fn poll(&mut self) -> Option<Result<EngineHandle, String>> {
        let loaded = self.task.poll()?;
        Some(loaded.map(|m| {
            self.engine.set_draft(Some(m));
            self.engine.clone()
        }))
    }
}

//! The bridge to the engine: loading the model and starting the engine on a worker thread.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};

use tpslab_engine::engine::{EngineConfig, EngineHandle, Knobs};
use tpslab_engine::generate::LoadedModel;
use tpslab_engine::library;
use tpslab_engine::loadgen::{self, PromptSet};

/// A loaded model with its running engine: everything the panels need to submit work.
pub struct Backend {
    pub lm: Arc<LoadedModel>,
    pub engine: EngineHandle,
    /// Prompts the load generator cuts its requests from.
    pub prompts: PromptSet,
    pub path: PathBuf,
    pub threads: usize,
}

impl Backend {
    /// The model's file name, as the status bar shows it.
    pub fn model_name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// Where the model is: loading (with the latest progress line), ready, or failed with a reason.
pub enum ModelSlot {
    NotStarted,
    Loading {
        rx: Receiver<LoadMsg>,
        status: String,
    },
    Ready(Box<Backend>),
    Failed(String),
}

/// What the loading worker sends: progress lines, then exactly one result.
pub enum LoadMsg {
    Progress(String),
    Done(Result<Box<Backend>, String>),
}

impl ModelSlot {
    pub fn backend(&self) -> Option<&Backend> {
        match self {
            ModelSlot::Ready(b) => Some(b),
            _ => None,
        }
    }

    /// Starts fetching and loading `spec` on a worker thread. The engine's per-step callback and
    /// the worker's messages both wake the UI with `repaint`.
    pub fn start_loading(
        spec: String,
        threads: usize,
        knobs: Knobs,
        ctx: egui::Context,
    ) -> ModelSlot {
        let (tx, rx) = mpsc::channel();
        let worker = std::thread::Builder::new()
            .name("tpslab-model-load".into())
            .spawn(move || {
                let progress_tx = tx.clone();
                let progress_ctx = ctx.clone();
                let mut progress = move |msg: &str| {
                    let _ = progress_tx.send(LoadMsg::Progress(msg.to_owned()));
                    progress_ctx.request_repaint();
                };
                let result = load(&spec, threads, knobs, &ctx, &mut progress);
                // Send the result first, then wake the UI (it reads the result in the next frame).
                let _ = tx.send(LoadMsg::Done(result));
                ctx.request_repaint();
            });
        match worker {
            Ok(_) => ModelSlot::Loading {
                rx,
                status: "loading the model ...".into(),
            },
            Err(e) => ModelSlot::Failed(format!("cannot start the loading thread: {e}")),
        }
    }

    /// Reads the worker's messages (never blocks). Returns true when the model just became ready.
    pub fn poll(&mut self) -> bool {
        let ModelSlot::Loading { rx, status } = self else {
            return false;
        };
        loop {
            match rx.try_recv() {
                Ok(LoadMsg::Progress(p)) => *status = p,
                Ok(LoadMsg::Done(Ok(b))) => {
                    *self = ModelSlot::Ready(b);
                    return true;
                }
                Ok(LoadMsg::Done(Err(e))) => {
                    *self = ModelSlot::Failed(e);
                    return false;
                }
                Err(TryRecvError::Empty) => return false,
                Err(TryRecvError::Disconnected) => {
                    *self = ModelSlot::Failed("the loading thread ended without a result".into());
                    return false;
                }
            }
        }
    }
}

fn load(
    spec: &str,
    threads: usize,
    knobs: Knobs,
    ctx: &egui::Context,
    progress: &mut dyn FnMut(&str),
) -> Result<Box<Backend>, String> {
    let path = library::resolve_model(spec, progress).map_err(|e| e.to_string())?;
    progress(&format!("loading {} ...", path.display()));
    let lm = LoadedModel::load(&path)
        .map_err(|e| format!("cannot load model {}: {e}", path.display()))?;
    let lm = Arc::new(lm);
    let prompts = lm
        .raw_prompt(loadgen::PROMPT_TEXT)
        .ok()
        .and_then(PromptSet::new)
        .ok_or_else(|| "cannot tokenize the load-test prompt text".to_string())?;
    let repaint_ctx = ctx.clone();
    let engine = EngineHandle::start(
        Arc::clone(&lm),
        EngineConfig {
            threads,
            knobs,
            ..EngineConfig::default()
        },
        Some(Box::new(move || repaint_ctx.request_repaint())),
    )
    .map_err(|e| e.to_string())?;
    let threads = match threads {
        0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
        n => n,
    };
    Ok(Box::new(Backend {
        lm,
        engine,
        prompts,
        path,
        threads,
    }))
}

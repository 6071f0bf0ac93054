//! The window's link to the engine: the model it loaded and the engine running over it
//! ([`EngineLink`]), the slot that loads or restarts them on a worker thread ([`ModelSlot`]), and
//! the device choice saved with the window ([`DevicePref`], and with where a mixture of experts'
//! experts run, [`Placement`]). Not the engine's own compute
//! `Backend`: this is what the panels hold to submit work.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};

use serde::{Deserialize, Serialize};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};
use tpslab_engine::serving::loadgen::{self, PromptSet};
use tpslab_engine::spec::SpecMethod;

/// The device choice as saved with the window's state (the engine's [`DeviceChoice`] is not
/// serde). The default is `Auto`: the GPU where there is one, else the CPU.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum DevicePref {
    #[default]
    Auto,
    Cpu,
    /// GPU by CUDA ordinal.
    Cuda(usize),
}

impl From<DeviceChoice> for DevicePref {
    fn from(d: DeviceChoice) -> Self {
        match d {
            DeviceChoice::Auto => Self::Auto,
            DeviceChoice::Cpu => Self::Cpu,
            DeviceChoice::Cuda(n) => Self::Cuda(n),
        }
    }
}

impl From<DevicePref> for DeviceChoice {
    fn from(d: DevicePref) -> Self {
        match d {
            DevicePref::Auto => Self::Auto,
            DevicePref::Cpu => Self::Cpu,
            DevicePref::Cuda(n) => Self::Cuda(n),
        }
    }
}

impl std::fmt::Display for DevicePref {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        DeviceChoice::from(*self).fmt(f)
    }
}

/// Where the window's engine runs: the device, and on a GPU the blocks whose experts stay in
/// host memory for the CPU to run (`--n-cpu-moe`; 0 uploads them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placement {
    pub device: DeviceChoice,
    pub cpu_moe_layers: usize,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.cpu_moe_layers {
            0 => self.device.fmt(f),
            n => write!(f, "{} (experts of {n} blocks on the CPU)", self.device),
        }
    }
}

/// The window's link to the engine: a loaded model with the engine running over it, and the
/// prompts the load generator cuts from it; everything the panels need to submit work.
pub struct EngineLink {
    pub lm: Arc<LoadedModel>,
    pub engine: EngineHandle,
    /// Prompts the load generator cuts its requests from.
    pub prompts: PromptSet,
    pub path: PathBuf,
    /// Compute threads as asked (0 = one per core).
    pub threads: usize,
}

impl EngineLink {
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
        /// While the engine restarts on another device: the running one, kept until the new one
        /// is up, and kept on if it fails to start.
        previous: Option<Box<EngineLink>>,
    },
    Ready(Box<EngineLink>),
    Failed(String),
}

/// What [`ModelSlot::poll`] saw happen this frame.
#[derive(Debug, PartialEq)]
pub enum SlotNews {
    Nothing,
    Ready,
    /// Loading or starting failed; the slot holds the reason.
    Failed,
    /// The engine could not restart on another device; the previous one runs on.
    RestartFailed(String),
}

/// What the loading worker sends: progress lines, then exactly one result.
pub enum LoadMsg {
    Progress(String),
    Done(Result<Box<EngineLink>, String>),
}

impl ModelSlot {
    pub fn link(&self) -> Option<&EngineLink> {
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
        device: Placement,
        knobs: Knobs,
        ctx: egui::Context,
    ) -> ModelSlot {
        Self::load_over(None, spec, threads, device, knobs, ctx)
    }

    /// Loads `spec` and starts an engine on it on a worker thread while `previous` (if any)
    /// keeps running; `previous` is dropped once the new engine is up, and stays if it fails
    /// ([`poll`](Self::poll) reports why).
    pub fn load_over(
        previous: Option<Box<EngineLink>>,
        spec: String,
        threads: usize,
        device: Placement,
        knobs: Knobs,
        ctx: egui::Context,
    ) -> ModelSlot {
        spawn_worker(
            ctx,
            "loading the model ...".into(),
            previous,
            move |ctx, progress| {
                let cfg = crate::hub::HubConfig::resolve(None, None);
                let path = crate::hub::resolve_model(&spec, None, &cfg, progress)
                    .map_err(|e| format!("{e:#}"))?;
                progress(&format!("loading {} ...", path.display()));
                let lm = LoadedModel::load(&path)
                    .map_err(|e| format!("cannot load model {}: {e}", path.display()))?;
                let lm = Arc::new(lm);
                let prompts = lm
                    .raw_prompt(loadgen::PROMPT_TEXT)
                    .ok()
                    .and_then(PromptSet::new)
                    .ok_or_else(|| "cannot tokenize the load-test prompt text".to_string())?;
                progress(&format!("starting the engine on {device} ..."));
                let engine = start_engine(&lm, threads, device, knobs, ctx)?;
                Ok(Box::new(EngineLink {
                    lm,
                    engine,
                    prompts,
                    path,
                    threads,
                }))
            },
        )
    }

    /// Starts a new engine for `previous`'s model on `device` on a worker thread (the model
    /// stays loaded). `previous` keeps running until the new engine is up; if that fails, it
    /// stays and [`poll`](Self::poll) reports why.
    pub fn restart(
        previous: Box<EngineLink>,
        device: Placement,
        knobs: Knobs,
        ctx: egui::Context,
    ) -> ModelSlot {
        let (lm, prompts, path, threads) = (
            Arc::clone(&previous.lm),
            previous.prompts.clone(),
            previous.path.clone(),
            previous.threads,
        );
        let status = format!("starting the engine on {device} ...");
        spawn_worker(ctx, status, Some(previous), move |ctx, _| {
            let engine = start_engine(&lm, threads, device, knobs, ctx)?;
            Ok(Box::new(EngineLink {
                lm,
                engine,
                prompts,
                path,
                threads,
            }))
        })
    }

    /// Reads the worker's messages (never blocks).
    pub fn poll(&mut self) -> SlotNews {
        let ModelSlot::Loading {
            rx,
            status,
            previous,
        } = self
        else {
            return SlotNews::Nothing;
        };
        let result = loop {
            match rx.try_recv() {
                Ok(LoadMsg::Progress(p)) => *status = p,
                Ok(LoadMsg::Done(r)) => break r,
                Err(TryRecvError::Empty) => return SlotNews::Nothing,
                Err(TryRecvError::Disconnected) => {
                    break Err("the loading thread ended without a result".into());
                }
            }
        };
        let previous = previous.take();
        match (result, previous) {
            (Ok(b), previous) => {
                *self = ModelSlot::Ready(b);
                if let Some(old) = previous {
                    // Dropping the old engine joins its thread (up to one step): not on the UI
                    // thread. If no thread can start, the closure drops it here instead.
                    let _ = std::thread::Builder::new()
                        .name("tpslab-engine-drop".into())
                        .spawn(move || drop(old));
                }
                SlotNews::Ready
            }
            (Err(e), Some(old)) => {
                *self = ModelSlot::Ready(old);
                SlotNews::RestartFailed(e)
            }
            (Err(e), None) => {
                *self = ModelSlot::Failed(e);
                SlotNews::Failed
            }
        }
    }
}

/// Runs `work` on a worker thread: its progress lines and then its result come back through the
/// slot's channel, each followed by a repaint.
fn spawn_worker(
    ctx: egui::Context,
    status: String,
    previous: Option<Box<EngineLink>>,
    work: impl FnOnce(&egui::Context, &mut dyn FnMut(&str)) -> Result<Box<EngineLink>, String>
    + Send
    + 'static,
) -> ModelSlot {
    let (tx, rx) = mpsc::channel();
    let failed_tx = tx.clone();
    let worker = std::thread::Builder::new()
        .name("tpslab-model-load".into())
        .spawn(move || {
            let progress_tx = tx.clone();
            let progress_ctx = ctx.clone();
            let mut progress = move |msg: &str| {
                let _ = progress_tx.send(LoadMsg::Progress(msg.to_owned()));
                progress_ctx.request_repaint();
            };
            let result = work(&ctx, &mut progress);
            // Send the result first, then wake the UI (it reads the result in the next frame).
            let _ = tx.send(LoadMsg::Done(result));
            ctx.request_repaint();
        });
    if let Err(e) = worker {
        // Reported through the channel like any failure, so `poll` handles it in one place.
        let msg = format!("cannot start the loading thread: {e}");
        let _ = failed_tx.send(LoadMsg::Done(Err(msg)));
    }
    ModelSlot::Loading {
        rx,
        status,
        previous,
    }
}

/// Starts the engine over `lm` on `device`; the engine's per-step callback wakes the UI, paced
/// ([`super::pacing::wake`]: one frame per interval, never one per step).
fn start_engine(
    lm: &Arc<LoadedModel>,
    threads: usize,
    device: Placement,
    mut knobs: Knobs,
    ctx: &egui::Context,
) -> Result<EngineHandle, String> {
    // A new engine has no draft model (one is chosen again in the dashboard, and loads then).
    if knobs.spec.method == SpecMethod::Draft {
        knobs.spec.method = SpecMethod::Off;
    }
    let repaint_ctx = ctx.clone();
    EngineHandle::start(
        Arc::clone(lm),
        EngineConfig {
            threads,
            knobs,
            device: device.device,
            // The dashboard's KV budget knob sizes the pool on every device.
            gpu_kv_fraction: 0.0,
            cpu_moe_layers: device.cpu_moe_layers,
            draft: None,
        },
        Some(Box::new(move || super::pacing::wake(&repaint_ctx))),
    )
    .map_err(|e| format!("cannot start the engine on {device}: {e}"))
}

//! `Command`: what the panels ask the app for, returned from their frame and applied by the app
//! once per frame, and `ChatCommand`, the Chat page's own. A leaf: it names no panel, so every
//! panel can return one.

use std::path::PathBuf;

use tpslab_engine::kv::KvTypes;
use tpslab_engine::serving::engine::Knobs;
use tpslab_kernels::WType;

use super::engine_link::DevicePref;

/// What the panels ask for; applied by [`TpsApp::apply`](super::TpsApp::apply) at the end of
/// the frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// The Chat page's own, applied by its panel.
    Chat(ChatCommand),
    SetKnobs(Knobs),
    /// Re-quantize the loaded weights to this type.
    SetPrecision(WType),
    ResetMetrics,
    StartLoad,
    StopLoad,
    StartSweep,
    StopSweep,
    SaveSweep,
    DismissError(usize),
    SetDevice(DevicePref),
    /// Restart the engine with the experts of this many blocks in host memory (on a GPU).
    SetCpuMoe(usize),
    /// Restart the engine on this model file.
    LoadModel(PathBuf),
    /// Load this library model as the draft model, then apply the draft method.
    SetDraftModel(PathBuf),
    StartServer,
    StopServer,
    /// Start the SLO tuner with the Tuner tab's settings over the window's engine.
    StartTune,
    StopTune,
    /// Ask for a recorded trace (`tpslab serve --record-trace`) as the tuner's workload.
    ChooseTrace,
    /// Measure what these KV types cost in quality against f16 KV (the dashboard's KV section).
    MeasureKvQuality(KvTypes),
    CancelKvQuality,
}

/// What the Chat page asks for (its panel applies them); `chat` is a conversation's id.
#[derive(Debug, Clone, PartialEq)]
pub enum ChatCommand {
    Send {
        chat: u64,
        text: String,
    },
    Stop {
        chat: u64,
    },
    /// Answer the last turn again, the earlier answer kept as a branch.
    Regenerate {
        chat: u64,
    },
    /// Replace the user's message `index` with `text`, drop what followed it, answer again.
    EditResend {
        chat: u64,
        index: usize,
        text: String,
    },
    /// Show branch `branch` (0-based) of answer `index`.
    ShowBranch {
        chat: u64,
        index: usize,
        branch: usize,
    },
    New,
    Select(u64),
    Delete(u64),
    /// Save a conversation as JSON (importable) or Markdown, through the file dialog.
    Export {
        chat: u64,
        markdown: bool,
    },
    /// Add a conversation from a JSON export, through the file dialog.
    Import,
}

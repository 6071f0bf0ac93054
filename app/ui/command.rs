//! `Command`: what the panels ask the app for, returned from their frame and applied by the app
//! once per frame. A leaf: it names no panel, so every panel can return one.

use std::path::PathBuf;

use tpslab_engine::serving::engine::Knobs;
use tpslab_kernels::WType;

use super::engine_link::DevicePref;

/// What the panels ask for; applied by [`TpsApp::apply`](super::TpsApp::apply) at the end of
/// the frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    Send {
        chat: u64,
        text: String,
    },
    Stop {
        chat: u64,
    },
    Regenerate {
        chat: u64,
    },
    NewChat,
    SelectChat(u64),
    DeleteChat(u64),
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
}

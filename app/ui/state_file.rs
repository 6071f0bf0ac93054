//! The window's saved state (chats, settings) in a file of its own, `window-state.json` in the
//! TPS Lab home folder, written whole or not at all ([`tpslab_engine::library::write_whole`]:
//! a synced temporary file renamed over the last one). eframe's own storage rewrites its file
//! in place, so a crash in the middle of an autosave lost every conversation; it is kept as a
//! second copy, read when this file is missing or unreadable.

use std::path::{Path, PathBuf};

use serde::Serialize;
use serde::de::DeserializeOwned;

/// Where the state lives: `$TPSLAB_HOME/window-state.json` (or the platform's data folder).
pub fn default_path() -> Option<PathBuf> {
    tpslab_engine::library::home_dir()
        .ok()
        .map(|h| h.join("window-state.json"))
}

/// Writes `state` as JSON to `path`, whole or not at all (creating its folder).
pub fn save<T: Serialize>(path: &Path, state: &T) -> std::io::Result<()> {
    let json = serde_json::to_vec(state).map_err(std::io::Error::other)?;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    tpslab_engine::library::write_whole(path, &json)
}

/// The state saved at `path`, if there is one and it parses. What saves killed mid-way left
/// beside it is removed ([`tpslab_engine::library::remove_stale_temps`]).
pub fn load<T: DeserializeOwned>(path: &Path) -> Option<T> {
    tpslab_engine::library::remove_stale_temps(path);
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice(&bytes).ok()
}

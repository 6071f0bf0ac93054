//! The window's saved state (chats, settings) in a file of its own, `window-state.json` in the
//! TPS Lab home folder, written whole or not at all ([`tpslab_engine::library::write_whole`]:
//! a synced temporary file renamed over the last one). eframe's own storage rewrites its file
//! in place, so a crash in the middle of an autosave lost every conversation; it is kept as a
//! second copy, read when this file is missing or unreadable.
//!
//! Besides eframe's periodic save, the window saves as soon as a conversation has changed (a
//! message sent, an answer ended) through a [`Saver`], whose worker writes: a crash loses at
//! most the answer being written.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex};

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

/// Saves the state to one file from the frame without waiting on the disk: the frame only
/// serializes, a worker writes (the newest state waiting first). Each save is numbered, and one
/// older than the file's is never written over it, so a later [`Saver::save_now`] (on exit)
/// cannot be undone by a write still in flight.
pub struct Saver {
    path: PathBuf,
    tx: Option<Sender<(u64, Vec<u8>)>>,
    next: u64,
    /// The number of the save the file holds.
    written: Arc<Mutex<u64>>,
}

impl Saver {
    /// A saver of `path`; without a worker thread, saves are written at once.
    pub fn new(path: PathBuf) -> Self {
        let written = Arc::new(Mutex::new(0));
        let (tx, rx) = mpsc::channel::<(u64, Vec<u8>)>();
        let (dest, done) = (path.clone(), Arc::clone(&written));
        let worker = std::thread::Builder::new()
            .name("tpslab-state-save".into())
            .spawn(move || {
                while let Ok(mut job) = rx.recv() {
                    // Only the newest of those waiting is worth writing.
                    while let Ok(newer) = rx.try_recv() {
                        job = newer;
                    }
                    if let Err(e) = write(&dest, &done, job) {
                        eprintln!("cannot save the window's state to {}: {e}", dest.display());
                    }
                }
            });
        Self {
            path,
            tx: worker.is_ok().then_some(tx),
            next: 0,
            written,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serializes `state` and has the worker write it.
    pub fn save_later<T: Serialize>(&mut self, state: &T) -> std::io::Result<()> {
        let job = self.job(state)?;
        match &self.tx {
            Some(tx) => tx
                .send(job)
                .map_err(|_| std::io::Error::other("the save worker stopped")),
            None => write(&self.path, &self.written, job),
        }
    }

    /// Writes `state` now (on exit).
    pub fn save_now<T: Serialize>(&mut self, state: &T) -> std::io::Result<()> {
        let job = self.job(state)?;
        write(&self.path, &self.written, job)
    }

    fn job<T: Serialize>(&mut self, state: &T) -> std::io::Result<(u64, Vec<u8>)> {
        self.next += 1;
        let json = serde_json::to_vec(state).map_err(std::io::Error::other)?;
        Ok((self.next, json))
    }
}

/// Writes save `n` unless the file already holds a later one.
fn write(path: &Path, written: &Mutex<u64>, (n, json): (u64, Vec<u8>)) -> std::io::Result<()> {
    let mut last = written.lock().unwrap_or_else(|p| p.into_inner());
    if n <= *last {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    tpslab_engine::library::write_whole(path, &json)?;
    *last = n;
    Ok(())
}

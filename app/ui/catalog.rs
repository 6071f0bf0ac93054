//! The model library as the window sees it: a thin adapter over the engine's library index
//! ([`tpslab_engine::library::index`]): listing (models without a manifest are hashed and indexed
//! once, on the scan worker), importing a GGUF or a safetensors folder, and recording a
//! quantizer output's source. The panels call only these functions, and share the library's
//! folder and last scan as one [`Library`].

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use tpslab_engine::library::hf_cache::HfCache;
pub use tpslab_engine::library::index::ModelEntry;
use tpslab_engine::library::index::{Library as Index, ModelSource};
use tpslab_engine::quant::preset::Preset;

use super::task::Task;

/// What a scan found: the models, and the entries it could not read (shown, not fatal).
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub models: Vec<ModelEntry>,
    pub unreadable: Vec<String>,
}

/// Lists the library at `dir`, hashing and indexing models seen for the first time, and the
/// Hugging Face cache's GGUF models beside them (source `hf-cache`, read in place).
pub fn scan(dir: &Path) -> Result<Scan, String> {
    let (models, unreadable) = Index::at(dir)
        .with_hf_cache(HfCache::locate())
        .list_indexed()
        .map_err(|e| e.to_string())?;
    Ok(Scan { models, unreadable })
}

/// Copies the model `src` (a GGUF file or a safetensors folder) into the library at `dir` (checked
/// before and after copying; nothing is left behind on failure or cancel) and returns the path to
/// load. `progress(done, total)` in bytes.
pub fn import(
    src: &Path,
    dir: &Path,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64, u64),
) -> Result<PathBuf, String> {
    Index::at(dir)
        .import(src, cancel, progress)
        .map(|e| e.path)
        .map_err(|e| format!("cannot import {}: {e}", src.display()))
}

/// Records that `out` (in the library at `dir`) was quantized from `from` to `target`.
pub fn register_quantized(
    dir: &Path,
    out: &Path,
    from: &Path,
    target: Preset,
) -> Result<(), String> {
    let source = ModelSource::Quantized {
        from: file_name(from),
        target: target.to_string(),
    };
    Index::at(dir)
        .register(&file_name(out), source)
        .map(|_| ())
        .map_err(|e| format!("cannot index {}: {e}", out.display()))
}

pub fn file_name(p: &Path) -> String {
    p.file_name().map_or_else(
        || p.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// "135M", "1.2B": a parameter count the way model cards write it.
pub fn params_text(n: u64) -> String {
    match n {
        0 => "–".into(),
        n if n >= 1_000_000_000 => format!("{:.1}B", n as f64 / 1e9),
        n if n >= 1_000_000 => format!("{:.0}M", n as f64 / 1e6),
        n => format!("{:.0}K", n as f64 / 1e3),
    }
}

/// "98.4 MiB", "4.2 GiB".
pub fn size_text(bytes: u64) -> String {
    let mib = bytes as f64 / (1u64 << 20) as f64;
    if mib >= 1024.0 {
        format!("{:.2} GiB", mib / 1024.0)
    } else {
        format!("{mib:.1} MiB")
    }
}

/// The library as the panels share it: its folder, the last scan and the scan in flight.
pub struct Library {
    pub dir: PathBuf,
    pub models: Vec<ModelEntry>,
    /// Files in the folder that did not parse as models (shown, not fatal).
    pub unreadable: Vec<String>,
    pub error: Option<String>,
    scan: Option<Task<Scan>>,
    /// A rescan was asked for while one ran (a file may have landed after it listed the folder).
    again: bool,
    scanned: bool,
}

impl Library {
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            models: Vec::new(),
            unreadable: Vec::new(),
            error: None,
            scan: None,
            again: false,
            scanned: false,
        }
    }

    /// The folder the engine's library uses (`TPSLAB_HOME/models`).
    pub fn default_dir() -> PathBuf {
        tpslab_engine::library::models_dir().unwrap_or_else(|_| PathBuf::from("models"))
    }

    /// Lists the folder again on a worker.
    pub fn rescan(&mut self, ctx: &egui::Context) {
        if self.scan.is_some() {
            self.again = true;
            return;
        }
        let dir = self.dir.clone();
        match Task::spawn(
            "library-scan",
            "Reading the library".into(),
            ctx,
            move |_| scan(&dir),
        ) {
            Ok(t) => self.scan = Some(t),
            Err(e) => self.error = Some(e),
        }
    }

    /// Takes in a finished scan (the first call starts one).
    pub fn poll(&mut self, ctx: &egui::Context) {
        if !self.scanned {
            self.scanned = true;
            self.rescan(ctx);
        }
        let Some(result) = self.scan.as_mut().and_then(Task::poll) else {
            return;
        };
        self.scan = None;
        match result {
            Ok(s) => {
                self.models = s.models;
                self.unreadable = s.unreadable;
                self.error = None;
            }
            Err(e) => self.error = Some(e),
        }
        if std::mem::take(&mut self.again) {
            self.rescan(ctx);
        }
    }

    pub fn scanning(&self) -> bool {
        self.scan.is_some()
    }

    pub fn find(&self, path: &Path) -> Option<&ModelEntry> {
        self.models.iter().find(|m| same_file(&m.path, path))
    }
}

/// The same file, whether or not the two paths are spelled alike.
pub fn same_file(a: &Path, b: &Path) -> bool {
    a == b || matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_counts_read_as_people_write_them() {
        assert_eq!(params_text(134_515_008), "135M");
        assert_eq!(params_text(8_030_261_248), "8.0B");
        assert_eq!(size_text(103_179_040), "98.4 MiB");
        assert_eq!(size_text(5 << 30), "5.00 GiB");
    }
}

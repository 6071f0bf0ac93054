//! The model library as the window sees it: a thin adapter over the engine's library index
//! ([`tpslab_engine::library::index`]): listing (models without a manifest are hashed and indexed
//! once, on the scan worker), importing a GGUF or a safetensors folder, and recording a
//! quantizer output's source. The panels call only these functions.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

pub use tpslab_engine::library::index::ModelEntry;
use tpslab_engine::library::index::{Library as Index, ModelSource};
use tpslab_kernels::WType;

/// What a scan found: the models, and the entries it could not read (shown, not fatal).
#[derive(Debug, Clone, Default)]
pub struct Scan {
    pub models: Vec<ModelEntry>,
    pub unreadable: Vec<String>,
}

/// Lists the library at `dir`, hashing and indexing models seen for the first time.
pub fn scan(dir: &Path) -> Result<Scan, String> {
    let (models, unreadable) = Index::at(dir).list_indexed().map_err(|e| e.to_string())?;
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
    target: WType,
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

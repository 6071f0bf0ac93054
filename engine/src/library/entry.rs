//! What the library's index records of a model (its format, source, files and shape facts) and
//! why a library operation fails: the types both the index and the describing of a model use.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::library::LibraryError;
use tpslab_kernels::WType;

/// The file format of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelFormat {
    Gguf,
    Safetensors,
}

/// Where a model came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ModelSource {
    /// The built-in default model, from its PyPI package.
    Default { package: String },
    /// Downloaded from a Hugging Face Hub repository.
    Hub {
        repo: String,
        revision: String,
        /// The commit the revision pointed at when downloaded.
        commit: Option<String>,
    },
    /// Copied in from a local path.
    Imported { from: PathBuf },
    /// Written by the quantizer from another model.
    Quantized { from: String, target: String },
    /// Found in the folder with nothing known about where it came from.
    Local,
    /// In the Hugging Face cache (`huggingface_hub`'s layout), loaded where it is: not in the
    /// library folder, never copied ([`crate::library::hf_cache`]).
    HfCache {
        repo: String,
        /// The snapshot's commit (`refs/main`).
        commit: String,
    },
}

impl std::fmt::Display for ModelSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Default { package } => write!(f, "default ({package})"),
            Self::Hub { repo, revision, .. } if revision == "main" => write!(f, "hub {repo}"),
            Self::Hub { repo, revision, .. } => write!(f, "hub {repo}@{revision}"),
            Self::Imported { from } => write!(f, "imported {}", from.display()),
            Self::Quantized { from, target } => write!(f, "quantized {from} -> {target}"),
            Self::Local => write!(f, "local file"),
            Self::HfCache { repo, .. } => write!(f, "hf-cache {repo}"),
        }
    }
}

/// What a model stores most of its matrix bytes in, as the library lists it: named even where
/// the kernels cannot run it, since the library lists every model it holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub enum StoredType {
    /// A ggml type: a GGUF's tensors, or a safetensors F32/F16/BF16.
    Ggml(WType),
    /// A safetensors dtype that ggml has no type for ("I8", "F8_E4M3"), as its header spells it.
    Dtype(String),
    /// Nothing says: a folder whose tensors and config name no dtype.
    #[default]
    Unknown,
}

impl StoredType {
    /// A safetensors header's dtype name: a ggml type where ggml has one.
    pub fn from_dtype(dtype: &str) -> Self {
        match dtype.parse() {
            Ok(t) => Self::Ggml(t),
            Err(_) => Self::Dtype(dtype.to_string()),
        }
    }
}

impl std::fmt::Display for StoredType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Ggml(t) => f.pad(t.name()),
            Self::Dtype(d) => f.pad(d),
            Self::Unknown => f.pad("unknown"),
        }
    }
}

/// Its label read back: any label names some stored type.
impl std::str::FromStr for StoredType {
    type Err = std::convert::Infallible;

    fn from_str(label: &str) -> Result<Self, Self::Err> {
        Ok(match label {
            "unknown" | "" => Self::Unknown,
            l => Self::from_dtype(l),
        })
    }
}

// Written as its label ("Q4_1", "F8_E4M3", "unknown"), as the index always wrote it.
serde_as_label!(StoredType);

/// One file of a model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelFile {
    /// Relative to the model's folder (for a single GGUF: its file name).
    pub name: String,
    pub size: u64,
    pub sha256: String,
}

/// One model of the library, as listed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelEntry {
    /// The name in the library folder (file or folder name); what `tpslab models rm` takes.
    pub name: String,
    /// What to load: the GGUF file or the safetensors folder.
    #[serde(skip)]
    pub path: PathBuf,
    pub format: ModelFormat,
    pub source: ModelSource,
    pub files: Vec<ModelFile>,
    /// `general.architecture` of a GGUF, `architectures[0]` of a config.json.
    pub arch: String,
    pub params: u64,
    /// The type holding most matrix bytes ("Q4_1", "BF16").
    pub precision: StoredType,
    /// Bytes on disk, all files.
    pub size: u64,
    pub context_len: Option<u64>,
    /// The GGUF file's sha256; for a folder, the sha256 of its `sha256sum`-style listing
    /// ("<sha256>  <name>\n" per file, sorted by name). Empty when not yet indexed.
    pub sha256: String,
}

impl ModelEntry {
    pub fn sha_short(&self) -> &str {
        self.sha256.get(..12).unwrap_or(&self.sha256)
    }

    /// Whether the sha256 of every file is known (the model has a manifest).
    pub fn is_indexed(&self) -> bool {
        !self.sha256.is_empty()
    }
}

/// Why a library operation failed. Every failure leaves the library as it was.
#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error(transparent)]
    Library(#[from] LibraryError),
    #[error(
        "not enough space for {what} in the library folder {dir}: free some space or set TPSLAB_HOME to a larger disk; the library is unchanged"
    )]
    NoSpace { dir: PathBuf, what: String },
    #[error("cannot write to the library folder {dir} ({err}); the library is unchanged")]
    Unwritable { dir: PathBuf, err: std::io::Error },
    #[error("{path} is not a usable model: {reason}")]
    Invalid { path: PathBuf, reason: String },
    #[error(
        "the library already has a model named {0}; remove it first (tpslab models rm {0}) or rename the source"
    )]
    Exists(String),
    #[error("no model named {0} in the library (see tpslab models)")]
    NotFound(String),
    #[error("I/O error on {path}: {err}")]
    Io { path: PathBuf, err: std::io::Error },
    #[error("cancelled; the library is unchanged")]
    Cancelled,
    #[error(
        "{path} is a link (symbolic or hard) or not a plain file or folder, inside the library; nothing is written or deleted through it: remove it and try again"
    )]
    Link { path: PathBuf },
}

/// Sorts an I/O error from writing into the library into a clear error: a full disk and an
/// unwritable folder are named as such.
pub fn write_error(dir: &Path, what: &str, path: &Path, e: std::io::Error) -> IndexError {
    use std::io::ErrorKind as K;
    const ENOSPC: i32 = 28;
    const EDQUOT: i32 = 122;
    match e.kind() {
        K::StorageFull | K::QuotaExceeded => no_space(dir, what),
        K::PermissionDenied | K::ReadOnlyFilesystem | K::NotADirectory => IndexError::Unwritable {
            dir: dir.to_path_buf(),
            err: e,
        },
        _ if matches!(e.raw_os_error(), Some(ENOSPC | EDQUOT)) => no_space(dir, what),
        _ => IndexError::Io {
            path: path.to_path_buf(),
            err: e,
        },
    }
}

fn no_space(dir: &Path, what: &str) -> IndexError {
    IndexError::NoSpace {
        dir: dir.to_path_buf(),
        what: what.to_string(),
    }
}

/// Whether something (a file, a folder, a link, even a dangling one) is at `path`.
pub fn occupied(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok()
}

/// Whether `name` may be a model's file or folder name in the library (not hidden, not a
/// partial file, one path part).
pub fn is_model_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with('.')
        && !name.contains(['/', '\\'])
        && !name.ends_with(".tmp")
        && !name.ends_with(".part")
}

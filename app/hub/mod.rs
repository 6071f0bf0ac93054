//! Downloading models from the Hugging Face Hub (or any server that speaks its API) into the
//! model library. Everything a server sends is untrusted (design: "Untrusted input").
//!
//! Why here and not in the engine: the engine has no async runtime and no network; the app
//! already carries tokio, and the download is a front-end concern (the CLI's `tpslab pull` and
//! the Models panel). The engine's [`Library`] does the part both share: staging, verifying and
//! installing files into the library folder, and keeping writes inside it.
//!
//! What hf-hub gives: the endpoint and token settings ([`HubConfig`], `HF_ENDPOINT` /
//! `HF_TOKEN`, the saved login) and the API's URL shapes (`ApiRepo::url`, `info_request`).
//! What this module does itself, because hf-hub builds cache paths from the `ETag`,
//! `X-Linked-Etag` and `X-Repo-Commit` headers unchecked and its client has no timeouts:
//! - every name and id from a server is checked before use ([`names`], [`listing`]): commits
//!   are 40 hex digits, file names safe relative paths, checksums well-formed; headers are
//!   checked against the listing;
//! - HTTP ([`http`]): connect, read and stall timeouts on every request; listing and search
//!   bodies capped (16 MiB, 4 MiB); at most 5 redirects, to http(s) only, the token only to the
//!   endpoint's own origin;
//! - the download ([`download`]): ranged GETs into `models/.hub-cache/blobs/<checksum>.part`
//!   (names made from validated checksums only, never through a symlink), sizes checked while
//!   streaming (a server that ignores `Range` restarts the file from 0; one that sends more than
//!   it lists is cut off), resumed from the partial file on the next pull, each whole file
//!   verified: sha256 for LFS files, the git blob id for the others;
//! - the pull ([`pull`]): choosing the files (one GGUF, or the safetensors set), progress with
//!   speed and ETA, cancel, the move into the library only when every file is whole and
//!   verified and the engine can load the model, and clear errors naming file and server.
//!
//! - the fit ([`fit`]): each GGUF of a repo read from its header alone (range requests,
//!   bounded), for its quant type, architecture and memory need before a download.
//!
//! API for a UI worker thread (all blocking; each call runs its own small tokio runtime):
//! - [`list_files`]`(&HubConfig, repo, revision) -> RepoListing`: files with sizes and checksums.
//! - [`search`]`(&HubConfig, query, limit) -> Vec<SearchHit>`.
//! - [`read_ggufs`]`(&HubConfig, &RepoListing) -> Vec<GgufFit>`: each GGUF's needs from its
//!   header; [`GgufFit::verdict`] against a [`Machine`] at a context and batch.
//! - [`pull`]`(&HubConfig, &Library, &PullRequest, &AtomicBool, &mut dyn FnMut(&PullProgress))
//!   -> ModelEntry`: downloads, verifies and registers the model; setting the flag cancels
//!   within ~0.1 s, leaving nothing in the library (partial files, and whole verified ones of a
//!   set not yet complete, stay in the hub cache for the next pull).

use std::time::Duration;

use hf_hub::Cache;
use hf_hub::api::tokio::{Api, ApiBuilder};
#[cfg(doc)]
use tpslab_engine::library::index::Library;

mod download;
mod error;
mod fit;
mod http;
mod listing;
mod meter;
mod names;
mod pull;

pub use error::HubError;
use error::status_error;
pub use fit::{GgufFit, MAX_HEADER_MIB, Machine, read_ggufs};
pub use listing::{Choice, RepoFile, RepoListing, SearchHit, list_files, search};
pub use pull::pull;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// How often progress is reported and the cancel flag looked at.
const TICK: Duration = Duration::from_millis(100);

/// Where the Hub is, who we are there, and how long to wait for it.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// e.g. `https://huggingface.co` (no trailing slash).
    pub endpoint: String,
    /// For gated and private repos; sent only to the endpoint's own origin.
    pub token: Option<String>,
    /// Bytes per ranged request of a download.
    pub chunk_size: usize,
    /// Longest wait for a connection to a server.
    pub connect_timeout: Duration,
    /// Longest wait for an answer's headers, and for a whole listing or search body.
    pub read_timeout: Duration,
    /// Longest a download's body may send nothing before it is cut (and resumed next pull).
    pub stall_timeout: Duration,
}

impl Default for HubConfig {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.into(),
            token: None,
            chunk_size: 16 << 20,
            connect_timeout: Duration::from_secs(20),
            read_timeout: Duration::from_secs(60),
            stall_timeout: Duration::from_secs(60),
        }
    }
}

impl HubConfig {
    /// The given endpoint and token, else `HF_ENDPOINT` / `HF_TOKEN`, else the Hub and the token
    /// saved by `huggingface-cli login` (hf-hub's token file).
    pub fn resolve(endpoint: Option<String>, token: Option<String>) -> Self {
        let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let endpoint = endpoint
            .or_else(|| env("HF_ENDPOINT"))
            .unwrap_or_else(|| DEFAULT_ENDPOINT.into());
        let token = token
            .or_else(|| env("HF_TOKEN"))
            // hf-hub's default cache panics without a home folder: only look where there is one.
            .or_else(|| {
                (env("HF_HOME").is_some() || env("HOME").is_some())
                    .then(|| Cache::from_env().token())
                    .flatten()
            });
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            ..Self::default()
        }
    }

    /// hf-hub's API, for its URL shapes only (requests go through [`http::Http`]). Its cache
    /// folder is never written: nothing is downloaded through it.
    fn api(&self) -> Result<Api, HubError> {
        ApiBuilder::from_cache(Cache::new(std::env::temp_dir()))
            .with_endpoint(self.endpoint.trim_end_matches('/').to_string())
            .with_progress(false)
            .with_user_agent("tpslab", env!("CARGO_PKG_VERSION"))
            .build()
            .map_err(|_| HubError::BadEndpoint(self.endpoint.clone()))
    }
}

#[derive(Debug, Clone)]
pub struct PullRequest {
    /// `owner/name`.
    pub repo: String,
    /// Branch, tag or commit; `main` by default.
    pub revision: String,
    pub choice: Choice,
}

/// Progress of a pull, reported about every 0.1 s.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PullProgress {
    /// The file downloading now (its path in the repo).
    pub file: String,
    /// 1-based index of that file, of `n_files`.
    pub file_index: usize,
    pub n_files: usize,
    /// Bytes in hand over all files (a resumed file counts what it resumed from).
    pub done: u64,
    pub total: u64,
    /// Over the last ~3 s of this pull's own transfer.
    pub bytes_per_s: f64,
    pub eta: Option<Duration>,
    /// "listing", "downloading", "verifying", "installing".
    pub stage: &'static str,
}

fn runtime() -> Result<tokio::runtime::Runtime, HubError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| HubError::Network {
            endpoint: String::new(),
            detail: format!("cannot start the async runtime: {e}"),
        })
}

pub fn human_bytes(n: u64) -> String {
    let n = n as f64;
    match n {
        _ if n >= (1u64 << 30) as f64 => format!("{:.2} GiB", n / (1u64 << 30) as f64),
        _ if n >= (1u64 << 20) as f64 => format!("{:.1} MiB", n / (1u64 << 20) as f64),
        _ if n >= 1024.0 => format!("{:.1} KiB", n / 1024.0),
        _ => format!("{n} B"),
    }
}

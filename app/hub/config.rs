//! Where the Hub is and who we are there ([`HubConfig`]), what a pull reports ([`PullProgress`]): the plain types every part of the Hub
//! client reads (a leaf module).

use std::time::Duration;

use hf_hub::Cache;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// How often progress is reported and the cancel flag looked at.
pub(super) const TICK: Duration = Duration::from_millis(100);

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

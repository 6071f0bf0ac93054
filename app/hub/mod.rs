//! Downloading models from the Hugging Face Hub (or any server that speaks its API) into the
//! model library, with hf-hub doing the HTTP.
//!
//! Why here and not in the engine: the engine has no async runtime and no network; the app
//! already carries tokio, and the download is a front-end concern (the CLI's `tpslab pull` and
//! the Models panel). The engine's [`Library`] does the part both share: staging, verifying and
//! installing files into the library folder.
//!
//! What hf-hub gives: the endpoint and token settings ([`HubConfig`], `HF_ENDPOINT` /
//! `HF_TOKEN`), the HTTP client with the token and user agent, the repo listing request, and the
//! file download itself: a ranged request per chunk into `<file>.sync.part` under its cache
//! (`models/.hub-cache`), recording how many whole chunks have arrived, so a download cut off
//! mid-way resumes with an HTTP `Range` request from the last whole chunk on the next pull.
//! What this module adds: choosing the files (one GGUF, or the safetensors set), progress with
//! speed and ETA across the files, cancel, the sha256 check against the Hub's LFS listing, the
//! move into the library only when every file is whole and verified, and clear errors.
//!
//! API for a UI worker thread (all blocking; each call runs its own small tokio runtime):
//! - [`list_files`]`(&HubConfig, repo, revision) -> RepoListing`: files with sizes and sha256.
//! - [`search`]`(&HubConfig, query, limit) -> Vec<SearchHit>`.
//! - [`pull`]`(&HubConfig, &Library, &PullRequest, &AtomicBool, &mut dyn FnMut(&PullProgress))
//!   -> ModelEntry`: downloads, verifies and registers the model; setting the flag cancels
//!   within ~0.1 s, leaving nothing in the library (partial files, and whole verified ones of a
//!   set not yet complete, stay in the hub cache for the next pull of the same commit).

use std::time::Duration;

use hf_hub::api::tokio::{Api, ApiBuilder};
use hf_hub::{Cache, Repo, RepoType};
use serde::Deserialize;
use tpslab_engine::library_index::{IndexError, Library};

mod pull;
pub use pull::pull;

pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";
/// Listing and search answers are small: give up on a server that sends nothing for this long.
const API_TIMEOUT: Duration = Duration::from_secs(60);
const TICK: Duration = Duration::from_millis(100);

/// Where the Hub is and who we are there.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// e.g. `https://huggingface.co` (no trailing slash).
    pub endpoint: String,
    /// For gated and private repos.
    pub token: Option<String>,
    /// Bytes per ranged request: the unit a cut download resumes from (hf-hub's chunks).
    pub chunk_size: usize,
}

impl Default for HubConfig {
    fn default() -> Self {
        Self {
            endpoint: DEFAULT_ENDPOINT.into(),
            token: None,
            chunk_size: 16 << 20,
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

    fn api(&self, lib: Option<&Library>) -> Result<Api, HubError> {
        let url = &self.endpoint;
        if !(url.starts_with("http://") || url.starts_with("https://")) || url.len() < 10 {
            return Err(HubError::BadEndpoint(url.clone()));
        }
        // An explicit cache folder: hf-hub's default one panics without a home folder. Listing
        // and search write nothing there.
        let cache = lib.map_or_else(std::env::temp_dir, Library::hub_cache);
        let b = ApiBuilder::from_cache(Cache::new(cache))
            .with_endpoint(url.trim_end_matches('/').to_string())
            .with_token(self.token.clone())
            .with_progress(false)
            .with_chunk_size(Some(self.chunk_size.max(1 << 16)))
            .with_user_agent("tpslab", env!("CARGO_PKG_VERSION"));
        b.build().map_err(|e| HubError::Network {
            endpoint: url.clone(),
            detail: chain(&e),
        })
    }
}

/// Why a Hub operation failed.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("the endpoint '{0}' is not an http:// or https:// URL")]
    BadEndpoint(String),
    #[error("cannot reach {endpoint}: {detail}")]
    Network { endpoint: String, detail: String },
    #[error(
        "the connection to {endpoint} broke while downloading {file} ({detail}); run the same pull again to resume"
    )]
    Interrupted {
        endpoint: String,
        file: String,
        detail: String,
    },
    #[error(
        "repository {repo} not found at {endpoint} (check the name; a private repo needs --token or HF_TOKEN)"
    )]
    RepoNotFound { repo: String, endpoint: String },
    #[error("revision '{revision}' not found in {repo}")]
    RevisionNotFound { repo: String, revision: String },
    #[error("file {file} not found in {repo}")]
    FileNotFound { repo: String, file: String },
    #[error(
        "{repo} is a gated repository: accept its terms on its Hub page, then pass --token or set HF_TOKEN"
    )]
    GatedNoToken { repo: String },
    #[error(
        "access to {repo} was refused with the token given: accept the repository's terms on its Hub page, or check the token"
    )]
    Refused { repo: String },
    #[error("{url} answered HTTP {status}: {message}")]
    Http {
        url: String,
        status: u16,
        message: String,
    },
    #[error("{endpoint} sent an answer that is not the Hub's API: {detail}")]
    BadAnswer { endpoint: String, detail: String },
    #[error("{0}")]
    Choose(String),
    #[error(
        "{file} failed its checksum: the Hub lists sha256 {expected}, the download has {found}; it was discarded and the library is unchanged"
    )]
    Checksum {
        file: String,
        expected: String,
        found: String,
    },
    #[error("{file}: the Hub lists {expected} bytes, the download has {found}; it was discarded")]
    Size {
        file: String,
        expected: u64,
        found: u64,
    },
    #[error("download cancelled; the library is unchanged")]
    Cancelled,
    #[error(transparent)]
    Library(#[from] IndexError),
}

/// The error and its sources on one line (reqwest's own text names only the outer layer).
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// One file of a repo.
#[derive(Debug, Clone, PartialEq)]
pub struct RepoFile {
    /// Path in the repo.
    pub name: String,
    pub size: u64,
    /// The sha256 the Hub lists for LFS files (weights); None for small git files.
    pub sha256: Option<String>,
}

/// A repo's files at one revision.
#[derive(Debug, Clone)]
pub struct RepoListing {
    pub repo: String,
    pub revision: String,
    /// The commit the revision points at.
    pub commit: Option<String>,
    pub gated: bool,
    pub files: Vec<RepoFile>,
}

/// Files of the safetensors set kept at the repo root.
fn in_safetensors_set(name: &str) -> bool {
    !name.contains('/') && tpslab_engine::library_st::is_model_file(name)
}

impl RepoListing {
    /// The GGUF files, largest last as the Hub lists them.
    pub fn ggufs(&self) -> Vec<&RepoFile> {
        self.files
            .iter()
            .filter(|f| f.name.to_ascii_lowercase().ends_with(".gguf"))
            .collect()
    }

    /// The safetensors set (config, tokenizer, weights, index) when the repo has one.
    pub fn safetensors_set(&self) -> Option<Vec<&RepoFile>> {
        let has = |n: &str| self.files.iter().any(|f| f.name == n);
        let weights = self
            .files
            .iter()
            .any(|f| !f.name.contains('/') && f.name.ends_with(".safetensors"));
        (weights && has("config.json") && has("tokenizer.json")).then(|| {
            self.files
                .iter()
                .filter(|f| in_safetensors_set(&f.name))
                .collect()
        })
    }

    /// The files `choice` means, or a message saying what to choose.
    /// `f`, or every part of the split GGUF whose first part `f` is (all must be in the repo).
    fn with_split_parts<'a>(&'a self, f: &'a RepoFile) -> Result<Vec<&'a RepoFile>, HubError> {
        let (dir, base) = f
            .name
            .rsplit_once('/')
            .map_or(("", f.name.as_str()), |(d, b)| (d, b));
        let Some(names) = tpslab_engine::gguf_split::part_names(base) else {
            return Ok(vec![f]);
        };
        names
            .iter()
            .map(|n| {
                let full = if dir.is_empty() {
                    n.clone()
                } else {
                    format!("{dir}/{n}")
                };
                self.files.iter().find(|g| g.name == full).ok_or_else(|| {
                    HubError::Choose(format!(
                        "{} is a split GGUF of {} parts, but {full} is not in {}",
                        f.name,
                        names.len(),
                        self.repo
                    ))
                })
            })
            .collect()
    }

    pub fn choose(&self, choice: &Choice) -> Result<Vec<&RepoFile>, HubError> {
        let ggufs = self.ggufs();
        let set = self.safetensors_set();
        let names = |v: &[&RepoFile]| {
            v.iter()
                .map(|f| format!("{} ({})", f.name, human_bytes(f.size)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        match choice {
            Choice::File(name) => {
                let f = self.files.iter().find(|f| f.name == *name).ok_or_else(|| {
                    HubError::FileNotFound {
                        repo: self.repo.clone(),
                        file: name.clone(),
                    }
                })?;
                self.with_split_parts(f)
            }
            Choice::Safetensors => set.ok_or_else(|| {
                HubError::Choose(format!(
                    "{} has no safetensors model (config.json, tokenizer.json and *.safetensors)",
                    self.repo
                ))
            }),
            Choice::Auto => match (ggufs.as_slice(), set) {
                ([], Some(set)) => Ok(set),
                ([one], None) => Ok(vec![*one]),
                // One split GGUF and nothing else: its parts.
                (many, None)
                    if many.iter().any(|f| {
                        self.with_split_parts(f)
                            .is_ok_and(|parts| parts.len() == many.len() && parts.len() > 1)
                    }) =>
                {
                    let first = many
                        .iter()
                        .find(|f| is_split_first(&f.name))
                        .ok_or_else(|| HubError::Choose("no first part".into()))?;
                    self.with_split_parts(first)
                }
                ([], None) => Err(HubError::Choose(format!(
                    "{} has no GGUF file and no safetensors model (config.json, tokenizer.json, *.safetensors)",
                    self.repo
                ))),
                (many, _) => Err(HubError::Choose(format!(
                    "{} has several model files; choose one with --file (or --safetensors for the safetensors set where there is one): {}",
                    self.repo,
                    names(many)
                ))),
            },
        }
    }
}

/// What to download from a repo.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Choice {
    /// The safetensors set if that is all there is, else the only GGUF file.
    #[default]
    Auto,
    /// One file by its path in the repo (a GGUF).
    File(String),
    /// config.json, tokenizer files and every *.safetensors (sharded too).
    Safetensors,
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

#[derive(Deserialize)]
struct ApiLfs {
    sha256: Option<String>,
    size: Option<u64>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    lfs: Option<ApiLfs>,
}

#[derive(Deserialize)]
struct ApiInfo {
    sha: Option<String>,
    #[serde(default)]
    gated: serde_json::Value,
    #[serde(default)]
    siblings: Vec<ApiSibling>,
}

fn is_split_first(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    tpslab_engine::gguf_split::first_part(base).is_some()
}

/// A search result.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SearchHit {
    pub id: String,
    #[serde(default)]
    pub downloads: u64,
    #[serde(default)]
    pub likes: u64,
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

/// Maps an HTTP error answer (status and the Hub's `X-Error-Code`) to a clear error.
fn status_error(
    cfg: &HubConfig,
    repo: &str,
    revision: &str,
    url: &str,
    status: u16,
    code: &str,
    message: &str,
) -> HubError {
    let repo = repo.to_string();
    // The Hub refuses a gated repo with 401 (no token) or 403 (a token without access).
    if code == "GatedRepo" || status == 403 {
        return if cfg.token.is_none() {
            HubError::GatedNoToken { repo }
        } else {
            HubError::Refused { repo }
        };
    }
    match (status, code) {
        (_, "RevisionNotFound") => HubError::RevisionNotFound {
            repo,
            revision: revision.to_string(),
        },
        (_, "EntryNotFound") => HubError::FileNotFound {
            repo,
            file: url.rsplit('/').next().unwrap_or(url).to_string(),
        },
        (_, "RepoNotFound") | (404, _) => HubError::RepoNotFound {
            repo,
            endpoint: cfg.endpoint.clone(),
        },
        (401, _) if cfg.token.is_none() => HubError::RepoNotFound {
            repo,
            endpoint: cfg.endpoint.clone(),
        },
        _ => HubError::Http {
            url: url.to_string(),
            status,
            message: if message.is_empty() {
                "no message".into()
            } else {
                message.to_string()
            },
        },
    }
}

/// A repo's files with sizes and the Hub's sha256 of each LFS file.
pub fn list_files(cfg: &HubConfig, repo: &str, revision: &str) -> Result<RepoListing, HubError> {
    let api = cfg.api(None)?;
    runtime()?.block_on(list_files_async(&api, cfg, repo, revision))
}

async fn list_files_async(
    api: &Api,
    cfg: &HubConfig,
    repo: &str,
    revision: &str,
) -> Result<RepoListing, HubError> {
    if repo.split('/').count() > 2 || repo.is_empty() || repo.contains("..") {
        return Err(HubError::Choose(format!(
            "'{repo}' is not a repository id (owner/name)"
        )));
    }
    let r = api.repo(Repo::with_revision(
        repo.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    let req = r.info_request().query(&[("blobs", "true")]);
    let net = |e: &dyn std::error::Error| HubError::Network {
        endpoint: cfg.endpoint.clone(),
        detail: chain(e),
    };
    let resp = tokio::time::timeout(API_TIMEOUT, req.send())
        .await
        .map_err(|e| net(&e))?
        .map_err(|e| net(&e))?;
    let status = resp.status().as_u16();
    let url = resp.url().to_string();
    if !resp.status().is_success() {
        let code = header(resp.headers(), "x-error-code");
        let msg = header(resp.headers(), "x-error-message");
        return Err(status_error(cfg, repo, revision, &url, status, &code, &msg));
    }
    let body = tokio::time::timeout(API_TIMEOUT, resp.bytes())
        .await
        .map_err(|e| net(&e))?
        .map_err(|e| net(&e))?;
    let info: ApiInfo = serde_json::from_slice(&body).map_err(|e| HubError::BadAnswer {
        endpoint: cfg.endpoint.clone(),
        detail: format!("{url}: {e}"),
    })?;
    let files = info
        .siblings
        .into_iter()
        .map(|s| {
            let lfs = s.lfs.as_ref();
            RepoFile {
                size: s.size.or_else(|| lfs.and_then(|l| l.size)).unwrap_or(0),
                sha256: lfs
                    .and_then(|l| l.sha256.clone())
                    .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())),
                name: s.rfilename,
            }
        })
        .collect();
    Ok(RepoListing {
        repo: repo.to_string(),
        revision: revision.to_string(),
        commit: info.sha,
        gated: !matches!(
            info.gated,
            serde_json::Value::Bool(false) | serde_json::Value::Null
        ),
        files,
    })
}

fn header(h: &reqwest::header::HeaderMap, k: &str) -> String {
    h.get(k)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// Model repos whose names match `query` (the Hub's `/api/models?search=`).
pub fn search(cfg: &HubConfig, query: &str, limit: usize) -> Result<Vec<SearchHit>, HubError> {
    let api = cfg.api(None)?;
    let url = format!("{}/api/models", cfg.endpoint);
    let limit = limit.clamp(1, 100).to_string();
    runtime()?.block_on(async {
        let net = |e: &dyn std::error::Error| HubError::Network {
            endpoint: cfg.endpoint.clone(),
            detail: chain(e),
        };
        let req = api
            .client()
            .get(&url)
            .query(&[("search", query), ("limit", limit.as_str())]);
        let resp = tokio::time::timeout(API_TIMEOUT, req.send())
            .await
            .map_err(|e| net(&e))?
            .map_err(|e| net(&e))?;
        if !resp.status().is_success() {
            let msg = header(resp.headers(), "x-error-message");
            return Err(HubError::Http {
                url,
                status: resp.status().as_u16(),
                message: msg,
            });
        }
        let body = tokio::time::timeout(API_TIMEOUT, resp.bytes())
            .await
            .map_err(|e| net(&e))?
            .map_err(|e| net(&e))?;
        serde_json::from_slice(&body).map_err(|e| HubError::BadAnswer {
            endpoint: cfg.endpoint.clone(),
            detail: e.to_string(),
        })
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

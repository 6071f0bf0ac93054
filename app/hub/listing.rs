//! A repo's file listing and the Hub's search, read with a size cap and a time limit and
//! checked before anything uses them: the commit is 40 hex digits, every file name a safe
//! relative path, every size present, every checksum well-formed ([`list_files`], [`search`]);
//! and choosing the files of one model from a listing ([`RepoListing::choose`]).

use hf_hub::{Repo, RepoType};
use reqwest::Url;
use serde::Deserialize;
use tpslab_engine::library::check_name;
use tpslab_engine::library::model_ref::{HubRef, pick_gguf};

use super::config::HubConfig;
use super::error::{HubError, status_error};
use super::http::{Http, header};
use super::http::{hub_api, runtime};
use super::meter::Meter;
use super::meter::human_bytes;
use super::names::{check_repo_id, check_revision, commit_id, hex_of_len, shown};

/// A listing past this size is not a model repo's (the largest have a few thousand files).
const MAX_LISTING_MIB: u64 = 16;
/// Search answers carry at most 100 hits.
const MAX_SEARCH_MIB: u64 = 4;

/// One file of a repo.
#[derive(Debug, Clone, PartialEq)]
pub struct RepoFile {
    /// Path in the repo (checked: relative, no `.`/`..` parts, see
    /// [`tpslab_engine::library::check_name`]).
    pub name: String,
    pub size: u64,
    /// The sha256 the Hub lists for LFS files (weights), lower-case hex.
    pub sha256: Option<String>,
    /// The git blob id (sha1 of `blob {len}\0` + bytes) the Hub lists for the other files.
    pub blob_id: Option<String>,
}

/// A repo's files at one revision.
#[derive(Debug, Clone)]
pub struct RepoListing {
    pub repo: String,
    pub revision: String,
    /// The commit the revision points at (40 lower-case hex digits); downloads are pinned to it.
    pub commit: String,
    pub gated: bool,
    pub files: Vec<RepoFile>,
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
    /// The GGUF model file a quant tag picks, split parts together, as llama.cpp's `-hf` picks
    /// ([`pick_gguf`]; no tag: Q4_K_M, else Q8_0, else the first).
    Tagged(Option<String>),
}

/// Files of the safetensors set kept at the repo root.
fn in_safetensors_set(name: &str) -> bool {
    !name.contains('/') && tpslab_engine::library::describe::is_model_file(name)
}

pub(super) fn is_split_first(name: &str) -> bool {
    let base = name.rsplit('/').next().unwrap_or(name);
    tpslab_engine::formats::gguf_split::first_part(base).is_some()
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

    /// `f`, or every part of the split GGUF whose first part `f` is (all must be in the repo).
    pub(super) fn with_split_parts<'a>(
        &'a self,
        f: &'a RepoFile,
    ) -> Result<Vec<&'a RepoFile>, HubError> {
        let (dir, base) = f
            .name
            .rsplit_once('/')
            .map_or(("", f.name.as_str()), |(d, b)| (d, b));
        let Some(names) = tpslab_engine::formats::gguf_split::part_names(base) else {
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

    /// The files `choice` means, or a message saying what to choose.
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
            Choice::Tagged(quant) => {
                let r = HubRef {
                    repo: self.repo.clone(),
                    quant: quant.clone(),
                };
                let all: Vec<&str> = self.files.iter().map(|f| f.name.as_str()).collect();
                let picked = pick_gguf(&r, &all).map_err(|e| HubError::Choose(e.to_string()))?;
                // In the picked order: a split model's first part first.
                Ok(picked
                    .iter()
                    .filter_map(|n| self.files.iter().find(|f| f.name == *n))
                    .collect())
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

#[derive(Deserialize)]
struct ApiLfs {
    sha256: Option<String>,
    size: Option<u64>,
}

#[derive(Deserialize)]
struct ApiSibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
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

/// A search result.
#[derive(Debug, Clone, Deserialize, PartialEq)]
pub struct SearchHit {
    pub id: String,
    #[serde(default)]
    pub downloads: u64,
    #[serde(default)]
    pub likes: u64,
}

/// Checks what the user asked for before any request is made from it.
pub(super) fn check_request(repo: &str, revision: &str) -> Result<(), HubError> {
    check_repo_id(repo).map_err(|why| {
        HubError::Choose(format!(
            "{} is not a repository id (owner/name): {why}",
            shown(repo)
        ))
    })?;
    check_revision(revision)
        .map_err(|why| HubError::Choose(format!("{} is not a revision: {why}", shown(revision))))
}

/// A repo's files with sizes and checksums (the Hub's sha256 of each LFS file, the git blob id
/// of the others).
pub fn list_files(cfg: &HubConfig, repo: &str, revision: &str) -> Result<RepoListing, HubError> {
    let http = Http::new(cfg)?;
    let never = std::sync::atomic::AtomicBool::new(false);
    let mut quiet = |_: &super::PullProgress| {};
    let mut meter = Meter::new(&never, &mut quiet);
    runtime()?.block_on(list_files_async(&http, &mut meter, repo, revision))
}

pub(super) async fn list_files_async(
    http: &Http,
    meter: &mut Meter<'_>,
    repo: &str,
    revision: &str,
) -> Result<RepoListing, HubError> {
    check_request(repo, revision)?;
    let cfg = &http.cfg;
    let api = hub_api(cfg)?;
    let r = api.repo(Repo::with_revision(
        repo.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    let url = r
        .info_request()
        .query(&[("blobs", "true")])
        .build()
        .map_err(|_| HubError::BadEndpoint(cfg.endpoint.clone()))?
        .url()
        .clone();
    let resp = http.get(meter, url, None, &|_, _| Ok(())).await?;
    let url = resp.url().to_string();
    if !resp.status().is_success() {
        let code = header(resp.headers(), "x-error-code");
        let msg = header(resp.headers(), "x-error-message");
        let status = resp.status().as_u16();
        return Err(status_error(cfg, repo, revision, &url, status, &code, &msg));
    }
    let body = http
        .read_capped(meter, resp, MAX_LISTING_MIB, "the listing")
        .await?;
    let info: ApiInfo = serde_json::from_slice(&body).map_err(|e| HubError::BadAnswer {
        endpoint: cfg.endpoint.clone(),
        detail: format!("{url}: {e}"),
    })?;
    checked_listing(cfg, info, repo, revision)
}

/// The listing, once every field that will reach a path or a check is well-formed.
fn checked_listing(
    cfg: &HubConfig,
    info: ApiInfo,
    repo: &str,
    revision: &str,
) -> Result<RepoListing, HubError> {
    let refuse = |detail: String| HubError::Unsafe {
        endpoint: cfg.endpoint.clone(),
        detail: format!("{detail} in the listing of {repo}"),
    };
    let sha = info.sha.ok_or_else(|| HubError::BadAnswer {
        endpoint: cfg.endpoint.clone(),
        detail: format!("the listing of {repo} has no commit id (sha)"),
    })?;
    let commit = commit_id(&sha).ok_or_else(|| {
        refuse(format!(
            "a commit id {} that is not 40 hex digits",
            shown(&sha)
        ))
    })?;
    let files = info
        .siblings
        .into_iter()
        .map(|s| {
            let name = s.rfilename;
            check_name(&name).map_err(|why| {
                refuse(format!(
                    "a file name {} that is not a path inside the repo ({why})",
                    shown(&name)
                ))
            })?;
            let lfs = s.lfs.as_ref();
            let size = match (s.size, lfs.and_then(|l| l.size)) {
                (Some(a), Some(b)) if a != b => {
                    return Err(refuse(format!("two sizes ({a} and {b}) for {name}")));
                }
                (Some(n), _) | (None, Some(n)) => n,
                (None, None) => return Err(refuse(format!("no size for {name}"))),
            };
            let sha256 = match lfs.and_then(|l| l.sha256.as_deref()) {
                Some(h) => Some(hex_of_len(h, 64).ok_or_else(|| {
                    refuse(format!(
                        "an LFS sha256 {} for {name} that is not 64 hex digits",
                        shown(h)
                    ))
                })?),
                None => None,
            };
            // An LFS file's blob id is its pointer file's, not its content's: not a check on
            // the bytes downloaded.
            let blob_id = match s.blob_id.as_deref().filter(|_| lfs.is_none()) {
                Some(h) => Some(hex_of_len(h, 40).ok_or_else(|| {
                    refuse(format!(
                        "a git blob id {} for {name} that is not 40 hex digits",
                        shown(h)
                    ))
                })?),
                None => None,
            };
            Ok(RepoFile {
                name,
                size,
                sha256,
                blob_id,
            })
        })
        .collect::<Result<Vec<_>, HubError>>()?;
    Ok(RepoListing {
        repo: repo.to_string(),
        revision: revision.to_string(),
        commit,
        gated: !matches!(
            info.gated,
            serde_json::Value::Bool(false) | serde_json::Value::Null
        ),
        files,
    })
}

/// Model repos whose names match `query` (the Hub's `/api/models?search=`); hits whose id is
/// not a repo id are left out.
pub fn search(cfg: &HubConfig, query: &str, limit: usize) -> Result<Vec<SearchHit>, HubError> {
    let http = Http::new(cfg)?;
    let limit = limit.clamp(1, 100).to_string();
    let url = Url::parse_with_params(
        &format!("{}/api/models", cfg.endpoint),
        &[("search", query), ("limit", limit.as_str())],
    )
    .map_err(|_| HubError::BadEndpoint(cfg.endpoint.clone()))?;
    let never = std::sync::atomic::AtomicBool::new(false);
    let mut quiet = |_: &super::PullProgress| {};
    let mut meter = Meter::new(&never, &mut quiet);
    runtime()?.block_on(async {
        let resp = http
            .get(&mut meter, url.clone(), None, &|_, _| Ok(()))
            .await?;
        if !resp.status().is_success() {
            return Err(HubError::Http {
                url: url.to_string(),
                status: resp.status().as_u16(),
                message: header(resp.headers(), "x-error-message"),
            });
        }
        let body = http
            .read_capped(&mut meter, resp, MAX_SEARCH_MIB, "the search answer")
            .await?;
        let hits: Vec<SearchHit> =
            serde_json::from_slice(&body).map_err(|e| HubError::BadAnswer {
                endpoint: cfg.endpoint.clone(),
                detail: e.to_string(),
            })?;
        Ok(hits
            .into_iter()
            .filter(|h| check_repo_id(&h.id).is_ok())
            .collect())
    })
}

//! The Models panel's seam to the Hugging Face Hub client ([`crate::hub`]): searching model
//! repos, listing a repo's files and downloading a GGUF file or the safetensors set into the
//! library, reporting bytes, speed and ETA, stopping when cancelled. Blocking calls, made on the
//! panel's worker threads.

use std::path::{Path, PathBuf};

use tpslab_engine::library::index::Library as Index;

use super::task::Reporter;
use crate::hub::{self, Choice, GgufFit, HubConfig, PullRequest, RepoListing, SearchHit};

/// Which repo, through which endpoint, with which token.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HubRequest {
    pub repo: String,
    /// `None`: `HF_ENDPOINT`, else the Hub itself.
    pub endpoint: Option<String>,
    /// `None`: `HF_TOKEN`, else the token `huggingface-cli login` saved.
    pub token: Option<String>,
}

impl HubRequest {
    fn config(&self) -> HubConfig {
        HubConfig::resolve(self.endpoint.clone(), self.token.clone())
    }
}

/// The repo's files (with sizes) at `main`.
pub fn list_files(req: &HubRequest) -> Result<RepoListing, String> {
    hub::list_files(&req.config(), req.repo.trim(), "main").map_err(|e| e.to_string())
}

/// Each GGUF model of `listing` described from its header (range requests, bounded).
pub fn read_ggufs(req: &HubRequest, listing: &RepoListing) -> Result<Vec<GgufFit>, String> {
    hub::read_ggufs(&req.config(), listing).map_err(|e| e.to_string())
}

/// Model repos matching `query` at the request's endpoint (its `repo` is not used).
pub fn search(req: &HubRequest, query: &str, limit: usize) -> Result<Vec<SearchHit>, String> {
    hub::search(&req.config(), query.trim(), limit).map_err(|e| e.to_string())
}

/// The first GGUF file, else the safetensors set, else nothing.
pub fn default_choice(listing: &RepoListing) -> Option<Choice> {
    if let Some(f) = listing.ggufs().first() {
        return Some(Choice::File(f.name.clone()));
    }
    listing.safetensors_set().map(|_| Choice::Safetensors)
}

/// Downloads `choice` into the library at `dir` (verified, then moved in whole) and returns the
/// path to load.
pub fn download(
    req: &HubRequest,
    choice: Choice,
    dir: &Path,
    rep: &mut Reporter<PathBuf>,
) -> Result<PathBuf, String> {
    let lib = Index::at(dir);
    let pull = PullRequest {
        repo: req.repo.trim().to_string(),
        revision: "main".into(),
        choice,
    };
    let cancel = rep.cancel_flag();
    let entry = hub::pull(&req.config(), &lib, &pull, &cancel, &mut |p| {
        let text = format!(
            "{} ({} of {}), {}",
            p.file, p.file_index, p.n_files, p.stage
        );
        rep.report_rate(p.done, p.total, &text, Some(p.bytes_per_s), p.eta);
    })
    .map_err(|e| e.to_string())?;
    Ok(entry.path)
}

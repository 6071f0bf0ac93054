//! [`pull`]: one model (a GGUF file, a split GGUF or the safetensors set) from a Hub repo into
//! the library: listed and checked, each file fetched and verified into the hub cache
//! ([`super::download`]), then staged and installed only when every file is whole and the
//! engine can load the model.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use hf_hub::{Repo, RepoType};
use tpslab_engine::library::index::{
    IndexError, Library, ModelEntry, ModelFile, ModelSource, is_model_name, occupied, write_error,
};

use super::config::{HubConfig, PullProgress};
use super::download::{self, BLOBS, FileJob, Origin, Sum};
use super::error::HubError;
use super::http::Http;
use super::http::{hub_api, runtime};
use super::listing::list_files_async;
use super::listing::{Choice, RepoFile};
use super::meter::Meter;
use super::names::shown;

#[derive(Debug, Clone)]
pub struct PullRequest {
    /// `owner/name`.
    pub repo: String,
    /// Branch, tag or commit; `main` by default.
    pub revision: String,
    pub choice: Choice,
}

/// Downloads `req` from the Hub into `lib` and registers it (see the module doc of
/// [`crate::hub`]). Blocking; call it from a worker thread. `on_progress` is called about every
/// 0.1 s; setting `cancel` stops the download within about that time with
/// [`HubError::Cancelled`]. Whatever the outcome, the library holds either the whole verified
/// model or nothing new; an interrupted file resumes from its partial file on the next pull.
pub fn pull(
    cfg: &HubConfig,
    lib: &Library,
    req: &PullRequest,
    cancel: &AtomicBool,
    on_progress: &mut dyn FnMut(&PullProgress),
) -> Result<ModelEntry, HubError> {
    let http = Http::new(cfg)?;
    let rt = runtime()?;
    let mut meter = Meter::new(cancel, on_progress);
    let result = rt.block_on(pull_async(&http, lib, req, &mut meter));
    tidy(lib);
    result
}

/// Removes the hub cache's folders when a pull left them empty (every file moved into the
/// library, or nothing kept to resume from); `remove_dir` removes only an empty folder, and
/// never follows a link.
fn tidy(lib: &Library) {
    let cache = lib.hub_cache();
    let _ = std::fs::remove_dir(cache.join(BLOBS));
    let _ = std::fs::remove_dir(cache);
}

/// The library name for `files`: the GGUF's file name, a split GGUF's name before its part
/// numbers, or the repo's name for a safetensors folder.
fn model_name(repo: &str, files: &[&RepoFile]) -> String {
    let base = |f: &RepoFile| f.name.rsplit('/').next().unwrap_or(&f.name).to_string();
    match files {
        [f] if f.name.to_ascii_lowercase().ends_with(".gguf") => base(f),
        [f, ..] => match tpslab_engine::formats::gguf_split::first_part(&base(f)) {
            Some((prefix, _)) => prefix.to_string(),
            None => repo.rsplit('/').next().unwrap_or(repo).to_string(),
        },
        _ => repo.rsplit('/').next().unwrap_or(repo).to_string(),
    }
}

async fn pull_async(
    http: &Http,
    lib: &Library,
    req: &PullRequest,
    meter: &mut Meter<'_>,
) -> Result<ModelEntry, HubError> {
    let cfg = &http.cfg;
    meter.stage("listing");
    let listing = list_files_async(http, meter, &req.repo, &req.revision).await?;
    let files = listing.choose(&req.choice)?;
    if listing.gated && cfg.token.is_none() {
        return Err(HubError::GatedNoToken {
            repo: req.repo.clone(),
        });
    }
    let name = model_name(&req.repo, &files);
    if !is_model_name(&name) {
        return Err(HubError::Choose(format!(
            "the model would be named {} in the library, which is not a usable name",
            shown(&name)
        )));
    }
    if occupied(&lib.root().join(&name)) {
        return Err(IndexError::Exists(name).into());
    }
    // Refused before any byte is fetched: a file that could not be checked once here.
    if let Some(f) = files.iter().find(|f| Sum::of(f).is_none()) {
        return Err(HubError::Unverifiable {
            endpoint: cfg.endpoint.clone(),
            file: f.name.clone(),
        });
    }
    let api = hub_api(cfg)?;
    // Pinned to the listed commit, so every file is the one the listing describes.
    let repo = api.repo(Repo::with_revision(
        req.repo.clone(),
        RepoType::Model,
        listing.commit.clone(),
    ));
    let job = FileJob {
        origin: Origin {
            http,
            repo: &repo,
            repo_id: &req.repo,
            revision: &req.revision,
            commit: &listing.commit,
        },
        lib,
    };
    meter.report.n_files = files.len();
    meter.report.total = files.iter().fold(0u64, |n, f| n.saturating_add(f.size));
    // Each file stays in the cache until every file is in hand: a pull cut off at shard 3 of 4
    // keeps shards 1 and 2 (and shard 3's bytes) for the next pull.
    let mut fetched: Vec<(PathBuf, &RepoFile, String)> = Vec::new();
    for (i, f) in files.iter().enumerate() {
        meter.report.file = f.name.clone();
        meter.report.file_index = i + 1;
        meter.report.stage = "downloading";
        let (blob, sha256) = download::fetch(&job, meter, f).await?;
        fetched.push((blob, f, sha256));
    }
    meter.check_cancel()?;
    meter.stage("installing");
    let single = files.len() == 1 && name.to_ascii_lowercase().ends_with(".gguf");
    let source = ModelSource::Hub {
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit: Some(listing.commit.clone()),
    };
    Ok(install(lib, &name, single, &fetched, source)?)
}

/// Moves the verified files from the cache into a staging folder (a file whose bytes another
/// one of the set already took is copied from it), then installs them as `name`.
fn install(
    lib: &Library,
    name: &str,
    single: bool,
    fetched: &[(PathBuf, &RepoFile, String)],
    source: ModelSource,
) -> Result<ModelEntry, IndexError> {
    let staging = lib.stage()?;
    let staged = staging.path().join(name);
    if !single {
        std::fs::create_dir(&staged).map_err(|e| write_error(lib.root(), name, &staged, e))?;
    }
    let mut installed: Vec<ModelFile> = Vec::new();
    let mut moved: Vec<(&PathBuf, PathBuf)> = Vec::new();
    for (blob, f, sha256) in fetched {
        let base = f.name.rsplit('/').next().unwrap_or(&f.name).to_string();
        let target = if single {
            staged.clone()
        } else {
            staged.join(&base)
        };
        if occupied(&target) {
            return Err(IndexError::Invalid {
                path: target,
                reason: format!("two files of the set are named {base}"),
            });
        }
        let done = match moved.iter().find(|(b, _)| *b == blob) {
            Some((_, first)) => std::fs::copy(first, &target).map(|_| ()),
            None => std::fs::rename(blob, &target),
        };
        done.map_err(|e| write_error(lib.root(), &f.name, &target, e))?;
        moved.push((blob, target));
        installed.push(ModelFile {
            name: base,
            size: f.size,
            sha256: sha256.clone(),
        });
    }
    lib.install(&staging, &staged, name, source, &installed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_names() {
        let f = |n: &str| RepoFile {
            name: n.into(),
            size: 1,
            sha256: None,
            blob_id: None,
        };
        assert_eq!(model_name("o/r", &[&f("q4/m.gguf")]), "m.gguf");
        let parts = [f("m-00001-of-00002.gguf"), f("m-00002-of-00002.gguf")];
        assert_eq!(model_name("o/r", &parts.iter().collect::<Vec<_>>()), "m");
        assert_eq!(model_name("o/tiny", &[&f("config.json")]), "tiny");
    }
}

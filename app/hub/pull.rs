//! [`pull`]: one model (a GGUF file or the safetensors set) from a Hub repo into the library,
//! through hf-hub's resumable download, verified and installed only when every file is whole.

use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hf_hub::api::tokio::{Api, ApiError, ApiRepo, Progress};
use hf_hub::{Repo, RepoType};
use tpslab_engine::library;
use tpslab_engine::library_index::{
    IndexError, Library, ModelEntry, ModelFile, ModelSource, write_error,
};

use super::{
    HubConfig, HubError, PullProgress, PullRequest, RepoFile, TICK, chain, list_files_async,
    runtime, status_error,
};

/// Speed is averaged over this window.
const SPEED_WINDOW: Duration = Duration::from_secs(3);

/// Byte counter handed to hf-hub (it clones it into each chunk task). hf-hub reports the bytes
/// a resumed file already has as its first update; those are counted apart from the speed.
#[derive(Clone, Default)]
struct Counter {
    bytes: Arc<AtomicU64>,
    resumed: Arc<AtomicU64>,
    started: Arc<AtomicBool>,
}

impl Progress for Counter {
    async fn init(&mut self, _size: usize, _filename: &str) {
        self.bytes.store(0, Ordering::Relaxed);
        self.resumed.store(0, Ordering::Relaxed);
        self.started.store(false, Ordering::Relaxed);
    }

    async fn update(&mut self, size: usize) {
        if !self.started.swap(true, Ordering::Relaxed) {
            self.resumed.fetch_add(size as u64, Ordering::Relaxed);
        }
        self.bytes.fetch_add(size as u64, Ordering::Relaxed);
    }

    async fn finish(&mut self) {}
}

/// Turns counters into [`PullProgress`] reports with speed and ETA.
struct Meter<'a> {
    report: PullProgress,
    /// (time, bytes transferred by this pull so far), for the speed.
    samples: VecDeque<(Instant, u64)>,
    /// Bytes of files finished before the current one, and bytes they resumed from.
    done_before: u64,
    resumed_before: u64,
    on_progress: &'a mut dyn FnMut(&PullProgress),
}

impl Meter<'_> {
    fn tick(&mut self, c: &Counter) {
        let now = Instant::now();
        let bytes = c.bytes.load(Ordering::Relaxed);
        let resumed = self.resumed_before + c.resumed.load(Ordering::Relaxed);
        self.report.done = self.done_before + bytes;
        let transferred = self.report.done.saturating_sub(resumed);
        self.samples.push_back((now, transferred));
        while self
            .samples
            .front()
            .is_some_and(|(t, _)| now.duration_since(*t) > SPEED_WINDOW)
        {
            self.samples.pop_front();
        }
        if let (Some((t0, b0)), Some((t1, b1))) = (self.samples.front(), self.samples.back()) {
            let dt = t1.duration_since(*t0).as_secs_f64();
            if dt > 0.2 {
                self.report.bytes_per_s = (b1 - b0) as f64 / dt;
            }
        }
        let left = self.report.total.saturating_sub(self.report.done);
        self.report.eta = (self.report.bytes_per_s > 0.0)
            .then(|| Duration::from_secs_f64(left as f64 / self.report.bytes_per_s));
        (self.on_progress)(&self.report);
    }

    fn stage(&mut self, stage: &'static str) {
        self.report.stage = stage;
        (self.on_progress)(&self.report);
    }
}

/// Runs `fut`, returning [`HubError::Cancelled`] within one tick of `cancel` being set, and
/// calling `tick` every [`TICK`].
async fn cancellable<T>(
    fut: impl Future<Output = T>,
    cancel: &AtomicBool,
    tick: &mut dyn FnMut(),
) -> Result<T, HubError> {
    let mut fut = std::pin::pin!(fut);
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(HubError::Cancelled);
        }
        if let Ok(out) = tokio::time::timeout(TICK, &mut fut).await {
            tick();
            return Ok(out);
        }
        tick();
    }
}

/// Downloads `req` from the Hub into `lib` and registers it (see the module doc of
/// [`crate::hub`]). Blocking; call it from a worker thread. `on_progress` is called about every
/// 0.1 s; setting `cancel` stops the download within about that time with
/// [`HubError::Cancelled`]. Whatever the outcome, the library holds either the whole verified
/// model or nothing new; an interrupted file resumes from hf-hub's partial file on the next
/// pull of the same repo.
pub fn pull(
    cfg: &HubConfig,
    lib: &Library,
    req: &PullRequest,
    cancel: &AtomicBool,
    on_progress: &mut dyn FnMut(&PullProgress),
) -> Result<ModelEntry, HubError> {
    let api = cfg.api(Some(lib))?;
    let rt = runtime()?;
    // hf-hub unwraps a redirect's Location header: a server that sends a redirect without one
    // would panic it. Such an answer is the server's fault, reported as an error here.
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(pull_async(&api, cfg, lib, req, cancel, on_progress))
    }))
    .unwrap_or_else(|_| {
        Err(HubError::BadAnswer {
            endpoint: cfg.endpoint.clone(),
            detail: "the download client failed on its answer (a redirect without a Location?)"
                .into(),
        })
    });
    // Dropping the runtime drops hf-hub's chunk tasks, so a cancelled download stops here.
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

/// The library name for `files`: the GGUF's file name, a split GGUF's name before its part
/// numbers, or the repo's name for a safetensors folder.
fn model_name(repo: &str, files: &[&RepoFile]) -> String {
    let base = |f: &RepoFile| f.name.rsplit('/').next().unwrap_or(&f.name).to_string();
    match files {
        [f] if f.name.to_ascii_lowercase().ends_with(".gguf") => base(f),
        [f, ..] => match tpslab_engine::gguf_split::first_part(&base(f)) {
            Some((prefix, _)) => prefix.to_string(),
            None => repo.rsplit('/').next().unwrap_or(repo).to_string(),
        },
        _ => repo.rsplit('/').next().unwrap_or(repo).to_string(),
    }
}

async fn pull_async(
    api: &Api,
    cfg: &HubConfig,
    lib: &Library,
    req: &PullRequest,
    cancel: &AtomicBool,
    on_progress: &mut dyn FnMut(&PullProgress),
) -> Result<ModelEntry, HubError> {
    let mut meter = Meter {
        report: PullProgress {
            stage: "listing",
            ..PullProgress::default()
        },
        samples: VecDeque::new(),
        done_before: 0,
        resumed_before: 0,
        on_progress,
    };
    meter.stage("listing");
    let listing = cancellable(
        list_files_async(api, cfg, &req.repo, &req.revision),
        cancel,
        &mut || {},
    )
    .await??;
    let files = listing.choose(&req.choice)?;
    if listing.gated && cfg.token.is_none() {
        return Err(HubError::GatedNoToken {
            repo: req.repo.clone(),
        });
    }
    let name = model_name(&req.repo, &files);
    if lib.root().join(&name).exists() {
        return Err(IndexError::Exists(name).into());
    }
    let staging = lib.stage()?;
    let single = files.len() == 1 && name.to_ascii_lowercase().ends_with(".gguf");
    let staged = staging.path().join(&name);
    if !single {
        std::fs::create_dir(&staged).map_err(|e| write_error(lib.root(), &name, &staged, e))?;
    }
    let (cache_repo, snapshot) = cache_dirs(lib, &req.repo, listing.commit.as_deref());
    let repo = api.repo(Repo::with_revision(
        req.repo.clone(),
        RepoType::Model,
        req.revision.clone(),
    ));
    meter.report.n_files = files.len();
    meter.report.total = files.iter().map(|f| f.size).sum();
    // Each file is verified where hf-hub put it and stays in its cache until every file is in
    // hand: a pull cut off at shard 3 of 4 keeps shards 1 and 2 (and shard 3's whole chunks)
    // for the next pull of the same commit.
    let mut verified: Vec<(PathBuf, PathBuf, ModelFile)> = Vec::new();
    let job = FileJob {
        repo: &repo,
        cfg,
        lib,
        req,
        cancel,
        snapshot: snapshot.as_deref(),
    };
    for (i, f) in files.iter().enumerate() {
        meter.report.file = f.name.clone();
        meter.report.file_index = i + 1;
        meter.report.stage = "downloading";
        let (blob, sha256) = fetch(&job, f, &mut meter).await?;
        let base = f.name.rsplit('/').next().unwrap_or(&f.name).to_string();
        let target = if single {
            staged.clone()
        } else {
            staged.join(&base)
        };
        verified.push((
            blob,
            target,
            ModelFile {
                name: base,
                size: f.size,
                sha256,
            },
        ));
        if cancel.load(Ordering::Relaxed) {
            return Err(HubError::Cancelled);
        }
    }
    meter.stage("installing");
    let mut installed = Vec::new();
    for (blob, target, file) in verified {
        std::fs::rename(&blob, &target)
            .map_err(|e| write_error(lib.root(), &file.name, &target, e))?;
        installed.push(file);
    }
    // The links to the moved blobs are stale now (and would make hf-hub's next link fail).
    if let Some(s) = &snapshot {
        let _ = std::fs::remove_dir_all(s);
    }
    let _ = std::fs::remove_dir_all(cache_repo.join("refs"));
    let source = ModelSource::Hub {
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit: listing.commit.clone(),
    };
    Ok(lib.install(&staging, &staged, &name, source, &installed)?)
}

/// hf-hub's cache folder of `repo`, and its snapshot folder of `commit`.
fn cache_dirs(lib: &Library, repo: &str, commit: Option<&str>) -> (PathBuf, Option<PathBuf>) {
    let dir = lib
        .hub_cache()
        .join(Repo::new(repo.to_string(), RepoType::Model).folder_name());
    let snapshot = commit.map(|c| dir.join("snapshots").join(c));
    (dir, snapshot)
}

/// What fetching one file of a pull needs.
struct FileJob<'a> {
    repo: &'a ApiRepo,
    cfg: &'a HubConfig,
    lib: &'a Library,
    req: &'a PullRequest,
    cancel: &'a AtomicBool,
    /// hf-hub's snapshot folder of the listed commit, where whole files of an earlier pull wait.
    snapshot: Option<&'a Path>,
}

/// One file into hf-hub's cache, verified: reused from an earlier pull when it is there whole,
/// else downloaded (resuming a partial one). Returns the blob's path and sha256.
async fn fetch(
    job: &FileJob<'_>,
    f: &RepoFile,
    meter: &mut Meter<'_>,
) -> Result<(PathBuf, String), HubError> {
    let counter = Counter::default();
    let cached = job.snapshot.map(|s| s.join(&f.name));
    let reuse = match &cached {
        Some(p) => match verify(f, p) {
            Ok(ok) => Some(ok),
            Err(_) => {
                // Missing, stale or a dangling link (hf-hub would fail to link over it).
                discard(p);
                None
            }
        },
        None => None,
    };
    let out = match reuse {
        Some(ok) => {
            counter.resumed.store(f.size, Ordering::Relaxed);
            counter.bytes.store(f.size, Ordering::Relaxed);
            meter.tick(&counter);
            ok
        }
        None => {
            let dl = job.repo.download_with_progress(&f.name, counter.clone());
            let pointer = cancellable(dl, job.cancel, &mut || meter.tick(&counter))
                .await?
                .map_err(|e| download_error(job.cfg, job.lib, job.req, &f.name, e))?;
            meter.stage("verifying");
            verify(f, &pointer).inspect_err(|_| discard(&pointer))?
        }
    };
    meter.done_before += f.size;
    meter.resumed_before += counter.resumed.load(Ordering::Relaxed);
    Ok(out)
}

/// Deletes a cached file and its link, so the next pull downloads it afresh.
fn discard(pointer: &Path) {
    if let Ok(blob) = std::fs::canonicalize(pointer) {
        let _ = std::fs::remove_file(blob);
    }
    let _ = std::fs::remove_file(pointer);
}

/// Checks a file in hf-hub's cache (by its link) against the listing's size and sha256;
/// returns the blob's path and its sha256.
fn verify(f: &RepoFile, pointer: &Path) -> Result<(PathBuf, String), HubError> {
    let blob: PathBuf = std::fs::canonicalize(pointer).map_err(|e| HubError::Interrupted {
        endpoint: String::new(),
        file: f.name.clone(),
        detail: format!("the downloaded file is missing: {e}"),
    })?;
    let found = std::fs::metadata(&blob).map_or(0, |m| m.len());
    if f.size > 0 && found != f.size {
        return Err(HubError::Size {
            file: f.name.clone(),
            expected: f.size,
            found,
        });
    }
    let sha256 = library::sha256_file(&blob).map_err(IndexError::from)?;
    if let Some(expected) = &f.sha256
        && !expected.eq_ignore_ascii_case(&sha256)
    {
        return Err(HubError::Checksum {
            file: f.name.clone(),
            expected: expected.clone(),
            found: sha256,
        });
    }
    Ok((blob, sha256))
}

/// A clear error for a failed file download (hf-hub keeps only the status of HTTP errors).
fn download_error(
    cfg: &HubConfig,
    lib: &Library,
    req: &PullRequest,
    file: &str,
    e: ApiError,
) -> HubError {
    match e {
        ApiError::RequestError(re) => match re.status().map(|s| s.as_u16()) {
            Some(404) => HubError::FileNotFound {
                repo: req.repo.clone(),
                file: file.to_string(),
            },
            Some(s @ (401 | 403)) => {
                status_error(cfg, &req.repo, &req.revision, file, s, "GatedRepo", "")
            }
            Some(s) => HubError::Http {
                url: re
                    .url()
                    .map_or_else(|| file.to_string(), ToString::to_string),
                status: s,
                message: chain(&re),
            },
            None if re.is_connect() => HubError::Network {
                endpoint: cfg.endpoint.clone(),
                detail: chain(&re),
            },
            None => HubError::Interrupted {
                endpoint: cfg.endpoint.clone(),
                file: file.to_string(),
                detail: chain(&re),
            },
        },
        ApiError::MissingHeader(h) | ApiError::InvalidHeader(h) => HubError::BadAnswer {
            endpoint: cfg.endpoint.clone(),
            detail: format!("the answer for {file} lacks a valid {h} header"),
        },
        ApiError::IoError(io) => write_error(lib.root(), file, &lib.hub_cache(), io).into(),
        ApiError::TooManyRetries(inner) => download_error(cfg, lib, req, file, *inner),
        other => HubError::Interrupted {
            endpoint: cfg.endpoint.clone(),
            file: file.to_string(),
            detail: chain(&other),
        },
    }
}

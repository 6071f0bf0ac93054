//! [`pull`]: one model (a GGUF file or the safetensors set) from a Hub repo into the library,
//! through hf-hub's resumable download, verified and installed only when every file is whole.

use std::collections::VecDeque;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use hf_hub::api::tokio::{Api, ApiError, Progress};
use hf_hub::{Repo, RepoType};
use tpslab_engine::library;
use tpslab_engine::library_index::{Library, ModelEntry, ModelFile, ModelSource, write_error};

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
    let result = rt.block_on(pull_async(&api, cfg, lib, req, cancel, on_progress));
    // Dropping the runtime drops hf-hub's chunk tasks, so a cancelled download stops here.
    rt.shutdown_timeout(Duration::from_secs(2));
    result
}

/// The library name for `files`: the GGUF's file name, or the repo's name for a folder.
fn model_name(repo: &str, files: &[&RepoFile]) -> String {
    match files {
        [f] if f.name.to_ascii_lowercase().ends_with(".gguf") => {
            f.name.rsplit('/').next().unwrap_or(&f.name).to_string()
        }
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
        return Err(tpslab_engine::library_index::IndexError::Exists(name).into());
    }
    let staging = lib.stage()?;
    let single = files.len() == 1 && name.to_ascii_lowercase().ends_with(".gguf");
    let staged = staging.path().join(&name);
    if !single {
        std::fs::create_dir(&staged).map_err(|e| write_error(lib.root(), &name, &staged, e))?;
    }
    // hf-hub links each finished blob from snapshots/; those links are stale once we move the
    // blobs away, and a stale one makes hf-hub's next link fail: start without them.
    let cache_repo = lib.hub_cache().join(
        Repo::new(req.repo.clone(), RepoType::Model)
            .folder_name()
            .replace('/', "--"),
    );
    let _ = std::fs::remove_dir_all(cache_repo.join("snapshots"));
    let repo = api.repo(Repo::with_revision(
        req.repo.clone(),
        RepoType::Model,
        req.revision.clone(),
    ));
    meter.report.n_files = files.len();
    meter.report.total = files.iter().map(|f| f.size).sum();
    let mut installed = Vec::new();
    for (i, f) in files.iter().enumerate() {
        meter.report.file = f.name.clone();
        meter.report.file_index = i + 1;
        meter.report.stage = "downloading";
        let counter = Counter::default();
        let dl = repo.download_with_progress(&f.name, counter.clone());
        let pointer = cancellable(dl, cancel, &mut || meter.tick(&counter))
            .await?
            .map_err(|e| download_error(cfg, lib, req, &f.name, e))?;
        meter.done_before += f.size;
        meter.resumed_before += counter.resumed.load(Ordering::Relaxed);
        meter.stage("verifying");
        let base = f.name.rsplit('/').next().unwrap_or(&f.name).to_string();
        let target = if single {
            staged.clone()
        } else {
            staged.join(&base)
        };
        let sha256 = verify_and_move(lib, f, &pointer, &target)?;
        installed.push(ModelFile {
            name: base,
            size: f.size,
            sha256,
        });
        if cancel.load(Ordering::Relaxed) {
            return Err(HubError::Cancelled);
        }
    }
    meter.stage("installing");
    let _ = std::fs::remove_dir_all(cache_repo.join("snapshots"));
    let _ = std::fs::remove_dir_all(cache_repo.join("refs"));
    let source = ModelSource::Hub {
        repo: req.repo.clone(),
        revision: req.revision.clone(),
        commit: listing.commit.clone(),
    };
    Ok(lib.install(&staging, &staged, &name, source, &installed)?)
}

/// Checks the downloaded file's size and sha256 against the listing, then moves it out of
/// hf-hub's cache into the staging folder. A file that fails is deleted, so the next pull
/// downloads it afresh.
fn verify_and_move(
    lib: &Library,
    f: &RepoFile,
    pointer: &Path,
    target: &Path,
) -> Result<String, HubError> {
    let blob: PathBuf = std::fs::canonicalize(pointer).unwrap_or_else(|_| pointer.to_path_buf());
    let discard = || {
        let _ = std::fs::remove_file(&blob);
        let _ = std::fs::remove_file(pointer);
    };
    let found = std::fs::metadata(&blob).map_or(0, |m| m.len());
    if f.size > 0 && found != f.size {
        discard();
        return Err(HubError::Size {
            file: f.name.clone(),
            expected: f.size,
            found,
        });
    }
    let sha256 =
        library::sha256_file(&blob).map_err(tpslab_engine::library_index::IndexError::from)?;
    if let Some(expected) = &f.sha256
        && !expected.eq_ignore_ascii_case(&sha256)
    {
        discard();
        return Err(HubError::Checksum {
            file: f.name.clone(),
            expected: expected.clone(),
            found: sha256,
        });
    }
    std::fs::rename(&blob, target).map_err(|e| write_error(lib.root(), &f.name, target, e))?;
    let _ = std::fs::remove_file(pointer);
    Ok(sha256)
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

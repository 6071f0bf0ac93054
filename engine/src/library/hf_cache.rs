//! The Hugging Face cache, read where it is: models that `huggingface_hub`, `transformers` or
//! llama.cpp downloaded are found by repo and quant and loaded in place; nothing is copied out
//! of the cache and nothing is ever written into it.
//!
//! Where: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`
//! ([`HfCache::locate`]). The layout, as `huggingface_hub` writes it:
//!
//! ```text
//! models--owner--name/
//!   refs/main                     the commit `main` points at (40 hex digits)
//!   snapshots/<commit>/<file>     a link to ../../blobs/<etag> (a plain file on some systems)
//!   blobs/<etag>                  the bytes
//! ```
//!
//! Why not `hf_hub::Cache`: it reads `HF_HOME` but not `HF_HUB_CACHE`, panics where there is
//! no home folder, puts the text of `refs/main` into a path unchecked, and cannot list repos or
//! a snapshot's files (which the quant choice and the library listing need). What it knows of
//! the layout (`models--owner--name`, refs, snapshots) is written here with checks instead.
//!
//! A snapshot with no GGUF file that is a transformers folder (`config.json`, `tokenizer.json`,
//! safetensors weights) is found by its repo alone and loaded as a folder, in place, as
//! `transformers` would load it.
//!
//! Everything in the cache is treated as untrusted, as a Hub's answers are: repo folders must
//! read back as valid repo ids, refs must hold a commit id, file names must be plain relative
//! names ([`crate::library::check_name`]), and every path handed on must, with every link
//! resolved, stay inside the cache's root: a link to `/etc` or out of the cache is refused by
//! name ([`LibraryError::HfCache`]).

use std::path::{Path, PathBuf};

use crate::library::LibraryError;
use crate::library::check_name;
use crate::library::describe::describe;
use crate::library::entry::{ModelEntry, ModelSource};
use crate::library::model_ref::{
    HubRef, RefError, check_repo_id, commit_id, is_model_gguf, pick_gguf, quant_tag, shown,
};

/// A ref file past this size is not a commit id.
const MAX_REF: u64 = 256;
/// Folders deep and entries walked in one snapshot (real repos have a few levels, a few
/// thousand files).
const MAX_DEPTH: usize = 8;
const MAX_ENTRIES: usize = 20_000;
/// The folder prefix of model repos.
const MODELS: &str = "models--";

/// The Hugging Face cache at one root (its real path, every link resolved).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HfCache {
    root: PathBuf,
}

/// One repo's snapshot in the cache: the commit `refs/main` names and the snapshot's files.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub repo: String,
    pub commit: String,
    /// `<root>/models--owner--name/snapshots/<commit>`.
    pub dir: PathBuf,
    /// Relative names, `/`-separated, each checked by [`check_name`].
    pub files: Vec<String>,
}

/// The cache folder the environment names: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
/// `~/.cache/huggingface/hub` (whether or not it exists).
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    var("HF_HUB_CACHE")
        .or_else(|| var("HF_HOME").map(|h| h.join("hub")))
        .or_else(|| dirs::home_dir().map(|h| h.join(".cache").join("huggingface").join("hub")))
}

impl HfCache {
    /// The cache the environment names ([`cache_dir`]), when that folder exists.
    pub fn locate() -> Option<Self> {
        Self::at(&cache_dir()?)
    }

    /// The cache at `dir`, when it exists.
    pub fn at(dir: &Path) -> Option<Self> {
        let root = std::fs::canonicalize(dir).ok()?;
        root.is_dir().then_some(Self { root })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    fn refused(&self, path: &Path, reason: String) -> LibraryError {
        LibraryError::HfCache {
            path: path.to_path_buf(),
            reason,
        }
    }

    /// `path` with every link resolved, when that stays inside the root.
    fn inside(&self, path: &Path) -> Result<PathBuf, LibraryError> {
        let real = std::fs::canonicalize(path)
            .map_err(|e| self.refused(path, format!("it cannot be resolved ({e})")))?;
        if !real.starts_with(&self.root) {
            return Err(self.refused(
                path,
                format!(
                    "it leads out of the cache {}, to {}",
                    self.root.display(),
                    real.display()
                ),
            ));
        }
        Ok(real)
    }

    /// The repo's snapshot that `refs/main` names (or its only snapshot, where there is no
    /// ref), `None` when the cache does not hold the repo.
    pub fn snapshot(&self, repo: &str) -> Result<Option<Snapshot>, LibraryError> {
        check_repo_id(repo).map_err(|why| RefError::BadRepo {
            text: shown(repo),
            why,
        })?;
        let dir = self
            .root
            .join(format!("{MODELS}{}", repo.replace('/', "--")));
        if std::fs::symlink_metadata(&dir).is_err() {
            return Ok(None);
        }
        if !self.inside(&dir)?.is_dir() {
            return Err(self.refused(&dir, "it is not a folder".into()));
        }
        let Some(commit) = self.commit(&dir)? else {
            return Ok(None);
        };
        let snap = dir.join("snapshots").join(&commit);
        if std::fs::symlink_metadata(&snap).is_err() {
            return Ok(None);
        }
        if !self.inside(&snap)?.is_dir() {
            return Err(self.refused(&snap, "it is not a folder".into()));
        }
        let mut files = Vec::new();
        self.walk(&snap, "", 0, &mut files)?;
        files.sort();
        Ok(Some(Snapshot {
            repo: repo.to_string(),
            commit,
            dir: snap,
            files,
        }))
    }

    /// The commit `refs/main` holds (checked: 40 hex digits), else the name of the repo's only
    /// snapshot; `None` when there is neither.
    fn commit(&self, repo_dir: &Path) -> Result<Option<String>, LibraryError> {
        let main = repo_dir.join("refs").join("main");
        if std::fs::symlink_metadata(&main).is_ok() {
            let real = self.inside(&main)?;
            let md = std::fs::metadata(&real).map_err(|e| self.refused(&main, e.to_string()))?;
            if !md.is_file() || md.len() > MAX_REF {
                return Err(self.refused(&main, "it is not a small file".into()));
            }
            let text = std::fs::read(&real).map_err(|e| self.refused(&main, e.to_string()))?;
            let text = String::from_utf8_lossy(&text);
            return match commit_id(text.trim()) {
                Some(c) => Ok(Some(c)),
                None => Err(self.refused(
                    &main,
                    format!("it holds {}, not a commit hash", shown(text.trim())),
                )),
            };
        }
        let snaps = repo_dir.join("snapshots");
        let commits: Vec<String> = std::fs::read_dir(&snaps)
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| commit_id(n).as_deref() == Some(n.as_str()))
            .collect();
        match commits.as_slice() {
            [one] => Ok(Some(one.clone())),
            _ => Ok(None),
        }
    }

    /// The files under `dir` (real folders walked, links to folders not followed), as names
    /// relative to the snapshot.
    fn walk(
        &self,
        dir: &Path,
        rel: &str,
        depth: usize,
        out: &mut Vec<String>,
    ) -> Result<(), LibraryError> {
        if depth > MAX_DEPTH {
            return Err(self.refused(dir, format!("it is more than {MAX_DEPTH} folders deep")));
        }
        let rd = std::fs::read_dir(dir).map_err(|e| self.refused(dir, e.to_string()))?;
        for e in rd.flatten() {
            if out.len() >= MAX_ENTRIES {
                return Err(self.refused(dir, format!("it holds over {MAX_ENTRIES} files")));
            }
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let full = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            if check_name(&full).is_err() {
                continue;
            }
            match e.file_type() {
                Ok(t) if t.is_dir() => self.walk(&e.path(), &full, depth + 1, out)?,
                Ok(t) if t.is_file() || t.is_symlink() => out.push(full),
                _ => {}
            }
        }
        Ok(())
    }

    /// The GGUF model `r` names in the cache: the path to load (in the snapshot, the first part
    /// of a split model), every file of it checked to resolve inside the cache. `None` when
    /// the cache lacks the repo, the quant, or a part.
    pub fn find(&self, r: &HubRef) -> Result<Option<PathBuf>, LibraryError> {
        let Some(snap) = self.snapshot(&r.repo)? else {
            return Ok(None);
        };
        let names: Vec<&str> = snap.files.iter().map(String::as_str).collect();
        let files = match pick_gguf(r, &names) {
            Ok(f) => f,
            // No GGUF and no quant asked: a transformers folder runs as it is.
            Err(RefError::NoGguf { .. }) if r.quant.is_none() && is_hf_folder(&snap.files) => {
                return self.hf_folder(&snap).map(Some);
            }
            Err(RefError::NoGguf { .. } | RefError::MissingPart { .. }) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let first = files.first().map(|f| snap.dir.join(f));
        for f in &files {
            self.checked_file(&snap.dir.join(f))?;
        }
        Ok(first)
    }

    /// The snapshot's folder as the engine loads a transformers folder, every file at its top
    /// checked to resolve inside the cache.
    fn hf_folder(&self, snap: &Snapshot) -> Result<PathBuf, LibraryError> {
        for f in snap.files.iter().filter(|f| !f.contains('/')) {
            self.checked_file(&snap.dir.join(f))?;
        }
        Ok(snap.dir.clone())
    }

    /// Refuses `path` unless it resolves to a file inside the cache.
    fn checked_file(&self, path: &Path) -> Result<(), LibraryError> {
        if self.inside(path)?.is_file() {
            Ok(())
        } else {
            Err(self.refused(path, "it is not a file".into()))
        }
    }

    /// The model file `f` of `snap` and, for a split model's first part, every other part,
    /// each checked as [`Self::find`] checks them.
    fn check_model(&self, snap: &Snapshot, f: &str) -> Result<(), LibraryError> {
        let (dir, base) = f.rsplit_once('/').map_or(("", f), |(d, b)| (d, b));
        let names =
            crate::formats::gguf_split::part_names(base).unwrap_or_else(|| vec![base.into()]);
        for n in names {
            let rel = if dir.is_empty() {
                n
            } else {
                format!("{dir}/{n}")
            };
            self.checked_file(&snap.dir.join(rel))?;
        }
        Ok(())
    }

    /// Every repo the cache holds (as `models--owner--name` folders), read back as repo ids;
    /// folders whose names are no repo id are returned apart.
    pub fn repos(&self) -> (Vec<String>, Vec<String>) {
        let mut ok = Vec::new();
        let mut bad = Vec::new();
        for e in std::fs::read_dir(&self.root)
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(name) = e.file_name().into_string() else {
                continue;
            };
            let Some(rest) = name.strip_prefix(MODELS) else {
                continue;
            };
            let repo = rest.replacen("--", "/", 1);
            match check_repo_id(&repo) {
                Ok(()) => ok.push(repo),
                Err(why) => bad.push(format!("{}: not a repo id: {why}", shown(&name))),
            }
        }
        ok.sort();
        (ok, bad)
    }

    /// Every GGUF model in the cache as the library lists models: named `owner/name:TAG` (what
    /// `--model` takes back), source `hf-cache`, path in the snapshot, described from its
    /// header (no sha256: nothing is hashed or written). What cannot be read is returned apart
    /// with its reason.
    pub fn list(&self) -> (Vec<ModelEntry>, Vec<String>) {
        let (repos, mut bad) = self.repos();
        let mut models = Vec::new();
        for repo in repos {
            let snap = match self.snapshot(&repo) {
                Ok(Some(s)) => s,
                Ok(None) => continue,
                Err(e) => {
                    bad.push(format!("{repo}: {e}"));
                    continue;
                }
            };
            for f in snap.files.iter().filter(|f| is_model_gguf(f)) {
                let base = f.rsplit('/').next().unwrap_or(f);
                let tag = quant_tag(f).unwrap_or_else(|| base[..base.len() - 5].to_string());
                let name = format!("{repo}:{tag}");
                let source = ModelSource::HfCache {
                    repo: repo.clone(),
                    commit: snap.commit.clone(),
                };
                let path = snap.dir.join(f);
                if let Err(e) = self.check_model(&snap, f) {
                    bad.push(format!("{name}: {e}"));
                    continue;
                }
                match describe(&path, &name, source, false) {
                    Ok(m) => models.push(m),
                    Err(e) => bad.push(format!("{name}: {e}")),
                }
            }
            if is_hf_folder(&snap.files) && !snap.files.iter().any(|f| is_model_gguf(f)) {
                let source = ModelSource::HfCache {
                    repo: repo.clone(),
                    commit: snap.commit.clone(),
                };
                match self.hf_folder(&snap) {
                    Ok(dir) => match describe(&dir, &repo, source, false) {
                        Ok(m) => models.push(m),
                        Err(e) => bad.push(format!("{repo}: {e}")),
                    },
                    Err(e) => bad.push(format!("{repo}: {e}")),
                }
            }
        }
        (models, bad)
    }
}

/// Whether a snapshot is a transformers model folder: a `config.json`, a `tokenizer.json` and
/// safetensors weights at its top.
fn is_hf_folder(files: &[String]) -> bool {
    let top = |name: &str| files.iter().any(|f| f == name);
    top("config.json")
        && top("tokenizer.json")
        && files
            .iter()
            .any(|f| !f.contains('/') && f.ends_with(".safetensors"))
}

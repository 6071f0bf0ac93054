//! The model library index: every model in the library folder with its source, files,
//! architecture, parameter count, precision, size, context length and sha256; importing a GGUF
//! file or a safetensors folder by path; installing staged downloads; removing models.
//!
//! Layout of the library folder ([`crate::library::models_dir`]):
//!
//! ```text
//! models/
//!   SmolLM2-135M-Instruct.Q4_1.gguf   a model: a GGUF file ...
//!   SmolLM2-135M/                     ... or a folder (config.json + *.safetensors, or one GGUF)
//!   .index/<model name>.json          its manifest: source, files with sha256, shape facts
//!   .staging/<unique>/                work in progress (imports, downloads); never listed
//!   .hub-cache/blobs/<sum>[.part]     the Hub client's cache: partial downloads kept for
//!                                     resuming, named by the checksum the Hub lists
//! ```
//!
//! Every change is staged first and made visible by renames: a model is copied (or downloaded)
//! into `.staging`, verified by reading its header and hashed, its manifest is written there too,
//! then the model is renamed into `models/` and the manifest into `.index/`. A failure at any
//! step (a broken file, a full disk, an unwritable folder, a cancel) removes the staging folder,
//! so the library is as it was. Models that arrive without a manifest (the default model fetched
//! by [`crate::library::ensure_default_model`], a `tpslab quantize` output written into the
//! folder) are described from their headers and indexed on first listing ([`Library::list_indexed`]).
//!
//! Nothing is written or deleted through a symbolic link inside the library: every folder the
//! library writes into is checked to be a real folder first ([`Library::subdir`]), files are
//! created with `create_new` (which does not follow links), and a link where a model, a staging
//! folder or a download would go is refused with [`IndexError::Link`]. (The library folder itself
//! may be a link: that is the user's choice, not something a download planted.) Whatever goes in
//! must be a model the engine loads ([`crate::library::describe::check_loadable`]).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::library;
pub use crate::library::describe::describe;
use crate::library::describe::{
    check_headers, check_loadable, combined_sha, file_at, hex, load_path,
};
pub use crate::library::entry::{
    IndexError, ModelEntry, ModelFile, ModelFormat, ModelSource, write_error,
};
pub use crate::library::entry::{is_model_name, occupied};
use crate::library::hf_cache::HfCache;

const INDEX_DIR: &str = ".index";
const STAGING_DIR: &str = ".staging";
/// The Hub client's cache inside the library (same file system, so finished files are renamed,
/// not copied).
pub const HUB_CACHE_DIR: &str = ".hub-cache";
const MANIFEST_VERSION: u32 = 1;
/// A manifest past this size is not ours: refuse before reading it.
const MAX_JSON: u64 = 1 << 20;

#[derive(Debug, Serialize, Deserialize)]
struct Manifest {
    version: u32,
    #[serde(flatten)]
    entry: ModelEntry,
}

/// The library folder and its index, and the Hugging Face cache listed beside it (read only).
#[derive(Debug, Clone)]
pub struct Library {
    root: PathBuf,
    hf: Option<HfCache>,
}

/// A private staging folder inside the library, removed with everything in it when dropped
/// (unless its contents were installed first).
#[derive(Debug)]
pub struct Staging {
    dir: PathBuf,
}

impl Staging {
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
        // The shared `.staging` folder too, once no pull or import uses it (remove_dir only
        // removes an empty folder).
        if let Some(base) = self.dir.parent() {
            let _ = std::fs::remove_dir(base);
        }
    }
}

/// Removes staging folders left by processes that died mid-way (killed, power cut): each is
/// named after its process id, and on Linux a process that is gone has no `/proc/<pid>`.
/// `base` is the checked `.staging` folder (never a link to somewhere else).
fn sweep_staging(base: &Path) {
    if !cfg!(target_os = "linux") {
        return;
    }
    let Ok(rd) = std::fs::read_dir(base) else {
        return;
    };
    for e in rd.filter_map(Result::ok) {
        let name = e.file_name().to_string_lossy().into_owned();
        let pid = name.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The metadata of the plain file at `path`, `None` when nothing is there; a link or anything
/// else that is not a plain file with one name is refused ([`IndexError::Link`]): a download
/// writes, renames and deletes only files it made itself.
pub fn plain_file(path: &Path) -> Result<Option<std::fs::Metadata>, IndexError> {
    match std::fs::symlink_metadata(path) {
        Ok(md) if md.is_file() && links(&md) == 1 => Ok(Some(md)),
        Ok(_) => Err(IndexError::Link {
            path: path.to_path_buf(),
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(IndexError::Io {
            path: path.to_path_buf(),
            err,
        }),
    }
}

/// How many names the file has (a hard link planted in the library would let a write reach a
/// file elsewhere).
fn links(md: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        std::os::unix::fs::MetadataExt::nlink(md)
    }
    #[cfg(not(unix))]
    {
        let _ = md;
        1
    }
}

fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        "{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

impl Library {
    /// The library at `$TPSLAB_HOME/models` (or the platform data folder), with the Hugging
    /// Face cache the environment names ([`HfCache::locate`]).
    pub fn open() -> Result<Self, IndexError> {
        Ok(Self::at(library::models_dir()?).with_hf_cache(HfCache::locate()))
    }

    /// The library at `dir` (tests and tools that pick their own folder), without a Hugging
    /// Face cache.
    pub fn at(dir: impl Into<PathBuf>) -> Self {
        Self {
            root: dir.into(),
            hf: None,
        }
    }

    /// This library listing (and finding models in) the Hugging Face cache `hf` too.
    pub fn with_hf_cache(self, hf: Option<HfCache>) -> Self {
        Self { hf, ..self }
    }

    /// The Hugging Face cache listed beside the library, if any.
    pub fn hf_cache(&self) -> Option<&HfCache> {
        self.hf.as_ref()
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The Hub client's cache folder inside the library (partial downloads live there).
    pub fn hub_cache(&self) -> PathBuf {
        self.root.join(HUB_CACHE_DIR)
    }

    /// The folder `parts` (one name each, chosen by the program) inside the library, creating
    /// it and the library folder when missing. Each folder on the way must be a real folder: a
    /// symbolic link planted there would send writes and deletes outside the library.
    pub fn subdir(&self, parts: &[&str]) -> Result<PathBuf, IndexError> {
        std::fs::create_dir_all(&self.root)
            .map_err(|e| write_error(&self.root, "the library folder", &self.root, e))?;
        let mut dir = self.root.clone();
        for part in parts {
            dir.push(part);
            match std::fs::symlink_metadata(&dir) {
                Ok(md) if md.is_dir() => {}
                Ok(_) => return Err(IndexError::Link { path: dir }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    match std::fs::create_dir(&dir) {
                        Ok(()) => {}
                        // Made by a concurrent pull in between: checked again below.
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                            if !std::fs::symlink_metadata(&dir).is_ok_and(|m| m.is_dir()) {
                                return Err(IndexError::Link { path: dir });
                            }
                        }
                        Err(e) => return Err(write_error(&self.root, part, &dir, e)),
                    }
                }
                Err(err) => return Err(IndexError::Io { path: dir, err }),
            }
        }
        Ok(dir)
    }

    fn manifest_path(&self, name: &str) -> PathBuf {
        self.root.join(INDEX_DIR).join(format!("{name}.json"))
    }

    /// Creates a staging folder inside the library; a folder that cannot be created (missing
    /// permissions, a file in the way, a full disk) is reported as such.
    pub fn stage(&self) -> Result<Staging, IndexError> {
        let base = self.subdir(&[STAGING_DIR])?;
        sweep_staging(&base);
        let dir = base.join(unique());
        let mut made = std::fs::create_dir(&dir);
        if made
            .as_ref()
            .is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound)
        {
            // Another process's finished staging removed the empty `.staging` in between.
            self.subdir(&[STAGING_DIR])?;
            made = std::fs::create_dir(&dir);
        }
        made.map_err(|e| write_error(&self.root, "a staging folder", &dir, e))?;
        Ok(Staging { dir })
    }

    /// Partial downloads kept in the hub cache to resume from: (file, bytes on disk).
    pub fn partial_downloads(&self) -> Vec<(PathBuf, u64)> {
        fn walk(dir: &Path, out: &mut Vec<(PathBuf, u64)>) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let p = e.path();
                match e.file_type() {
                    Ok(t) if t.is_dir() => walk(&p, out),
                    Ok(t) if t.is_file() && p.to_string_lossy().ends_with(".part") => {
                        // Sparse until whole: count the blocks really written.
                        let len = e.metadata().map_or(0, |m| allocated(&m));
                        out.push((p, len));
                    }
                    _ => {}
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.hub_cache(), &mut out);
        out
    }

    /// Every model in the folder. Models without a manifest are described from their headers
    /// with an empty sha256 (no hashing, no writing: cheap enough for every UI refresh).
    /// Entries that are not readable models are returned apart, each with its reason.
    pub fn list(&self) -> Result<(Vec<ModelEntry>, Vec<String>), IndexError> {
        let rd = match std::fs::read_dir(&self.root) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Vec::new(), Vec::new()));
            }
            Err(err) => {
                return Err(IndexError::Io {
                    path: self.root.clone(),
                    err,
                });
            }
        };
        let mut names: Vec<String> = rd
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().into_string().ok())
            .filter(|n| is_model_name(n))
            .collect();
        names.sort();
        let mut models = Vec::new();
        let mut bad = Vec::new();
        for name in names {
            let path = self.root.join(&name);
            if path.is_file() && !name.to_ascii_lowercase().ends_with(".gguf") {
                continue;
            }
            match self.entry(&name) {
                Ok(m) => models.push(m),
                Err(e) => bad.push(format!("{name}: {e}")),
            }
        }
        Ok((models, bad))
    }

    /// [`Self::list`], then hashes every model without a manifest and stores one (once per
    /// model; a library that cannot be written still lists, with those sha256 computed anyway);
    /// then the Hugging Face cache's GGUF models ([`HfCache::list`]: source `hf-cache`, not
    /// hashed, nothing written).
    pub fn list_indexed(&self) -> Result<(Vec<ModelEntry>, Vec<String>), IndexError> {
        let (mut models, mut bad) = self.list()?;
        for m in models.iter_mut().filter(|m| !m.is_indexed()) {
            let source = m.source.clone();
            if let Ok(full) = self.describe_hashed(&m.name, source) {
                let _ = self.write_manifest(&full);
                *m = full;
            }
        }
        if let Some(hf) = &self.hf {
            let (more, unreadable) = hf.list();
            models.extend(more);
            bad.extend(unreadable);
        }
        Ok((models, bad))
    }

    /// The model `name`: from its manifest when that still matches the files on disk, else
    /// described from its headers (sha256 empty).
    pub fn entry(&self, name: &str) -> Result<ModelEntry, IndexError> {
        let path = self.root.join(name);
        if !is_model_name(name) || !path.exists() {
            return Err(IndexError::NotFound(name.to_string()));
        }
        if let Some(m) = self.read_manifest(name) {
            let on_disk: Option<u64> = m
                .files
                .iter()
                .map(|f| file_at(&path, &f.name).and_then(|p| std::fs::metadata(p).ok()))
                .map(|md| md.map(|md| md.len()))
                .sum();
            if on_disk == Some(m.size) {
                let path = load_path(&path, m.format, &m.files);
                return Ok(ModelEntry { path, ..m });
            }
        }
        let source = self.guess_source(name, &path);
        describe(&path, name, source, false)
    }

    fn read_manifest(&self, name: &str) -> Option<ModelEntry> {
        let p = self.manifest_path(name);
        if std::fs::metadata(&p).ok()?.len() > MAX_JSON {
            return None;
        }
        let m: Manifest = serde_json::from_slice(&std::fs::read(&p).ok()?).ok()?;
        (m.version == MANIFEST_VERSION && m.entry.name == name).then_some(m.entry)
    }

    fn guess_source(&self, name: &str, path: &Path) -> ModelSource {
        if let Ok(d) = library::default_manifest()
            && d.file == name
            && std::fs::metadata(path).is_ok_and(|md| md.len() == d.size)
        {
            return ModelSource::Default {
                package: d.source.package,
            };
        }
        ModelSource::Local
    }

    fn describe_hashed(&self, name: &str, source: ModelSource) -> Result<ModelEntry, IndexError> {
        let path = self.root.join(name);
        // The default model's sha256 is known (and was checked when it was fetched).
        if let (ModelSource::Default { .. }, Ok(d)) = (&source, library::default_manifest()) {
            let mut m = describe(&path, name, source.clone(), false)?;
            if let [f] = m.files.as_mut_slice() {
                f.sha256 = d.sha256.clone();
                m.sha256 = d.sha256;
                return Ok(m);
            }
        }
        describe(&path, name, source, true)
    }

    /// Writes `entry`'s manifest whole ([`library::write_whole`]: a synced temporary file in
    /// `.index` renamed over the old one).
    fn write_manifest(&self, entry: &ModelEntry) -> Result<(), IndexError> {
        let dir = self.subdir(&[INDEX_DIR])?;
        let json = serde_json::to_vec_pretty(&Manifest {
            version: MANIFEST_VERSION,
            entry: entry.clone(),
        })
        .map_err(|e| IndexError::Invalid {
            path: dir.clone(),
            reason: e.to_string(),
        })?;
        let dest = self.manifest_path(&entry.name);
        library::write_whole(&dest, &json)
            .map_err(|e| write_error(&self.root, "the index", &dest, e))
    }

    /// Installs a model staged under `staging` (a GGUF file or a folder at `staged`) as `name`:
    /// verifies it by reading its header, hashes its files (unless `known` gives their sha256,
    /// already checked by the caller), writes its manifest and renames both into place.
    pub fn install(
        &self,
        staging: &Staging,
        staged: &Path,
        name: &str,
        source: ModelSource,
        known: &[ModelFile],
    ) -> Result<ModelEntry, IndexError> {
        if !is_model_name(name) {
            return Err(IndexError::Invalid {
                path: PathBuf::from(name),
                reason: "not a usable model name".into(),
            });
        }
        let dest = self.root.join(name);
        if occupied(&dest) {
            return Err(IndexError::Exists(name.to_string()));
        }
        let hash = known.is_empty();
        let mut entry = describe(staged, name, source, hash)?;
        check_loadable(&entry)?;
        if !hash {
            for f in &mut entry.files {
                let k = known.iter().find(|k| k.name == f.name && k.size == f.size);
                f.sha256 = k
                    .map(|k| k.sha256.clone())
                    .ok_or_else(|| IndexError::Invalid {
                        path: staged.to_path_buf(),
                        reason: format!("{} has no known sha256", f.name),
                    })?;
            }
            entry.sha256 = combined_sha(&entry.format, &entry.files);
        }
        // The model is renamed into place first, then its manifest (temp file + rename); if the
        // manifest cannot be written the model is moved back into staging, so neither stays.
        self.subdir(&[INDEX_DIR])?;
        std::fs::rename(staged, &dest).map_err(|e| write_error(&self.root, name, &dest, e))?;
        if let Err(e) = self.write_manifest(&entry) {
            let _ = std::fs::rename(&dest, staging.path().join("rollback"));
            return Err(e);
        }
        entry.path = load_path(&dest, entry.format, &entry.files);
        Ok(entry)
    }

    /// Records `source` (and the sha256) of a model already in the folder, e.g. a quantizer
    /// output written there.
    pub fn register(&self, name: &str, source: ModelSource) -> Result<ModelEntry, IndexError> {
        if !self.root.join(name).exists() || !is_model_name(name) {
            return Err(IndexError::NotFound(name.to_string()));
        }
        let entry = self.describe_hashed(name, source)?;
        self.write_manifest(&entry)?;
        Ok(entry)
    }

    /// Copies a GGUF file or a safetensors folder into the library (as its file or folder
    /// name), checking its header before copying (every tensor the engine loads named, shaped
    /// and typed as it needs: [`check_headers`]) and again on the copy, hashing while copying.
    /// `progress(done, total)` in bytes; `cancel` stops between 1 MiB blocks.
    pub fn import(
        &self,
        src: &Path,
        cancel: &AtomicBool,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<ModelEntry, IndexError> {
        self.import_with(src, cancel, progress, &mut |p| {
            std::fs::File::create_new(p).map(|f| Box::new(f) as Box<dyn Write>)
        })
    }

    /// [`Self::import`] writing through `create` (tests inject a writer that fails there).
    #[doc(hidden)]
    pub fn import_with(
        &self,
        src: &Path,
        cancel: &AtomicBool,
        progress: &mut dyn FnMut(u64, u64),
        create: &mut dyn FnMut(&Path) -> std::io::Result<Box<dyn Write>>,
    ) -> Result<ModelEntry, IndexError> {
        let name = src
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| is_model_name(n))
            .ok_or_else(|| IndexError::Invalid {
                path: src.to_path_buf(),
                reason: "no usable file or folder name".into(),
            })?
            .to_string();
        // Refuse a broken source before anything is created.
        let checked = describe(src, &name, ModelSource::Local, false)?;
        check_loadable(&checked)?;
        check_headers(&checked)?;
        if checked.format == ModelFormat::Gguf && src.is_dir() {
            // A folder holding one GGUF: that file is the model.
            return self.import_with(&checked.path, cancel, progress, create);
        }
        // A split GGUF (its first part named) goes in as a folder of its parts.
        let folder = checked.format == ModelFormat::Safetensors || checked.files.len() > 1;
        let name = match crate::formats::gguf_split::first_part(&name) {
            Some((prefix, _)) if folder => prefix.to_string(),
            _ => name,
        };
        if occupied(&self.root.join(&name)) {
            return Err(IndexError::Exists(name));
        }
        let staging = self.stage()?;
        let staged = staging.path().join(&name);
        let total = checked.size;
        let mut done = 0u64;
        let mut files = Vec::new();
        if folder {
            std::fs::create_dir(&staged).map_err(|e| write_error(&self.root, &name, &staged, e))?;
        }
        for f in &checked.files {
            let from = file_at(src, &f.name).ok_or_else(|| IndexError::NotFound(f.name.clone()))?;
            let to = if folder {
                staged.join(&f.name)
            } else {
                staged.clone()
            };
            let out = create(&to).map_err(|e| write_error(&self.root, &name, &to, e))?;
            let sha256 = copy_hashing(&from, out, &to, &self.root, &name, cancel, &mut |n| {
                done += n;
                progress(done, total);
            })?;
            files.push(ModelFile {
                name: f.name.clone(),
                size: f.size,
                sha256,
            });
        }
        let source = ModelSource::Imported {
            from: std::path::absolute(src).unwrap_or_else(|_| src.to_path_buf()),
        };
        self.install(&staging, &staged, &name, source, &files)
    }

    /// Removes the model `name` and its manifest: the model is first renamed into staging (so
    /// it disappears at once and whole), then deleted.
    pub fn remove(&self, name: &str) -> Result<(), IndexError> {
        let path = self.root.join(name);
        if !is_model_name(name) || std::fs::symlink_metadata(&path).is_err() {
            return Err(IndexError::NotFound(name.to_string()));
        }
        let staging = self.stage()?;
        std::fs::rename(&path, staging.path().join(name))
            .map_err(|e| write_error(&self.root, name, &path, e))?;
        let _ = std::fs::remove_file(self.manifest_path(name));
        Ok(())
    }
}

/// Copies `from` into `out` in 1 MiB blocks, hashing as it goes; syncs the file at the end so a
/// full disk shows here and not after the rename.
#[allow(clippy::too_many_arguments)]
fn copy_hashing(
    from: &Path,
    mut out: Box<dyn Write>,
    to: &Path,
    root: &Path,
    what: &str,
    cancel: &AtomicBool,
    progress: &mut dyn FnMut(u64),
) -> Result<String, IndexError> {
    let mut input = std::fs::File::open(from).map_err(|err| IndexError::Io {
        path: from.to_path_buf(),
        err,
    })?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Err(IndexError::Cancelled);
        }
        let n = input.read(&mut buf).map_err(|err| IndexError::Io {
            path: from.to_path_buf(),
            err,
        })?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
        out.write_all(&buf[..n])
            .map_err(|e| write_error(root, what, to, e))?;
        progress(n as u64);
    }
    out.flush().map_err(|e| write_error(root, what, to, e))?;
    drop(out);
    // Sync through a fresh handle: the injected writer may not be a file.
    if let Ok(f) = std::fs::OpenOptions::new().write(true).open(to) {
        f.sync_all().map_err(|e| write_error(root, what, to, e))?;
    }
    Ok(hex(&h.finalize()))
}

/// Bytes a file really occupies on disk (its length where that is not known).
fn allocated(m: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        (m.blocks() * 512).min(m.len())
    }
    #[cfg(not(unix))]
    {
        m.len()
    }
}

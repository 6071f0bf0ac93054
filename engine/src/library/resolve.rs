//! Finding on this machine the model a reference names ([`Library::find`]), in the order
//! llama.cpp users expect: a path, `default`, a model of the library by name, then for a Hub
//! repo a model the library pulled from it, then the Hugging Face cache. What is not here is
//! [`Found::Missing`]: the app's Hub client downloads it into the library (`crate` has no
//! network); [`resolve_model`] (no network) reports it as not downloaded.

use std::path::PathBuf;

use crate::library::ensure_default_model;
use crate::library::entry::{IndexError, ModelFormat, ModelSource};
use crate::library::index::Library;
use crate::library::model_ref::{HubRef, ModelRef, RefError, pick_gguf};

/// What a reference names here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Found {
    /// The model to load: a file, a folder, or a file in the Hugging Face cache (in place).
    Path(PathBuf),
    /// A Hub repo (and quant) neither the library nor the Hugging Face cache holds.
    Missing(HubRef),
}

impl Library {
    /// The model of the library pulled from `r`'s repo whose files `r`'s quant picks (as
    /// [`pick_gguf`] picks among a repo's files), `None` when there is none.
    pub fn find_pulled(&self, r: &HubRef) -> Result<Option<PathBuf>, IndexError> {
        let (models, _) = self.list()?;
        for m in models {
            let from_repo = matches!(&m.source, ModelSource::Hub { repo, .. }
                if repo.eq_ignore_ascii_case(&r.repo));
            if !from_repo || m.format != ModelFormat::Gguf {
                continue;
            }
            let names: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
            if pick_gguf(r, &names).is_ok() {
                return Ok(Some(m.path));
            }
        }
        Ok(None)
    }

    /// Where the model `m` names is (see the module doc); the default model is fetched when
    /// missing. A Hub repo is looked for in the library, then in the Hugging Face cache the
    /// library was opened with ([`Library::with_hf_cache`]).
    pub fn find(&self, m: &ModelRef, progress: &mut dyn FnMut(&str)) -> Result<Found, IndexError> {
        match m {
            ModelRef::Path(p) => Ok(Found::Path(p.clone())),
            ModelRef::Default => Ok(Found::Path(ensure_default_model(progress)?)),
            ModelRef::Name(n) => Ok(Found::Path(self.entry(n)?.path)),
            ModelRef::Hub(r) => {
                if let Some(p) = self.find_pulled(r)? {
                    progress(&format!("{r}: in the library, {}", p.display()));
                    return Ok(Found::Path(p));
                }
                if let Some(p) = self.hf_cache().map(|c| c.find(r)).transpose()?.flatten() {
                    progress(&format!(
                        "{r}: in the Hugging Face cache, loaded in place from {}",
                        p.display()
                    ));
                    return Ok(Found::Path(p));
                }
                Ok(Found::Missing(r.clone()))
            }
        }
    }
}

/// The model `spec` names ([`ModelRef::classify`], then [`Library::find`] in the library at
/// `$TPSLAB_HOME` with the Hugging Face cache the environment names). A Hub repo not on this
/// machine is an error here: this crate has no network; the app downloads it.
pub fn resolve_model(spec: &str, progress: &mut dyn FnMut(&str)) -> Result<PathBuf, IndexError> {
    let lib = Library::open().ok();
    let m = ModelRef::classify(spec, lib.as_ref().map(|l| l.root()))
        .map_err(crate::library::LibraryError::from)?;
    let lib = match (&m, lib) {
        (ModelRef::Path(p), _) => return Ok(p.clone()),
        (_, Some(lib)) => lib,
        (_, None) => Library::open()?,
    };
    match lib.find(&m, progress)? {
        Found::Path(p) => Ok(p),
        Found::Missing(r) => {
            Err(crate::library::LibraryError::from(RefError::NotDownloaded(r)).into())
        }
    }
}

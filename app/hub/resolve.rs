//! [`resolve_model`]: the model a reference names, downloaded only when it is nowhere on this
//! machine. The engine finds what is here ([`Library::find`]: a path, `default`, a library
//! name, a model pulled from the repo, the Hugging Face cache in place); a Hub repo found in
//! none of those is pulled into the library as `tpslab pull` pulls it (the quant picked as
//! llama.cpp's `-hf` picks it, [`Choice::Tagged`]), and loaded from there.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;

use tpslab_engine::library::index::Library;
use tpslab_engine::library::model_ref::{HubRef, ModelRef};
use tpslab_engine::library::resolve::Found;

use super::config::{HubConfig, PullProgress};
use super::listing::Choice;
use super::pull::{PullRequest, pull};

/// The model `spec` names (a path, `default`, a library name, `owner/name[:QUANT]`,
/// `hf.co/owner/name[:QUANT]`), or with `hf_repo` (`-hf`) that Hub repo whatever `spec` says.
/// A repo neither the library nor the Hugging Face cache holds is downloaded from `cfg`'s
/// endpoint into the library first. `progress` gets one line per step.
pub fn resolve_model(
    spec: &str,
    hf_repo: Option<&str>,
    cfg: &HubConfig,
    progress: &mut dyn FnMut(&str),
) -> anyhow::Result<PathBuf> {
    let lib = Library::open()?;
    let m = match hf_repo {
        Some(r) => ModelRef::Hub(HubRef::parse(r)?),
        None => ModelRef::classify(spec, Some(lib.root()))?,
    };
    let r = match lib.find(&m, progress)? {
        Found::Path(p) => return Ok(p),
        Found::Missing(r) => r,
    };
    progress(&format!(
        "{r}: not in the library or the Hugging Face cache; downloading from {}",
        cfg.endpoint
    ));
    let req = PullRequest {
        repo: r.repo.clone(),
        revision: "main".into(),
        choice: Choice::Tagged(r.quant.clone()),
    };
    let never = AtomicBool::new(false);
    let mut last = (String::new(), "");
    let entry = pull(cfg, &lib, &req, &never, &mut |p: &PullProgress| {
        if (p.file.as_str(), p.stage) != (last.0.as_str(), last.1) {
            last = (p.file.clone(), p.stage);
            progress(&format!("{} {}", p.stage, p.file));
        }
    })?;
    progress(&format!(
        "{r}: pulled into the library as {}",
        entry.path.display()
    ));
    Ok(entry.path)
}

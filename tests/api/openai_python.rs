//! The server as the official OpenAI Python client sees it (tests/python/openai_check.py):
//! chat whole and streamed, usage, log-probabilities, `n`, structured output, completions'
//! echo, logprobs and logit_bias, and the 400s. The client, pinned in
//! tests/python/requirements.txt, is installed into a virtualenv under ~/.cache/tpslab the
//! first time (PyPI is one of the registries this machine reaches); without Python or PyPI the
//! test fails saying so, it is never skipped.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::http_client;
use http_client::*;

pub(crate) fn run(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!("{cmd:?} failed ({}):\n{text}", out.status))
    }
}

/// The virtualenv holding exactly the pinned requirements (its name carries their digest, so a
/// change of pins makes a new one).
pub(crate) fn venv(requirements: &Path) -> PathBuf {
    let pins = std::fs::read(requirements).expect("tests/python/requirements.txt");
    let digest = pins.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    let dir = home.join(format!(".cache/tpslab/venv-openai-{digest:016x}"));
    let python = dir.join("bin/python");
    if python.exists() {
        return python;
    }
    let tmp = dir.with_extension("partial");
    let _ = std::fs::remove_dir_all(&tmp);
    let step = |r: Result<String, String>| {
        r.unwrap_or_else(|e| panic!("installing the OpenAI client: {e}"))
    };
    step(run(Command::new("python3").args(["-m", "venv"]).arg(&tmp)));
    step(run(Command::new(tmp.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", "-r"])
        .arg(requirements)));
    std::fs::rename(&tmp, &dir).expect("move the virtualenv into place");
    python
}

#[test]
fn the_official_openai_client_gets_what_it_expects() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = venv(&root.join("tests/python/requirements.txt"));
    let addr = shared();
    let out = run(Command::new(python)
        .arg(root.join("tests/python/openai_check.py"))
        .arg(format!("http://{addr}/v1"))
        .arg(serve_model_id()))
    .unwrap_or_else(|e| panic!("{e}"));
    eprintln!("{out}");
    assert!(out.contains("all checks passed"), "{out}");
}

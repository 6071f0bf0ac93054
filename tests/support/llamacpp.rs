//! llama.cpp's own test fixtures, for the tests that hold TPS Lab against llama.cpp: the
//! tokenizer vocabularies (`models/ggml-vocab-*.gguf` with their `.inp` / `.out` cases) and the
//! real chat templates (`models/templates/*.jinja`) of the llama.cpp tree vendored in the PyPI
//! sdist of `llama-cpp-python` 0.3.36 (the build `../shared/reference/llama-cpp.md` names).
//!
//! The sdist (77 MB) is fetched once from the package index, checked against its pinned SHA-256,
//! and only its `models/` folder is kept, in `$TPSLAB_FIXTURES` (default
//! `~/.cache/tpslab/llama-cpp-0.3.36`). Nothing of llama.cpp is built or run: the tests need
//! only these data files. Concurrent test binaries each fetch into a private folder and rename
//! it into place; whichever lands first wins.
#![allow(dead_code)] // each test binary uses the fixtures it needs

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The sdist file, its index page and its pinned checksum.
const SDIST: &str = "llama_cpp_python-0.3.36.tar.gz";
const INDEX: &str = "https://pypi.org/simple/llama-cpp-python/";
const SHA256: &str = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e";
/// Where the llama.cpp tree sits inside the sdist.
const TREE: &str = "llama_cpp_python-0.3.36/vendor/llama.cpp/";

/// Finds the sdist's link on the index page, downloads it, checks it and extracts `models/`.
// `r##`: the script itself contains `"#`.
const FETCH: &str = r##"
import hashlib, re, sys, tarfile, urllib.request
index, name, sha, tree, dest = sys.argv[1:6]
page = urllib.request.urlopen(index, timeout=60).read().decode()
m = re.search(r'href="([^"#]*' + re.escape(name) + r')[#"]', page)
if not m:
    sys.exit(f"{name} is not on {index}")
path = dest + "/" + name
h = hashlib.sha256()
with urllib.request.urlopen(m.group(1), timeout=120) as r, open(path, "wb") as f:
    while chunk := r.read(1 << 20):
        h.update(chunk)
        f.write(chunk)
if h.hexdigest() != sha:
    sys.exit(f"{name}: sha256 {h.hexdigest()}, expected {sha}")
with tarfile.open(path) as t:
    for member in t.getmembers():
        if member.isfile() and member.name.startswith(tree + "models/"):
            member.name = member.name[len(tree):]
            t.extract(member, dest, filter="data")
"##;

/// The `models/` folder of the pinned llama.cpp tree, fetched on first use.
pub fn models_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| fetch().unwrap_or_else(|e| panic!("llama.cpp fixtures: {e}")))
        .clone()
}

/// A vocabulary-only GGUF of llama.cpp's tokenizer tests (`"llama-spm"` ->
/// `models/ggml-vocab-llama-spm.gguf`).
pub fn vocab(name: &str) -> PathBuf {
    models_dir().join(format!("ggml-vocab-{name}.gguf"))
}

/// The cases of a vocabulary's `.inp` file and the ids its `.out` file expects for each
/// (`__ggml_vocab_test__` separates the cases; one line of space-separated ids per case).
pub fn vocab_cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let base = vocab(name);
    let read = |ext: &str| {
        let p = base.with_extension(format!("gguf.{ext}"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    const SEP: &str = "\n__ggml_vocab_test__\n";
    let inputs: Vec<String> = read("inp").split(SEP).map(str::to_string).collect();
    let outputs = read("out");
    let mut outputs: Vec<Vec<u32>> = outputs
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|t| t.parse().expect("token id in .out"))
                .collect()
        })
        .collect();
    // The .inp file ends with a separator after its last case; llama.cpp's test drops the empty
    // tail the same way.
    let inputs: Vec<String> = match inputs.last() {
        Some(l) if l.trim_end_matches('\n').is_empty() => inputs[..inputs.len() - 1].to_vec(),
        _ => inputs,
    };
    outputs.truncate(inputs.len());
    assert_eq!(
        inputs.len(),
        outputs.len(),
        "{name}: .inp and .out disagree"
    );
    inputs.into_iter().zip(outputs).collect()
}

/// A real chat template of llama.cpp's tree (`"google-gemma-2-2b-it"` ->
/// `models/templates/google-gemma-2-2b-it.jinja`).
pub fn template(name: &str) -> String {
    let p = models_dir().join("templates").join(format!("{name}.jinja"));
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn cache_root() -> PathBuf {
    if let Some(d) = std::env::var_os("TPSLAB_FIXTURES") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map_or_else(std::env::temp_dir, PathBuf::from);
    home.join(".cache/tpslab/llama-cpp-0.3.36")
}

fn fetch() -> Result<PathBuf, String> {
    let root = cache_root();
    let models = root.join("models");
    if models.join("templates").is_dir() {
        return Ok(models);
    }
    std::fs::create_dir_all(&root).map_err(|e| format!("{}: {e}", root.display()))?;
    let tmp = root.join(format!(".fetch-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
    let result = run_fetch(&tmp).and_then(|()| {
        match std::fs::rename(tmp.join("models"), &models) {
            Ok(()) => Ok(()),
            // Another test binary landed it first.
            Err(_) if models.join("templates").is_dir() => Ok(()),
            Err(e) => Err(format!("{}: {e}", models.display())),
        }
    });
    let _ = std::fs::remove_dir_all(&tmp);
    result.map(|()| models)
}

fn run_fetch(tmp: &Path) -> Result<(), String> {
    eprintln!("fetching llama.cpp's test fixtures ({SDIST}, once) ...");
    let out = Command::new("python3")
        .args(["-c", FETCH, INDEX, SDIST, SHA256, TREE])
        .arg(tmp)
        .output()
        .map_err(|e| format!("python3: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(String::from_utf8_lossy(&out.stderr).trim().to_string())
}

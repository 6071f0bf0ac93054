//! What the Hub download tests share (tests/library/hub.rs, tests/library/hub_hostile.rs): the served files
//! (the default model's GGUF, a tiny safetensors set), a local Hub serving them, a temporary
//! folder, a pull that records its progress, and the checks that nothing that looks like a
//! model is left in a library and that a canary tree around it is untouched.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tpslab::hub::{self, Choice, HubConfig, HubError, PullProgress, PullRequest};

// The binary declares `temp_dir` (engine/tests/support/temp_dir.rs) beside this module.
pub use crate::temp_dir::TempDir;
use tpslab_engine::library::index::{Library, ModelEntry};

use crate::hub_server::{File, HubServer, RepoData};

pub const CHUNK: usize = 8 << 20;
pub const GGUF_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

pub fn default_model() -> PathBuf {
    tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("default model")
}

/// The default model's bytes, read once for every test.
pub fn gguf_bytes() -> Arc<Vec<u8>> {
    static B: OnceLock<Arc<Vec<u8>>> = OnceLock::new();
    B.get_or_init(|| Arc::new(std::fs::read(default_model()).expect("read default model")))
        .clone()
}

/// The default model as a served LFS file (hashed once).
pub fn gguf_file() -> File {
    static F: OnceLock<File> = OnceLock::new();
    F.get_or_init(|| File::new(GGUF_NAME, gguf_bytes(), true))
        .clone()
}

/// A tiny safetensors file: one F32 tensor of shape [2, 4].
pub fn tiny_safetensors() -> Vec<u8> {
    let header =
        br#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]}}"#;
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header);
    v.extend((0..8).flat_map(|i| (i as f32).to_le_bytes()));
    v
}

pub fn st_files() -> Vec<File> {
    let config = br#"{"architectures":["LlamaForCausalLM"],"num_hidden_layers":1,"hidden_size":4,"max_position_embeddings":128,"torch_dtype":"float32"}"#;
    vec![
        File::new("config.json", Arc::new(config.to_vec()), false),
        File::new(
            "tokenizer.json",
            Arc::new(b"{\"model\":{}}".to_vec()),
            false,
        ),
        File::new("tokenizer_config.json", Arc::new(b"{}".to_vec()), false),
        File::new("model.safetensors", Arc::new(tiny_safetensors()), true),
        File::new("README.md", Arc::new(b"# tiny".to_vec()), false),
    ]
}

/// A Hub with the default model's GGUF (`tpslab/smollm2-gguf`) and the tiny safetensors set
/// (`tpslab/tiny-st`).
pub fn server() -> HubServer {
    let s = HubServer::start();
    s.add(
        "tpslab/smollm2-gguf",
        RepoData {
            files: vec![
                gguf_file(),
                File::new("README.md", Arc::new(b"# model".to_vec()), false),
            ],
            ..RepoData::default()
        },
    );
    s.add(
        "tpslab/tiny-st",
        RepoData {
            files: st_files(),
            ..RepoData::default()
        },
    );
    s
}

/// The config for `s`, with timeouts short enough that a stalled test ends in seconds.
pub fn cfg(s: &HubServer) -> HubConfig {
    HubConfig {
        endpoint: s.url.clone(),
        token: None,
        chunk_size: CHUNK,
        connect_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(5),
        stall_timeout: Duration::from_secs(2),
    }
}

pub fn req(repo: &str) -> PullRequest {
    PullRequest {
        repo: repo.into(),
        revision: "main".into(),
        choice: Choice::Auto,
    }
}

pub fn pull(
    c: &HubConfig,
    lib: &Library,
    r: &PullRequest,
    cancel: &AtomicBool,
) -> (Result<ModelEntry, HubError>, Vec<PullProgress>) {
    let mut seen = Vec::new();
    let out = hub::pull(c, lib, r, cancel, &mut |p| seen.push(p.clone()));
    (out, seen)
}

/// Every file (and link) under `dir`, not following links.
pub fn walkdir(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walkdir(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Nothing that looks like a model is in the library: no listed model, no file outside the hub
/// cache (which keeps partial files and whole verified ones for the next pull), no GGUF file
/// anywhere, and no staging left.
pub fn assert_no_model(lib: &Library) {
    let (models, bad) = lib.list().expect("list");
    assert!(models.is_empty() && bad.is_empty(), "{models:?} {bad:?}");
    for f in walkdir(lib.root()) {
        let rel = f.strip_prefix(lib.root()).expect("inside");
        assert!(
            rel.starts_with(".hub-cache"),
            "{} left in the library",
            rel.display()
        );
        assert!(
            !f.to_string_lossy().to_lowercase().ends_with(".gguf"),
            "{}",
            f.display()
        );
    }
}

/// A fingerprint of the tree at `dir` without following links: every path with its kind, and
/// the sha256 of each file's bytes or each link's target. `skip` (a folder inside) is left out.
pub fn fingerprint(dir: &Path, skip: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let mut entries: Vec<PathBuf> = std::fs::read_dir(&d)
            .expect("read canary dir")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for p in entries {
            if p == skip {
                continue;
            }
            let rel = p.strip_prefix(dir).expect("inside").display().to_string();
            let md = std::fs::symlink_metadata(&p).expect("lstat");
            if md.file_type().is_symlink() {
                let t = std::fs::read_link(&p).expect("readlink");
                out.push(format!("link {rel} -> {}", t.display()));
            } else if md.is_dir() {
                out.push(format!("dir {rel}"));
                stack.push(p);
            } else {
                let bytes = std::fs::read(&p).expect("read canary file");
                out.push(format!("file {rel} {:x}", Sha256::digest(&bytes)));
            }
        }
    }
    out.sort();
    out
}

/// A library at `<base>/models` with a canary tree around it: sibling folders and files, files
/// in the library's parent, and the targets hostile names point at (an existing file and a
/// folder with a file in it). [`Canary::assert_untouched`] checks the tree is as it was.
pub struct Canary {
    pub base: TempDir,
    pub lib: Library,
    before: Vec<String>,
}

impl Canary {
    pub fn new(tag: &str) -> Self {
        let base = TempDir::new(tag);
        let b = &base.0;
        let write = |rel: &str, text: &str| {
            let p = b.join(rel);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write canary");
        };
        write("parent-file.txt", "the library's parent holds this");
        write("sibling/notes.txt", "a sibling folder's file");
        write("sibling/deep/model.gguf", "not a model, the user's own");
        write("victim/victim.gguf", "the file an absolute name points at");
        write("victim/dir/keep.txt", "a folder an absolute sha points at");
        write("blobs/sha256-x", "a folder named like the cache's");
        #[cfg(unix)]
        std::os::unix::fs::symlink(b.join("victim"), b.join("link-to-victim")).expect("symlink");
        let lib = Library::at(b.join("models"));
        let before = fingerprint(b, &b.join("models"));
        Self { base, lib, before }
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.base.0.join(rel)
    }

    /// Nothing outside the library was created, changed, moved or deleted.
    pub fn assert_untouched(&self, what: &str) {
        let after = fingerprint(&self.base.0, &self.base.0.join("models"));
        assert_eq!(
            self.before, after,
            "{what}: the tree around the library changed"
        );
    }
}

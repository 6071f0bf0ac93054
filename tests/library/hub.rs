//! Downloading from the Hub into the model library, over real HTTP against a Hub-shaped server on
//! 127.0.0.1 (tests/support/hub_server.rs) serving the default model's GGUF and a small
//! safetensors set: progress, resume after a cut connection, checksum refusal, cancel, a 404
//! repo, a gated repo, a wrong endpoint; and `tpslab models` / `tpslab pull` through the binary.

use crate::hub_fixtures;
use crate::hub_server;
use crate::split;
use crate::tiny_model;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use hub_fixtures::{
    CHUNK, GGUF_NAME, TempDir, assert_no_model, cfg, default_model, gguf_bytes, gguf_file, pull,
    req, server, st_files, walkdir,
};
use hub_server::{File, HubServer, RepoData};
use tpslab::hub::{self, Choice, HubConfig, HubError, PullProgress, PullRequest};
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::library::index::{Library, ModelFormat, ModelSource};

#[test]
fn pulls_a_gguf_with_progress_and_registers_it() {
    let s = server();
    let home = TempDir::new("gguf");
    let lib = Library::at(home.0.join("models"));
    let (m, progress) = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/smollm2-gguf"),
        &AtomicBool::new(false),
    );
    let m = m.expect("pull");
    let want = gguf_file().sha256();
    assert_eq!(m.sha256, want);
    assert_eq!(m.name, GGUF_NAME);
    assert_eq!(m.format, ModelFormat::Gguf);
    assert_eq!(
        tpslab_engine::library::sha256_file(&m.path).expect("hash"),
        want,
        "the file on disk is the served one"
    );
    assert_eq!(
        (m.arch.as_str(), m.precision.to_string().as_str()),
        ("llama", "Q4_1")
    );
    assert!(m.params > 100_000_000, "{}", m.params);
    assert_eq!(m.context_len, Some(8192));
    assert!(
        matches!(&m.source, ModelSource::Hub { repo, commit: Some(c), .. }
        if repo == "tpslab/smollm2-gguf" && c == hub_server::COMMIT)
    );
    GgufFile::open(&m.path).expect("the pulled model opens");
    // Progress: bytes never go back, reach the total, and name the file.
    let downloading: Vec<&PullProgress> = progress
        .iter()
        .filter(|p| p.stage == "downloading")
        .collect();
    assert!(!downloading.is_empty());
    assert!(downloading.windows(2).all(|w| w[0].done <= w[1].done));
    let total = gguf_bytes().len() as u64;
    assert!(
        progress
            .iter()
            .all(|p| p.total == total || p.stage == "listing")
    );
    assert_eq!(progress.last().expect("last").done, total);
    assert!(
        downloading
            .iter()
            .all(|p| p.file == GGUF_NAME && p.n_files == 1)
    );
    // The library lists it with its manifest, and the README was not downloaded.
    let (models, _) = lib.list().expect("list");
    assert_eq!(models.len(), 1);
    assert_eq!(models[0], m);
    assert!(s.seen().iter().all(|r| !r.path.ends_with("README.md")));
    // Downloads are pinned to the listed commit, and nothing is left behind: no cache, no
    // staging folder.
    assert!(
        s.seen()
            .iter()
            .filter(|r| r.path.contains("/resolve/"))
            .all(|r| r
                .path
                .contains(&format!("/resolve/{}/", hub_server::COMMIT))),
        "{:?}",
        s.seen()
    );
    assert!(!lib.hub_cache().exists() && !lib.root().join(".staging").exists());
    // Pulling it again is refused by name, before any download.
    let (again, _) = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/smollm2-gguf"),
        &AtomicBool::new(false),
    );
    let e = again.expect_err("already there").to_string();
    assert!(e.contains("already has a model named"), "{e}");
}

#[test]
fn follows_the_hubs_redirect_to_another_host_for_lfs_files() {
    let s = server();
    s.add(
        "tpslab/via-cdn",
        RepoData {
            files: st_files(),
            redirect: true,
            ..RepoData::default()
        },
    );
    let home = TempDir::new("cdn");
    let lib = Library::at(home.0.join("models"));
    let (m, _) = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/via-cdn"),
        &AtomicBool::new(false),
    );
    let m = m.expect("pull through the redirect");
    let weights = st_files()
        .into_iter()
        .find(|f| f.name == "model.safetensors")
        .expect("weights");
    let got = m
        .files
        .iter()
        .find(|f| f.name == weights.name)
        .expect("file");
    assert_eq!(got.sha256, weights.sha256());
    let seen = s.seen();
    assert!(
        seen.iter()
            .any(|q| q.path == "/cdn/tpslab/via-cdn/model.safetensors" && q.range.is_some()),
        "{seen:?}"
    );
}

#[test]
fn a_redirect_to_nowhere_is_an_error_not_a_panic() {
    let s = server();
    s.add(
        "tpslab/broken",
        RepoData {
            files: st_files(),
            redirect_nowhere: true,
            ..RepoData::default()
        },
    );
    let home = TempDir::new("nowhere");
    let lib = Library::at(home.0.join("models"));
    let e = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/broken"),
        &AtomicBool::new(false),
    )
    .0
    .expect_err("broken server");
    assert!(
        e.to_string().starts_with(&format!(
            "{} sent an answer that is not the Hub's API",
            s.url
        )),
        "{e}"
    );
    assert_no_model(&lib);
}

#[test]
fn resumes_a_cut_download_with_a_range_request() {
    let s = server();
    let home = TempDir::new("resume");
    let lib = Library::at(home.0.join("models"));
    // Cut the connection in the third chunk: two whole chunks are on disk when it breaks.
    let at = 2 * CHUNK as u64;
    *s.faults.cut.lock().expect("cut") = Some((GGUF_NAME.into(), at));
    let r = req("tpslab/smollm2-gguf");
    let (first, _) = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false));
    let e = first.expect_err("the cut breaks the first pull");
    assert!(matches!(e, HubError::Interrupted { .. }), "{e}");
    assert!(
        e.to_string().contains("run the same pull again to resume"),
        "{e}"
    );
    assert!(s.faults.cut_done.load(Ordering::SeqCst));
    assert_no_model(&lib);
    let before = s.seen().len();
    let (second, progress) = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false));
    let m = second.expect("the second pull completes");
    assert_eq!(m.sha256, gguf_file().sha256());
    let body_gets: Vec<_> = s.seen()[before..]
        .iter()
        .filter(|q| q.method == "GET" && q.path.ends_with(GGUF_NAME))
        .filter_map(|q| q.range)
        .filter(|(a, b)| *b != Some(*a))
        .collect();
    // The cut came half-way through the third chunk: the second pull asks from the bytes that
    // arrived, inside that chunk.
    let first_get = body_gets.first().map(|r| r.0);
    assert!(
        first_get.is_some_and(|a| a >= at && a < at + CHUNK as u64),
        "the second pull starts where the first stopped: {body_gets:?}"
    );
    assert!(body_gets.iter().all(|r| r.0 >= at), "{body_gets:?}");
    // Progress counts the resumed bytes as done from its first count on.
    let first_dl = progress
        .iter()
        .find(|p| p.stage == "downloading" && p.done > 0)
        .expect("progress");
    assert!(first_dl.done >= at, "{first_dl:?}");
    let total = gguf_bytes().len() as u64;
    assert!(
        s.body_bytes.load(Ordering::Relaxed) < total + total / 4,
        "the file was not downloaded twice"
    );
}

#[test]
fn a_cut_sharded_pull_keeps_the_whole_shards_for_the_next_pull() {
    let s = server();
    let mut files = st_files();
    files.retain(|f| f.name != "model.safetensors");
    // Valid shards of 3 MiB: one F32 tensor each.
    let shard = |i: u8| {
        let n = (3 << 20) / 4;
        let header = format!(
            r#"{{"w{i}":{{"dtype":"F32","shape":[{n}],"data_offsets":[0,{}]}}}}"#,
            n * 4
        );
        let mut v = (header.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(header.as_bytes());
        v.resize(v.len() + n * 4, i);
        Arc::new(v)
    };
    files.push(File::new(
        "model-00001-of-00002.safetensors",
        shard(1),
        true,
    ));
    files.push(File::new(
        "model-00002-of-00002.safetensors",
        shard(2),
        true,
    ));
    s.add(
        "tpslab/sharded",
        RepoData {
            files,
            ..RepoData::default()
        },
    );
    // The second shard's transfer breaks; the first is whole by then.
    *s.faults.cut.lock().expect("cut") = Some(("model-00002-of-00002.safetensors".into(), 0));
    let home = TempDir::new("shards");
    let lib = Library::at(home.0.join("models"));
    let r = req("tpslab/sharded");
    let e = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
        .0
        .expect_err("cut");
    assert!(matches!(e, HubError::Interrupted { .. }), "{e}");
    assert_no_model(&lib);
    let before = s.seen().len();
    let m = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
        .0
        .expect("second pull");
    let body_gets: Vec<String> = s.seen()[before..]
        .iter()
        .filter(|q| q.method == "GET" && q.range.is_some_and(|(a, b)| b != Some(a)))
        .map(|q| q.path.rsplit('/').next().unwrap_or("").to_string())
        .collect();
    assert!(
        !body_gets
            .iter()
            .any(|p| p == "model-00001-of-00002.safetensors"),
        "shard 1 was downloaded again: {body_gets:?}"
    );
    assert!(
        body_gets
            .iter()
            .any(|p| p == "model-00002-of-00002.safetensors")
    );
    assert_eq!(m.files.len(), 5, "{:?}", m.files);
    assert_eq!(m.params, 2 * (3 << 20) / 4);
}

#[test]
fn a_corrupted_file_is_refused_by_its_checksum() {
    let s = server();
    s.add(
        "tpslab/corrupt",
        RepoData {
            files: vec![gguf_file()],
            corrupt: Some(GGUF_NAME.into()),
            ..RepoData::default()
        },
    );
    let home = TempDir::new("corrupt");
    let lib = Library::at(home.0.join("models"));
    let (r, _) = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/corrupt"),
        &AtomicBool::new(false),
    );
    let e = r.expect_err("checksum");
    let msg = e.to_string();
    assert!(matches!(e, HubError::Checksum { .. }), "{msg}");
    let want = gguf_file().sha256();
    assert!(
        msg.contains("failed its checksum") && msg.contains(&want),
        "{msg}"
    );
    assert_no_model(&lib);
    // The bad bytes were discarded, not kept to resume from.
    let cache = lib.hub_cache();
    let big: Vec<_> = walkdir(&cache)
        .into_iter()
        .filter(|p| std::fs::metadata(p).is_ok_and(|m| m.len() > 1 << 20))
        .collect();
    assert!(big.is_empty(), "{big:?}");
}

#[test]
fn a_cancelled_download_leaves_nothing_that_loads_and_resumes_later() {
    let s = server();
    s.faults.slow_us.store(2_000, Ordering::Relaxed);
    let home = TempDir::new("cancel");
    let lib = Library::at(home.0.join("models"));
    let cancel = AtomicBool::new(false);
    let r = req("tpslab/smollm2-gguf");
    let out = hub::pull(&cfg(&s), &lib, &r, &cancel, &mut |p| {
        if p.done > 12 << 20 {
            cancel.store(true, Ordering::Relaxed);
        }
    });
    let e = out.expect_err("cancelled");
    assert!(matches!(e, HubError::Cancelled), "{e}");
    assert!(e.to_string().contains("cancelled"), "{e}");
    let total = gguf_bytes().len() as u64;
    assert!(
        s.body_bytes.load(Ordering::Relaxed) < total,
        "stopped before the end"
    );
    assert_no_model(&lib);
    let partial = lib.partial_downloads();
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert!(partial[0].1 >= CHUNK as u64, "{partial:?}");
    // Pulled again, it resumes from the whole chunks the cancelled run left and completes.
    s.faults.slow_us.store(0, Ordering::Relaxed);
    let before = s.seen().len();
    let (m, _) = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false));
    let m = m.expect("pull after cancel");
    GgufFile::open(&m.path).expect("opens");
    let resumed_at = s.seen()[before..]
        .iter()
        .filter(|q| q.method == "GET" && q.path.ends_with(GGUF_NAME))
        .filter_map(|q| q.range)
        .find(|(a, b)| *b != Some(*a))
        .map(|r| r.0);
    assert!(
        resumed_at.is_some_and(|a| a >= CHUNK as u64),
        "{resumed_at:?}"
    );
}

/// A tmpfs of `size` at a fresh folder, unmounted when dropped; None where mounting is not
/// allowed (the library tests cover the full-disk path through an injected writer there).
struct Tmpfs(TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = TempDir::new("tmpfs");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir.0)
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then_some(Self(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0.0).status();
    }
}

#[test]
fn a_download_into_a_full_library_gives_a_clear_error_and_changes_nothing() {
    // A real full disk: this machine kind (and CI on it) runs as root, so the mount works; a
    // machine where it cannot fails here rather than passing without the check.
    let fs = Tmpfs::mount("8m").expect("mount an 8 MiB tmpfs (needs root)");
    let s = server();
    let lib = Library::at(fs.0.0.join("models"));
    let first = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/tiny-st"),
        &AtomicBool::new(false),
    );
    let first = first.0.expect("a small model fits");
    // The 98 MB GGUF does not fit in what is left of 8 MiB.
    let (r, _) = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/smollm2-gguf"),
        &AtomicBool::new(false),
    );
    let e = r.expect_err("ENOSPC");
    let msg = e.to_string();
    assert!(
        msg.starts_with(&format!(
            "not enough space for {GGUF_NAME} in the library folder"
        )),
        "{msg}"
    );
    assert_eq!(lib.list().expect("list").0, vec![first]);
}

#[test]
fn pulls_a_safetensors_set_and_lists_its_shape() {
    let s = server();
    let home = TempDir::new("st");
    let lib = Library::at(home.0.join("models"));
    let (m, progress) = pull(
        &cfg(&s),
        &lib,
        &req("tpslab/tiny-st"),
        &AtomicBool::new(false),
    );
    let m = m.expect("pull");
    assert_eq!(m.name, "tiny-st");
    assert_eq!(m.format, ModelFormat::Safetensors);
    assert_eq!(
        (m.arch.as_str(), m.params, m.precision.to_string().as_str()),
        ("LlamaForCausalLM", 8, "F32")
    );
    assert_eq!(m.context_len, Some(128));
    let mut names: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "config.json",
            "model.safetensors",
            "tokenizer.json",
            "tokenizer_config.json"
        ]
    );
    for f in st_files().iter().filter(|f| f.name != "README.md") {
        let got = m.files.iter().find(|g| g.name == f.name).expect("file");
        assert_eq!(got.sha256, f.sha256(), "{}", f.name);
        assert_eq!(std::fs::read(m.path.join(&f.name)).expect("read"), *f.bytes);
    }
    assert_eq!(progress.last().map(|p| p.n_files), Some(4));
}

#[test]
fn clear_errors_for_missing_gated_and_unreachable() {
    let s = server();
    s.add(
        "meta/gated",
        RepoData {
            files: st_files(),
            token: Some("hf_secret".into()),
            ..RepoData::default()
        },
    );
    let home = TempDir::new("errors");
    let lib = Library::at(home.0.join("models"));
    let no = AtomicBool::new(false);
    let c = cfg(&s);

    let e = pull(&c, &lib, &req("nobody/nothing"), &no)
        .0
        .expect_err("404");
    assert_eq!(
        e.to_string(),
        format!(
            "repository nobody/nothing not found at {} (check the name; a private repo needs --token or HF_TOKEN)",
            s.url
        )
    );
    let e = pull(&c, &lib, &req("meta/gated"), &no)
        .0
        .expect_err("gated");
    assert_eq!(
        e.to_string(),
        "meta/gated is a gated repository: accept its terms on its Hub page, then pass --token or set HF_TOKEN"
    );
    let wrong = HubConfig {
        token: Some("hf_wrong".into()),
        ..c.clone()
    };
    let e = pull(&wrong, &lib, &req("meta/gated"), &no)
        .0
        .expect_err("403");
    assert!(
        e.to_string()
            .starts_with("access to meta/gated was refused"),
        "{e}"
    );
    assert_no_model(&lib);
    let right = HubConfig {
        token: Some("hf_secret".into()),
        ..c.clone()
    };
    let m = pull(&right, &lib, &req("meta/gated"), &no)
        .0
        .expect("with the token");
    assert_eq!(m.name, "gated");

    let file = PullRequest {
        choice: Choice::File("nope.gguf".into()),
        ..req("tpslab/smollm2-gguf")
    };
    let e = pull(&c, &lib, &file, &no).0.expect_err("no such file");
    assert_eq!(
        e.to_string(),
        "file nope.gguf not found in tpslab/smollm2-gguf"
    );

    // A port nobody listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let dead = HubConfig {
        endpoint: format!("http://127.0.0.1:{port}"),
        ..c.clone()
    };
    let e = pull(&dead, &lib, &req("tpslab/smollm2-gguf"), &no)
        .0
        .expect_err("refused");
    assert!(
        e.to_string()
            .starts_with(&format!("cannot reach http://127.0.0.1:{port}: ")),
        "{e}"
    );
    let bad = HubConfig {
        endpoint: "ftp://example".into(),
        ..c
    };
    let e = hub::list_files(&bad, "a/b", "main").expect_err("bad endpoint");
    assert_eq!(
        e.to_string(),
        "the endpoint 'ftp://example' is not an http:// or https:// URL"
    );
}

#[test]
fn lists_and_searches_a_repo() {
    let s = server();
    let l = hub::list_files(&cfg(&s), "tpslab/smollm2-gguf", "main").expect("list");
    assert_eq!(l.commit, hub_server::COMMIT);
    let g = l.ggufs();
    assert_eq!(g.len(), 1);
    assert_eq!(g[0].size, gguf_bytes().len() as u64);
    assert_eq!(g[0].sha256.as_deref(), Some(gguf_file().sha256().as_str()));
    let readme = File::new("README.md", Arc::new(b"# model".to_vec()), false);
    assert!(
        l.files.iter().any(|f| f.name == "README.md"
            && f.sha256.is_none()
            && f.blob_id.as_deref() == Some(readme.blob_id().as_str())),
        "{:?}",
        l.files
    );
    // The LFS file's listed blob id is its pointer's: not kept as a check on its bytes.
    assert_eq!(g[0].blob_id, None);
    let hits = hub::search(&cfg(&s), "tiny", 10).expect("search");
    assert_eq!(
        hits.iter().map(|h| h.id.as_str()).collect::<Vec<_>>(),
        ["tpslab/tiny-st"]
    );
}

fn tpslab(home: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(args)
        .env("TPSLAB_HOME", home)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .output()
        .expect("run tpslab")
}

#[test]
fn cli_pull_then_models_lists_it() {
    let s = server();
    let home = TempDir::new("cli");
    let h = &home.0;
    let out = tpslab(h, &["pull", "tpslab/tiny-st", "--endpoint", &s.url]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("pulled tiny-st"));
    let out = tpslab(h, &["models", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let m = &v.as_array().expect("array")[0];
    assert_eq!(m["name"], "tiny-st");
    assert_eq!(m["source"]["kind"], "hub");
    assert_eq!(m["source"]["repo"], "tpslab/tiny-st");
    assert_eq!(m["arch"], "LlamaForCausalLM");
    assert_eq!(m["params"], 8);
    assert_eq!(m["format"], "safetensors");
    let table = tpslab(h, &["models"]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(
        text.lines()
            .any(|l| l.starts_with("tiny-st") && l.contains("hub tpslab/tiny-st")),
        "{text}"
    );

    let out = tpslab(h, &["pull", "nobody/nothing", "--endpoint", &s.url]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: repository nobody/nothing not found at"),
        "{err}"
    );

    let out = tpslab(h, &["models", "rm", "tiny-st"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tpslab(h, &["models", "--json"]);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "[]");

    // Import by path: a (tiny, real) model folder; a broken copy is refused.
    let src = TempDir::new("cli-src");
    let folder = src.0.join("local-st");
    tiny_model::tiny_folder(&folder);
    let out = tpslab(h, &["models", "import", folder.to_str().expect("utf8")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = tpslab(h, &["models", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v[0]["name"], "local-st");
    assert_eq!(v[0]["source"]["kind"], "imported");
    std::fs::write(folder.join("model.safetensors"), b"broken").expect("write");
    let out = tpslab(h, &["models", "import", folder.to_str().expect("utf8")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is not a usable model"), "{err}");
}

/// The default model as llama.cpp's gguf-split lays out three parts (metadata in part 1), in
/// memory: `(file name, bytes)`.
fn split_parts() -> Vec<(String, Vec<u8>)> {
    use tpslab_engine::formats::gguf::Value;
    use tpslab_engine::formats::gguf_split::{KEY_COUNT, KEY_NO, KEY_TENSORS};
    let src = GgufFile::open(default_model()).expect("open");
    let n = src.tensors.len();
    split::split_parts(&src, "smol-q4_1", 3, |i| {
        vec![
            (KEY_NO.into(), Value::U16(i as u16)),
            (KEY_COUNT.into(), Value::U16(3)),
            (KEY_TENSORS.into(), Value::I32(n as i32)),
        ]
    })
}

#[test]
fn pulls_a_split_gguf_as_one_model() {
    let s = HubServer::start();
    let parts: Vec<File> = split_parts()
        .into_iter()
        .map(|(name, bytes)| File::new(&name, Arc::new(bytes), true))
        .collect();
    s.add(
        "tpslab/smollm2-split",
        RepoData {
            files: parts.clone(),
            ..RepoData::default()
        },
    );
    s.add(
        "tpslab/split-missing",
        RepoData {
            files: vec![parts[0].clone(), parts[2].clone()],
            ..RepoData::default()
        },
    );
    let home = TempDir::new("split");
    let lib = Library::at(home.0.join("models"));
    let cancel = AtomicBool::new(false);
    // Auto: the repo holds one split GGUF, so that is the model.
    let (m, progress) = pull(&cfg(&s), &lib, &req("tpslab/smollm2-split"), &cancel);
    let m = m.expect("pull");
    assert_eq!(m.name, "smol-q4_1");
    assert_eq!(m.format, ModelFormat::Gguf);
    assert_eq!(m.files.len(), 3, "{:?}", m.files);
    for (f, p) in m.files.iter().zip(&parts) {
        assert_eq!((&f.name, &f.sha256), (&p.name, &p.sha256()));
    }
    assert_eq!(m.path, lib.root().join("smol-q4_1").join(&parts[0].name));
    assert_eq!(m.precision.to_string(), "Q4_1");
    assert!(progress.iter().any(|p| p.n_files == 3 && p.file_index == 3));
    tpslab_engine::model::LoadedModel::load(&m.path).expect("the pulled split model loads");
    // A first part whose siblings are not all in the repo: refused before any download.
    let r = PullRequest {
        choice: Choice::File(parts[0].name.clone()),
        ..req("tpslab/split-missing")
    };
    let other = Library::at(home.0.join("other"));
    let (e, _) = pull(&cfg(&s), &other, &r, &cancel);
    let e = e.expect_err("a part is missing").to_string();
    assert!(e.contains("smol-q4_1-00002-of-00003.gguf"), "{e}");
    assert_no_model(&other);
}

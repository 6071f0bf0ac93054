//! Model references through the real binary: `serve -hf owner/repo:QUANT` downloads from a Hub
//! on 127.0.0.1 once (the quant picked as llama.cpp picks it) and a second start fetches
//! nothing; a Hugging Face cache laid out as `huggingface_hub` lays it out (refs, snapshots,
//! links into blobs) at `HF_HUB_CACHE`, `HF_HOME/hub` or `~/.cache/huggingface/hub` is found by
//! name, listed beside the library, and run in place, nothing copied or written; a hostile cache
//! and hostile references are refused by name before anything is fetched.

use crate::http_client;
use crate::hub_fixtures;
use crate::hub_server;
use crate::tiny_model;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;

use http_client::{ServeProcess, loopback, request};
use hub_fixtures::{TempDir, fingerprint, walkdir};
use hub_server::{COMMIT, File, HubServer, RepoData};
use serde_json::json;

/// `tpslab ARGS` with only the environment given (the Hub, the cache and the library where
/// the test says, nothing from the user's own).
fn tpslab(args: &[&str], env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_tpslab"));
    cmd.args(args);
    for k in [
        "HF_HUB_CACHE",
        "HF_HOME",
        "HF_TOKEN",
        "HF_ENDPOINT",
        "TPSLAB_HOME",
    ] {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run tpslab")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A Hub whose `tpslab/tiny-GGUF` holds the tiny model as its Q4_K_M beside a Q8_0 and a
/// projector that must not be fetched.
fn hub_with_tiny() -> HubServer {
    let s = HubServer::start();
    let junk = |n: &str| File::new(n, Arc::new(b"not this one".to_vec()), true);
    s.add(
        "tpslab/tiny-GGUF",
        RepoData {
            files: vec![
                junk("mmproj-tiny-Q4_K_M.gguf"),
                junk("tiny-Q8_0.gguf"),
                File::new(
                    "tiny-Q4_K_M.gguf",
                    Arc::new(tiny_model::tiny_llama(&[])),
                    true,
                ),
                File::new("README.md", Arc::new(b"# tiny".to_vec()), false),
            ],
            ..RepoData::default()
        },
    );
    s
}

/// Files fetched from the Hub (GETs of `/resolve/` paths).
fn fetched(s: &HubServer) -> Vec<String> {
    s.seen()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.contains("/resolve/"))
        .map(|r| r.path)
        .collect()
}

#[test]
fn serve_hf_downloads_once_and_the_second_start_fetches_nothing() {
    let s = hub_with_tiny();
    let home = TempDir::new("ref-serve");
    let (tpslab_home, hf_cache) = (home.0.join("tpslab"), home.0.join("hf-hub"));
    std::fs::create_dir_all(&hf_cache).expect("empty cache");
    let env = [
        ("TPSLAB_HOME", tpslab_home.to_str().expect("utf8")),
        ("HF_ENDPOINT", s.url.as_str()),
        ("HF_HUB_CACHE", hf_cache.to_str().expect("utf8")),
        ("HF_HOME", hf_cache.to_str().expect("utf8")),
        ("HF_TOKEN", ""),
    ];
    let args = ["-hf", "tpslab/tiny-GGUF:Q4_K_M", "--threads", "2"];
    // Served as the file's stem, and answering to the reference it was started with.
    let complete = |srv: &ServeProcess| {
        let models = request(srv.addr(), "GET", "/v1/models", &[], b"").json();
        assert_eq!(models["data"][0]["id"], "tiny-Q4_K_M", "{models}");
        let body = json!({"prompt": "ab", "max_tokens": 2, "model": "tpslab/tiny-GGUF:Q4_K_M"});
        let r = request(
            srv.addr(),
            "POST",
            "/v1/completions",
            &[],
            body.to_string().as_bytes(),
        );
        assert_eq!(r.status, 200, "{}", srv.log());
    };

    let srv = ServeProcess::start(&args, &env, loopback);
    complete(&srv);
    let log = srv.log();
    drop(srv);
    assert!(log.contains("downloading from"), "{log}");
    let first = fetched(&s);
    assert!(
        !first.is_empty() && first.iter().all(|p| p.ends_with("/tiny-Q4_K_M.gguf")),
        "only the Q4_K_M file is fetched: {first:?}"
    );
    let requests = s.seen().len();
    let models = tpslab_home.join("models");
    assert!(models.join("tiny-Q4_K_M.gguf").is_file());
    // Nothing was written into the Hugging Face cache.
    assert!(walkdir(&hf_cache).is_empty());

    // Second start: found in the library, not one request to the Hub.
    let srv = ServeProcess::start(&args, &env, loopback);
    complete(&srv);
    let log = srv.log();
    drop(srv);
    assert!(
        log.contains("tpslab/tiny-GGUF:Q4_K_M: in the library"),
        "{log}"
    );
    assert_eq!(s.seen().len(), requests, "the second start fetched");

    // The other commands take the same references: no tag (Q4_K_M by default) through
    // `--model`, `-hf` on generate; still nothing fetched.
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, Path::new(v))).collect();
    for model in [
        ["-m", "tpslab/tiny-GGUF"],
        ["-hf", "hf.co/tpslab/tiny-GGUF:q4_k_m"],
    ] {
        let out = tpslab(
            &[
                &["generate", "--device", "cpu", "-p", "ab", "-n", "2"][..],
                &model[..],
            ]
            .concat(),
            &env,
        );
        assert!(out.status.success(), "{model:?}: {}", text(&out.stderr));
    }
    assert_eq!(s.seen().len(), requests, "generate fetched");
    let out = tpslab(&["models", "--json"], &env);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v.as_array().map(Vec::len), Some(1), "{v}");
    assert_eq!(v[0]["source"]["repo"], "tpslab/tiny-GGUF");

    // A quant the repo lacks: the error lists what it has, and nothing is downloaded.
    let out = tpslab(
        &["generate", "-hf", "tpslab/tiny-GGUF:Q5_K_S", "-p", "ab"],
        &env,
    );
    let err = text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("no GGUF model file tagged Q5_K_S") && err.contains("tiny-Q8_0.gguf"),
        "{err}"
    );
    assert!(fetched(&s).iter().all(|p| p.ends_with("/tiny-Q4_K_M.gguf")));
}

/// Writes `repo`'s model into a cache at `root` as huggingface_hub does: the bytes in
/// `blobs/<sha256>`, `snapshots/<commit>/<file>` a relative link to it, `refs/main` the commit.
/// Returns the snapshot's file.
fn cache_repo(root: &Path, repo: &str, file: &str, bytes: &[u8]) -> PathBuf {
    use sha2::{Digest, Sha256};
    let dir = root.join(format!("models--{}", repo.replace('/', "--")));
    let snap = dir.join("snapshots").join(COMMIT);
    let blob = hub_server::hex(&Sha256::digest(bytes));
    for d in [dir.join("blobs"), dir.join("refs"), snap.clone()] {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(dir.join("blobs").join(&blob), bytes).expect("blob");
    std::fs::write(dir.join("refs/main"), COMMIT).expect("ref");
    std::os::unix::fs::symlink(format!("../../blobs/{blob}"), snap.join(file)).expect("link");
    snap.join(file)
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, step by step, as a user meets it
fn a_hugging_face_cache_is_found_by_name_and_run_in_place() {
    let s = HubServer::start();
    let home = TempDir::new("ref-cache");
    // Real paths: the cache's are reported with every link resolved.
    let h = &std::fs::canonicalize(&home.0).expect("real path");
    let tiny = tiny_model::tiny_llama(&[]);
    // Three caches, one per place the environment can name.
    let in_home = cache_repo(
        &h.join("user/.cache/huggingface/hub"),
        "tpslab/home-GGUF",
        "home-Q4_K_M.gguf",
        &tiny,
    );
    cache_repo(
        &h.join("hf-home/hub"),
        "tpslab/hfhome-GGUF",
        "hfhome-Q8_0.gguf",
        &tiny,
    );
    let in_hub_cache = cache_repo(
        &h.join("hub-cache"),
        "tpslab/hubcache-GGUF",
        "m.Q4_K_M.gguf",
        &tiny,
    );
    // The perplexity text is the test's own file, written before the caches are fingerprinted.
    let ppl_text = h.join("ppl.txt");
    std::fs::write(&ppl_text, "abcd ".repeat(40)).expect("text");
    let before = fingerprint(h, &h.join("tpslab"));
    let endpoint = PathBuf::from(&s.url);
    let base = |extra: &[(&'static str, PathBuf)]| {
        let mut env = vec![
            ("HOME", h.join("user")),
            ("TPSLAB_HOME", h.join("tpslab")),
            ("HF_ENDPOINT", endpoint.clone()),
        ];
        env.extend(extra.iter().cloned());
        env
    };
    let run = |args: &[&str], env: &[(&'static str, PathBuf)]| {
        let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
        tpslab(args, &env)
    };
    let listed = |env: &[(&'static str, PathBuf)]| -> Vec<(String, String, String)> {
        let out = run(&["models", "--json"], env);
        assert!(out.status.success(), "{}", text(&out.stderr));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        v.as_array()
            .expect("array")
            .iter()
            .map(|m| {
                let s = |k: &str| m[k].as_str().unwrap_or_default().to_string();
                (
                    s("name"),
                    m["source"]["kind"].as_str().unwrap_or_default().into(),
                    s("path"),
                )
            })
            .collect()
    };
    let hf = |name: &str, path: &Path| {
        vec![(
            name.to_string(),
            "hf_cache".to_string(),
            path.display().to_string(),
        )]
    };

    // ~/.cache/huggingface/hub when nothing else is named; HF_HOME/hub over it; HF_HUB_CACHE
    // over both (as huggingface_hub reads them).
    let home_env = base(&[]);
    assert_eq!(listed(&home_env), hf("tpslab/home-GGUF:Q4_K_M", &in_home));
    let hf_home_env = base(&[("HF_HOME", h.join("hf-home"))]);
    let in_hf_home = h
        .join("hf-home/hub/models--tpslab--hfhome-GGUF/snapshots")
        .join(COMMIT);
    assert_eq!(
        listed(&hf_home_env),
        hf(
            "tpslab/hfhome-GGUF:Q8_0",
            &in_hf_home.join("hfhome-Q8_0.gguf")
        )
    );
    let hub_cache_env = base(&[
        ("HF_HOME", h.join("hf-home")),
        ("HF_HUB_CACHE", h.join("hub-cache")),
    ]);
    assert_eq!(
        listed(&hub_cache_env),
        hf("tpslab/hubcache-GGUF:Q4_K_M", &in_hub_cache)
    );
    let table = run(&["models"], &home_env);
    let table = text(&table.stdout);
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("tpslab/home-GGUF:Q4_K_M")
                && l.contains("hf-cache tpslab/home-GGUF")),
        "{table}"
    );

    // Run by name, in place: the loaded path is the snapshot's, nothing fetched or copied.
    for (args, env, path) in [
        (
            vec!["generate", "-m", "tpslab/home-GGUF:Q4_K_M"],
            &home_env,
            &in_home,
        ),
        (
            vec!["generate", "-hf", "tpslab/hubcache-GGUF"],
            &hub_cache_env,
            &in_hub_cache,
        ),
    ] {
        let out = run(
            &[&args[..], &["--device", "cpu", "-p", "ab", "-n", "2"]].concat(),
            env,
        );
        let err = text(&out.stderr);
        assert!(out.status.success(), "{args:?}: {err}");
        assert!(
            err.contains(&format!("loaded in place from {}", path.display())),
            "{args:?}: {err}"
        );
    }
    let out = run(
        &[
            "perplexity",
            "-hf",
            "tpslab/hfhome-GGUF:Q8_0",
            "--ctx",
            "32",
            "--text",
            ppl_text.to_str().expect("utf8"),
            "--json",
        ],
        &hf_home_env,
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(s.seen().is_empty(), "fetched: {:?}", s.seen());
    // Nothing copied into the library (it holds no file at all), nothing changed in the caches.
    assert!(walkdir(&h.join("tpslab")).is_empty());
    assert_eq!(fingerprint(h, &h.join("tpslab")), before);
}

#[test]
fn a_hostile_cache_and_hostile_references_are_refused_by_name() {
    let s = HubServer::start();
    let home = TempDir::new("ref-hostile");
    let h = &std::fs::canonicalize(&home.0).expect("real path");
    let root = h.join("hub");
    std::fs::create_dir_all(h.join("outside")).expect("outside");
    std::fs::write(h.join("outside/secret.gguf"), tiny_model::tiny_llama(&[])).expect("secret");
    // A snapshot entry that links out of the cache.
    let snap = cache_repo(&root, "evil/escape", "x-Q8_0.gguf", b"x");
    std::os::unix::fs::symlink(
        h.join("outside/secret.gguf"),
        snap.with_file_name("x-Q4_K_M.gguf"),
    )
    .expect("link");
    // A ref that is not a commit hash.
    cache_repo(&root, "evil/badref", "y-Q4_K_M.gguf", b"y");
    std::fs::write(
        root.join("models--evil--badref/refs/main"),
        "../../../outside",
    )
    .expect("ref");
    std::fs::create_dir_all(root.join("models--evil--..")).expect("dotdot");
    let before = fingerprint(h, &h.join("tpslab"));
    let env = [
        ("TPSLAB_HOME", h.join("tpslab")),
        ("HF_HUB_CACHE", root.clone()),
        ("HF_ENDPOINT", PathBuf::from(&s.url)),
    ];
    let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
    for (model, why) in [
        (["-m", "evil/escape:Q4_K_M"], "leads out of the cache"),
        (
            ["-hf", "evil/badref:Q4_K_M"],
            "\"../../../outside\", not a commit hash",
        ),
        (["-hf", "evil/..:Q4_K_M"], "is not a Hugging Face repo"),
        (["-hf", "../../etc/passwd"], "is not a Hugging Face repo"),
        (["-m", "hf.co/evil/escape:Q4/../x"], "is not a quant tag"),
        (
            ["-m", "no-such-thing"],
            "not a file, not `default`, not a model in the library",
        ),
    ] {
        let out = tpslab(
            &[&["generate", "-p", "ab", "-n", "1"][..], &model[..]].concat(),
            &env,
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{model:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{model:?}: {err}");
        assert!(err.contains(why), "{model:?}: {err}");
    }
    // The listing names each refusal and lists nothing from outside.
    let out = tpslab(&["models", "--json"], &env);
    assert_eq!(text(&out.stdout).trim(), "[]");
    let err = text(&out.stderr);
    for name in ["evil/escape:Q4_K_M", "evil/badref", "models--evil--.."] {
        assert!(err.contains(name), "{name}: {err}");
    }
    assert!(s.seen().is_empty(), "fetched: {:?}", s.seen());
    assert_eq!(fingerprint(h, &h.join("tpslab")), before);
}

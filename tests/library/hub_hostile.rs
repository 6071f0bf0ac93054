//! A hostile Hub on 127.0.0.1 (tests/support/hub_server.rs, its `Hostile` modes) against the
//! real client: traversal and absolute paths in the listing's `sha`, file names and checksums
//! and in the `ETag`, `X-Linked-Etag`, `X-Repo-Commit` and `Location` headers; symlinks planted
//! in the library and its cache; lying sizes, `Range` ignored, endless and stalled bodies,
//! oversized listings; redirects to another host (which must not get the token). Each hostile
//! pull must be refused with a clear message, and a canary tree around the library (siblings,
//! the library's parent, the targets the hostile names point at) must be byte-for-byte as it was.

use crate::hub_fixtures;
use crate::hub_server;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use hub_fixtures::{
    Canary, GGUF_NAME, TempDir, assert_no_model, cfg, gguf_bytes, gguf_file, pull, req, server,
    st_files, walkdir,
};
use hub_server::{COMMIT, Hostile, HubServer, RepoData};
use tpslab::hub::{self, Choice, HubConfig, HubError, PullRequest};

/// Adds `repo` serving the tiny safetensors set with `hostile`.
fn add_st(s: &HubServer, repo: &str, hostile: Hostile) {
    s.add(
        repo,
        RepoData {
            files: st_files(),
            hostile,
            ..RepoData::default()
        },
    );
}

/// Pulls `repo` into the canary's library: must fail, with a message holding every one of
/// `wants`, leave no model in the library and nothing changed around it.
fn refused(s: &HubServer, c: &Canary, repo: &str, wants: &[&str]) -> HubError {
    refused_with(&cfg(s), c, &req(repo), wants)
}

fn refused_with(cfg: &HubConfig, c: &Canary, r: &PullRequest, wants: &[&str]) -> HubError {
    let t0 = Instant::now();
    let (out, _) = pull(cfg, &c.lib, r, &AtomicBool::new(false));
    let e = out.expect_err(&format!("{} must be refused", r.repo));
    let msg = e.to_string();
    for w in wants {
        assert!(msg.contains(w), "{}: {msg:?} lacks {w:?}", r.repo);
    }
    assert!(
        t0.elapsed() < Duration::from_secs(20),
        "{} did not hang",
        r.repo
    );
    assert_no_model(&c.lib);
    c.assert_untouched(&r.repo);
    e
}

/// A raw sibling as a hostile listing sends it: an LFS GGUF named `name`.
fn lfs_sibling(name: &str) -> serde_json::Value {
    let g = gguf_file();
    serde_json::json!({
        "rfilename": name, "size": g.bytes.len(),
        "lfs": {"sha256": g.sha256(), "size": g.bytes.len()}
    })
}

#[test]
fn hostile_listings_are_refused_before_anything_is_written() {
    let s = server();
    let c = Canary::new("listing");
    let victim_dir = c.path("victim/dir").display().to_string();
    let victim_file = c.path("victim/victim.gguf").display().to_string();
    let sha_cases = [victim_dir.as_str(), "../../victim/dir", "..", "0123"];
    for (i, sha) in sha_cases.iter().enumerate() {
        let repo = format!("evil/sha{i}");
        let h = Hostile {
            sha: Some((*sha).to_string()),
            ..Hostile::default()
        };
        add_st(&s, &repo, h);
        refused(
            &s,
            &c,
            &repo,
            &["refused what", "commit id", "not 40 hex digits"],
        );
    }
    let long = format!("{}.gguf", "a".repeat(300));
    let names = [
        (victim_file.as_str(), "absolute path"),
        ("../victim/victim.gguf", "'..' part"),
        ("a/../../victim.gguf", "'..' part"),
        ("sub//x.gguf", "empty part"),
        ("C:\\victim.gguf", "backslash"),
        ("C:victim.gguf", "drive prefix"),
        ("x\u{0}.gguf", "control character"),
        (long.as_str(), "longer than 255 bytes"),
    ];
    for (i, (name, why)) in names.iter().enumerate() {
        let repo = format!("evil/name{i}");
        let h = Hostile {
            siblings: vec![lfs_sibling(name)],
            ..Hostile::default()
        };
        s.add(
            &repo,
            RepoData {
                files: Vec::new(),
                hostile: h,
                ..RepoData::default()
            },
        );
        let r = PullRequest {
            choice: Choice::File((*name).to_string()),
            ..req(&repo)
        };
        refused_with(&cfg(&s), &c, &r, &["refused what", "a file name", why]);
    }
    let bad_sums = [
        (
            serde_json::json!({"rfilename": "m.gguf", "size": 4, "lfs": {"sha256": "../../x", "size": 4}}),
            "LFS sha256",
        ),
        (
            serde_json::json!({"rfilename": "m.gguf", "size": 4, "blobId": victim_file}),
            "git blob id",
        ),
        (serde_json::json!({"rfilename": "m.gguf"}), "no size"),
        (
            serde_json::json!({"rfilename": "m.gguf", "size": 4, "lfs": {"sha256": gguf_file().sha256(), "size": 5}}),
            "two sizes",
        ),
    ];
    for (i, (sib, why)) in bad_sums.into_iter().enumerate() {
        let repo = format!("evil/sum{i}");
        let h = Hostile {
            siblings: vec![sib],
            ..Hostile::default()
        };
        add_st(&s, &repo, h);
        refused(&s, &c, &repo, &["refused what", why]);
    }
    // Nothing was ever asked for but listings, and the library folder was not even made.
    assert!(s.seen().iter().all(|q| q.path.starts_with("/api/")));
    assert!(walkdir(c.lib.root()).is_empty());
}

#[test]
fn hostile_headers_are_refused() {
    let s = server();
    let c = Canary::new("headers");
    let victim = c.path("victim/victim.gguf").display().to_string();
    let other_commit = "f".repeat(40);
    let other_sha = "e".repeat(64);
    let cases: Vec<(&str, String, &str)> = vec![
        ("etag", "\"../../victim\"".into(), "ETag header"),
        ("etag", format!("\"{victim}\""), "ETag header"),
        (
            "x-linked-etag",
            format!("\"{victim}\""),
            "X-Linked-Etag header",
        ),
        (
            "x-linked-etag",
            format!("\"{other_sha}\""),
            "where the listing says",
        ),
        (
            "x-repo-commit",
            "../../victim/dir".into(),
            "not a commit id",
        ),
        ("x-repo-commit", victim.clone(), "not a commit id"),
        ("x-repo-commit", other_commit, "not the listed commit"),
    ];
    for (i, (k, v, why)) in cases.into_iter().enumerate() {
        let repo = format!("evil/header{i}");
        let h = Hostile {
            headers: vec![(k.to_string(), v)],
            ..Hostile::default()
        };
        add_st(&s, &repo, h);
        refused(&s, &c, &repo, &["refused what", &s.url, why]);
    }
    let port = s.url.rsplit(':').next().expect("port");
    let locations = [
        (
            "file:///etc/passwd".to_string(),
            "not an http:// or https:// URL",
        ),
        (
            format!("ftp://127.0.0.1:{port}/x"),
            "not an http:// or https:// URL",
        ),
        (
            format!("http://user:pw@127.0.0.1:{port}/cdn/x"),
            "user name or password",
        ),
        // Back to itself, for ever.
        (
            format!("/evil/loc3/resolve/{COMMIT}/model.safetensors"),
            "more than 5 times",
        ),
    ];
    for (i, (loc, why)) in locations.into_iter().enumerate() {
        let repo = format!("evil/loc{i}");
        s.add(
            &repo,
            RepoData {
                files: st_files(),
                redirect: true,
                hostile: Hostile {
                    headers: vec![("location".into(), loc)],
                    ..Hostile::default()
                },
                ..RepoData::default()
            },
        );
        refused(&s, &c, &repo, &["redirected", why]);
    }
}

#[cfg(unix)]
#[test]
fn links_planted_in_the_library_or_its_cache_are_never_followed() {
    use std::os::unix::fs::symlink;
    let s = server();
    let config = st_files().remove(0);
    let blob = format!("gitblob-{}", config.blob_id());
    type Plant = Box<dyn Fn(&Canary)>;
    fn mkdir(p: &Path) {
        std::fs::create_dir_all(p).expect("mkdir");
    }
    let cases: Vec<(&str, Plant, &str)> = vec![
        (
            "the cache folder",
            Box::new(|c| {
                mkdir(c.lib.root());
                symlink(c.path("sibling"), c.lib.root().join(".hub-cache")).expect("link");
            }),
            ".hub-cache is a link",
        ),
        (
            "a partial file",
            Box::new(move |c| {
                let d = c.lib.root().join(".hub-cache/blobs");
                mkdir(&d);
                symlink(c.path("victim/victim.gguf"), d.join(format!("{blob}.part")))
                    .expect("link");
            }),
            ".part is a link",
        ),
        (
            "a whole file",
            Box::new({
                let blob = format!("gitblob-{}", config.blob_id());
                move |c| {
                    let d = c.lib.root().join(".hub-cache/blobs");
                    mkdir(&d);
                    symlink(c.path("victim/victim.gguf"), d.join(&blob)).expect("link");
                }
            }),
            "is a link (symbolic or hard)",
        ),
        (
            "a hard link as the partial file",
            Box::new({
                let blob = format!("gitblob-{}", config.blob_id());
                move |c| {
                    let d = c.lib.root().join(".hub-cache/blobs");
                    mkdir(&d);
                    std::fs::hard_link(c.path("sibling/notes.txt"), d.join(format!("{blob}.part")))
                        .expect("hard link");
                }
            }),
            ".part is a link (symbolic or hard)",
        ),
        (
            "the staging folder",
            Box::new(|c| {
                mkdir(c.lib.root());
                symlink(c.path("sibling"), c.lib.root().join(".staging")).expect("link");
            }),
            ".staging is a link",
        ),
        (
            "the index folder",
            Box::new(|c| {
                mkdir(c.lib.root());
                symlink(c.path("sibling"), c.lib.root().join(".index")).expect("link");
            }),
            ".index is a link",
        ),
        (
            "the model's own name (dangling)",
            Box::new(|c| {
                mkdir(c.lib.root());
                symlink(c.path("victim/new-model"), c.lib.root().join("tiny-st")).expect("link");
            }),
            "already has a model named tiny-st",
        ),
    ];
    for (what, plant, why) in cases {
        let c = Canary::new("links");
        plant(&c);
        let e = pull(
            &cfg(&s),
            &c.lib,
            &req("tpslab/tiny-st"),
            &AtomicBool::new(false),
        )
        .0
        .expect_err(what)
        .to_string();
        assert!(e.contains(why), "{what}: {e}");
        c.assert_untouched(what);
        assert!(
            c.lib.list().expect("list").0.is_empty(),
            "{what}: nothing installed"
        );
    }
}

#[test]
fn lying_sizes_are_refused_and_discarded() {
    let s = server();
    let c = Canary::new("sizes");
    for (i, (delta, ignore_range)) in [(-7i64, false), (7, false), (-7, true), (7, true)]
        .into_iter()
        .enumerate()
    {
        let repo = format!("evil/size{i}");
        let h = Hostile {
            size_delta: delta,
            ignore_range,
            ..Hostile::default()
        };
        add_st(&s, &repo, h);
        refused(
            &s,
            &c,
            &repo,
            &["config.json", "the Hub lists", "the server sends"],
        );
        let parts: Vec<_> = walkdir(c.lib.root())
            .into_iter()
            .filter(|p| p.to_string_lossy().ends_with(".part"))
            .collect();
        assert!(parts.is_empty(), "{parts:?}");
    }
}

#[test]
fn endless_bodies_are_cut_at_the_listed_size() {
    let s = server();
    let c = Canary::new("endless");
    for (i, ignore_range) in [false, true].into_iter().enumerate() {
        let repo = format!("evil/endless{i}");
        let h = Hostile {
            endless: true,
            ignore_range,
            ..Hostile::default()
        };
        add_st(&s, &repo, h);
        refused(
            &s,
            &c,
            &repo,
            &[
                "sent more than the",
                "bytes it lists for config.json",
                "cut off",
            ],
        );
        assert!(c.lib.partial_downloads().is_empty());
    }
}

/// Pulls the GGUF repo with its download cut after `at` bytes: the pull fails as interrupted and
/// leaves a partial file. Returns the request, for the pulls that follow.
fn cut_pull(s: &HubServer, lib: &tpslab_engine::library::index::Library, at: u64) -> PullRequest {
    *s.faults.cut.lock().expect("cut") = Some((GGUF_NAME.into(), at));
    let r = req("tpslab/smollm2-gguf");
    let e = pull(&cfg(s), lib, &r, &AtomicBool::new(false))
        .0
        .expect_err("cut");
    assert!(matches!(e, HubError::Interrupted { .. }), "{e}");
    r
}

#[test]
fn a_server_that_ignores_range_still_gives_the_right_file() {
    let s = server();
    let home = TempDir::new("norange");
    let lib = tpslab_engine::library::index::Library::at(home.0.join("models"));
    // A first pull cut half-way through the second chunk leaves a partial file ...
    let r = cut_pull(&s, &lib, hub_fixtures::CHUNK as u64);
    assert!(lib.partial_downloads()[0].1 > hub_fixtures::CHUNK as u64);
    // ... which the next pull, from a server that now answers every range with the whole
    // file, must not append to: it starts over from byte 0.
    s.add(
        "tpslab/smollm2-gguf",
        RepoData {
            files: vec![gguf_file()],
            hostile: Hostile {
                ignore_range: true,
                ..Hostile::default()
            },
            ..RepoData::default()
        },
    );
    let before = s.body_bytes.load(Ordering::Relaxed);
    let m = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
        .0
        .expect("the whole file, from 0");
    assert_eq!(m.sha256, gguf_file().sha256());
    assert_eq!(
        tpslab_engine::library::sha256_file(&m.path).expect("hash"),
        gguf_file().sha256()
    );
    let total = gguf_bytes().len() as u64;
    assert_eq!(s.body_bytes.load(Ordering::Relaxed) - before, total);
}

#[test]
fn a_stalled_body_is_cut_and_the_next_pull_resumes() {
    let s = HubServer::start();
    let stalling = |stall: Option<u64>| RepoData {
        files: vec![gguf_file()],
        hostile: Hostile {
            stall_after: stall,
            ..Hostile::default()
        },
        ..RepoData::default()
    };
    s.add("tpslab/stall", stalling(Some(3 << 20)));
    let home = TempDir::new("stall");
    let lib = tpslab_engine::library::index::Library::at(home.0.join("models"));
    let t0 = Instant::now();
    let r = req("tpslab/stall");
    let e = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
        .0
        .expect_err("stalled");
    assert!(t0.elapsed() < Duration::from_secs(15), "the stall was cut");
    let msg = e.to_string();
    assert!(matches!(e, HubError::Interrupted { .. }), "{msg}");
    assert!(
        msg.contains("no data for 2 s") && msg.contains(GGUF_NAME),
        "{msg}"
    );
    assert_no_model(&lib);
    assert_eq!(lib.partial_downloads().len(), 1);
    s.add("tpslab/stall", stalling(None));
    let before = s.seen().len();
    let m = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
        .0
        .expect("resumed");
    assert_eq!(m.sha256, gguf_file().sha256());
    let first = s.seen()[before..]
        .iter()
        .find_map(|q| q.range.filter(|_| q.path.ends_with(GGUF_NAME)));
    assert_eq!(
        first.map(|r| r.0),
        Some(3 << 20),
        "resumed where it stalled"
    );
}

#[test]
fn stalled_endless_and_oversized_listings_are_cut() {
    let s = server();
    let c = Canary::new("big-listing");
    let cases = [
        (
            Hostile {
                stall_listing: true,
                ..Hostile::default()
            },
            "did not finish sending the listing within 5 s",
        ),
        (
            Hostile {
                endless_listing: true,
                ..Hostile::default()
            },
            "the listing is larger than 16 MiB",
        ),
        (
            Hostile {
                listing_padding: 17 << 20,
                ..Hostile::default()
            },
            "the listing is larger than 16 MiB",
        ),
    ];
    for (i, (h, why)) in cases.into_iter().enumerate() {
        let repo = format!("evil/listing{i}");
        add_st(&s, &repo, h);
        refused(&s, &c, &repo, &[why]);
    }
    s.faults.endless_search.store(true, Ordering::Relaxed);
    let t0 = Instant::now();
    let e = hub::search(&cfg(&s), "x", 10).expect_err("endless search");
    assert!(
        e.to_string()
            .contains("the search answer is larger than 4 MiB"),
        "{e}"
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
}

#[test]
fn the_token_goes_to_the_endpoint_only_never_to_a_redirect_target() {
    let cdn = HubServer::start();
    cdn.add(
        "meta/gated",
        RepoData {
            files: st_files(),
            ..RepoData::default()
        },
    );
    let hub_s = HubServer::start();
    hub_s.add(
        "meta/gated",
        RepoData {
            files: st_files(),
            token: Some("hf_secret".into()),
            redirect_to: Some(cdn.url.clone()),
            ..RepoData::default()
        },
    );
    let home = TempDir::new("token");
    let lib = tpslab_engine::library::index::Library::at(home.0.join("models"));
    let c = HubConfig {
        token: Some("hf_secret".into()),
        ..cfg(&hub_s)
    };
    let m = pull(&c, &lib, &req("meta/gated"), &AtomicBool::new(false))
        .0
        .expect("the download works without the token at the CDN");
    let weights = st_files()
        .into_iter()
        .find(|f| f.name == "model.safetensors")
        .expect("weights");
    assert!(m.files.iter().any(|f| f.sha256 == weights.sha256()));
    let at_hub = hub_s.seen();
    assert!(
        !at_hub.is_empty() && at_hub.iter().all(|q| q.auth),
        "{at_hub:?}"
    );
    let at_cdn = cdn.seen();
    assert!(
        at_cdn
            .iter()
            .any(|q| q.path == "/cdn/meta/gated/model.safetensors" && q.range.is_some()),
        "{at_cdn:?}"
    );
    assert!(
        at_cdn.iter().all(|q| !q.auth),
        "the CDN got the token: {at_cdn:?}"
    );
}

#[test]
fn user_input_and_unverifiable_files_are_refused_before_any_download() {
    let s = server();
    s.add(
        "../evil",
        RepoData {
            files: st_files(),
            ..RepoData::default()
        },
    );
    let hits = hub::search(&cfg(&s), "evil", 10).expect("search");
    assert!(hits.is_empty(), "an id that is a path is dropped: {hits:?}");
    let c = Canary::new("input");
    for repo in ["../evil", "/abs/x", "a/b/c", "a/../b"] {
        refused(&s, &c, repo, &["is not a repository id"]);
    }
    let r = PullRequest {
        revision: "../../x".into(),
        ..req("tpslab/tiny-st")
    };
    refused_with(&cfg(&s), &c, &r, &["is not a revision"]);
    assert!(s.seen().iter().all(|q| q.path == "/api/models"));
    // A file listed with neither an LFS sha256 nor a git blob id cannot be verified.
    let h = Hostile {
        siblings: vec![serde_json::json!({"rfilename": "plain.gguf", "size": 10})],
        ..Hostile::default()
    };
    add_st(&s, "evil/unverifiable", h);
    let r = PullRequest {
        choice: Choice::File("plain.gguf".into()),
        ..req("evil/unverifiable")
    };
    refused_with(
        &cfg(&s),
        &c,
        &r,
        &["lists no checksum for plain.gguf", &s.url],
    );
    assert!(s.seen().iter().all(|q| !q.path.contains("/resolve/")));
}

#[test]
fn the_cli_refuses_a_hostile_pull_and_touches_nothing() {
    let s = server();
    let c = Canary::new("cli");
    let victim = c.path("victim/dir").display().to_string();
    add_st(
        &s,
        "evil/abs-sha",
        Hostile {
            sha: Some(victim),
            ..Hostile::default()
        },
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(["pull", "evil/abs-sha", "--endpoint", &s.url])
        .env("TPSLAB_HOME", &c.base.0)
        .env_remove("HF_ENDPOINT")
        .env_remove("HF_TOKEN")
        .output()
        .expect("run tpslab");
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with(&format!("error: refused what {} sent: a commit id", s.url)),
        "{err}"
    );
    c.assert_untouched("tpslab pull");
    assert!(walkdir(c.lib.root()).is_empty());
}

#[test]
fn two_pulls_never_append_to_the_same_partial_file() {
    let s = server();
    let home = TempDir::new("busy");
    let lib = tpslab_engine::library::index::Library::at(home.0.join("models"));
    let r = cut_pull(&s, &lib, 0);
    let (part, _) = lib.partial_downloads().remove(0);
    // Another pull holds the partial file (its lock, as a running pull does).
    let held = std::fs::File::open(&part).expect("open part");
    held.lock().expect("lock");
    let e = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
        .0
        .expect_err("busy");
    assert!(matches!(e, HubError::Busy(_)), "{e}");
    assert!(e.to_string().contains(GGUF_NAME), "{e}");
    assert!(part.exists(), "the other pull's partial file is left alone");
    drop(held);
    let m = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
        .0
        .expect("once the other pull is gone");
    assert_eq!(m.sha256, gguf_file().sha256());
}

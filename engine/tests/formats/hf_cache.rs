//! The Hugging Face cache read in place: a cache laid out as `huggingface_hub` lays it out
//! (refs/main, snapshots of links into blobs) is found by repo and quant, listed beside the
//! library with source `hf-cache`, and loaded from the snapshot; nothing is written into the
//! cache or the library. A hostile cache (a link out of the root, a ref that is not a commit, a
//! snapshot that is a link elsewhere, a folder that is no repo id) is refused by name.

use crate::temp_dir;
use crate::tiny_model;

use std::path::{Path, PathBuf};

use temp_dir::TempDir;
use tpslab_engine::library::hf_cache::HfCache;
use tpslab_engine::library::index::{Library, ModelSource};
use tpslab_engine::library::model_ref::{HubRef, ModelRef};
use tpslab_engine::library::resolve::Found;

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// Writes `files` (name in the snapshot, bytes) into `root` as huggingface_hub does: each
/// file's bytes in `blobs/<n>`, the snapshot's entry a relative link to it, `refs/main` naming
/// the commit.
fn cached_repo(root: &Path, folder: &str, files: &[(&str, &[u8])]) -> PathBuf {
    let repo = root.join(folder);
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(repo.join("blobs")).expect("blobs");
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::write(repo.join("refs").join("main"), COMMIT).expect("ref");
    for (i, (name, bytes)) in files.iter().enumerate() {
        let blob = format!("blob{i:04}");
        std::fs::write(repo.join("blobs").join(&blob), bytes).expect("blob");
        let link = snap.join(name);
        std::fs::create_dir_all(link.parent().expect("parent")).expect("snapshot dir");
        let up = "../".repeat(name.matches('/').count() + 2);
        std::os::unix::fs::symlink(format!("{up}blobs/{blob}"), &link).expect("symlink");
    }
    snap
}

fn hub(text: &str) -> HubRef {
    HubRef::parse(text).expect(text)
}

/// Every path under `dir` with its kind, link target or bytes (links not followed).
fn tree(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let md = std::fs::symlink_metadata(&p).expect("lstat");
        if md.file_type().is_symlink() {
            out.push(format!("{} -> {:?}", p.display(), std::fs::read_link(&p)));
        } else if md.is_dir() {
            out.push(format!("{}/", p.display()));
            out.extend(tree(&p));
        } else {
            out.push(format!(
                "{} {:?}",
                p.display(),
                std::fs::read(&p).expect("read")
            ));
        }
    }
    out.sort();
    out
}

#[test]
fn a_cached_repo_is_found_by_quant_and_loaded_in_place() {
    let home = TempDir::new("hf-cache-find");
    // Real paths: the cache's are reported with every link resolved.
    let root = std::fs::canonicalize(&home.0).expect("real").join("hub");
    let tiny = tiny_model::tiny_llama(&[]);
    let snap = cached_repo(
        &root,
        "models--tpslab--tiny-GGUF",
        &[
            ("mmproj-tiny-Q4_K_M.gguf", b"not a model"),
            ("tiny-Q8_0.gguf", b"junk, never read"),
            ("q4/tiny-Q4_K_M.gguf", &tiny),
            ("README.md", b"# tiny"),
        ],
    );
    let before = tree(&home.0);
    let cache = HfCache::at(&root).expect("cache");
    let want = snap.join("q4/tiny-Q4_K_M.gguf");
    assert_eq!(
        cache.find(&hub("tpslab/tiny-GGUF:q4_k_m")).expect("find"),
        Some(want.clone())
    );
    // No tag: Q4_K_M first, as llama.cpp.
    assert_eq!(
        cache.find(&hub("tpslab/tiny-GGUF")).expect("default"),
        Some(want.clone())
    );
    assert_eq!(
        cache.find(&hub("tpslab/tiny-GGUF:Q8_0")).expect("q8"),
        Some(snap.join("tiny-Q8_0.gguf"))
    );
    assert_eq!(
        cache.find(&hub("tpslab/tiny-GGUF:Q5_0")).expect("absent"),
        None
    );
    assert_eq!(
        cache.find(&hub("tpslab/other:Q4_K_M")).expect("no repo"),
        None
    );

    // Listed beside the library: the model that reads, the junk one apart with its reason.
    let lib_dir = home.0.join("models");
    let lib = Library::at(&lib_dir).with_hf_cache(Some(cache.clone()));
    let (models, bad) = lib.list_indexed().expect("list");
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0].name, "tpslab/tiny-GGUF:Q4_K_M");
    assert_eq!(models[0].path, want);
    assert_eq!(
        models[0].source,
        ModelSource::HfCache {
            repo: "tpslab/tiny-GGUF".into(),
            commit: COMMIT.into()
        }
    );
    assert_eq!(models[0].source.to_string(), "hf-cache tpslab/tiny-GGUF");
    assert_eq!(models[0].arch, "llama");
    assert!(
        bad.len() == 1 && bad[0].starts_with("tpslab/tiny-GGUF:Q8_0"),
        "{bad:?}"
    );

    // Resolution: by reference, through the library, to the snapshot; loads from there.
    let m = ModelRef::classify("tpslab/tiny-GGUF:Q4_K_M", Some(lib.root())).expect("classify");
    let found = lib.find(&m, &mut |_| {}).expect("find");
    assert_eq!(found, Found::Path(want.clone()));
    let lm = tpslab_engine::model::LoadedModel::load(&want).expect("loads in place");
    assert_eq!(lm.path, want);
    let missing = ModelRef::classify("tpslab/tiny-GGUF:Q2_K", Some(lib.root())).expect("classify");
    assert_eq!(
        lib.find(&missing, &mut |_| {}).expect("find"),
        Found::Missing(hub("tpslab/tiny-GGUF:Q2_K"))
    );
    // Nothing written: the cache is as it was, and the library folder was not even made.
    assert_eq!(tree(&home.0), before);
    assert!(!lib_dir.exists());
}

#[test]
fn a_split_model_in_the_cache_is_found_whole() {
    let home = TempDir::new("hf-cache-split");
    let root = std::fs::canonicalize(&home.0).expect("real").join("hub");
    let snap = cached_repo(
        &root,
        "models--o--split-GGUF",
        &[
            ("m-Q4_K_M-00001-of-00002.gguf", b"1"),
            ("m-Q4_K_M-00002-of-00002.gguf", b"2"),
            ("m-Q8_0-00001-of-00002.gguf", b"1"),
        ],
    );
    let cache = HfCache::at(&root).expect("cache");
    assert_eq!(
        cache.find(&hub("o/split-GGUF")).expect("find"),
        Some(snap.join("m-Q4_K_M-00001-of-00002.gguf"))
    );
    // A part missing from the cache: not here (a download would fetch the whole set).
    assert_eq!(cache.find(&hub("o/split-GGUF:Q8_0")).expect("find"), None);
}

#[test]
fn a_hostile_cache_is_refused_by_name() {
    let home = TempDir::new("hf-cache-hostile");
    let root = home.0.join("hub");
    let outside = home.0.join("outside");
    std::fs::create_dir_all(&outside).expect("outside");
    std::fs::write(outside.join("secret.gguf"), b"the user's own").expect("secret");
    // A snapshot entry linking out of the cache (to a file of the user's, and to /etc).
    let snap = cached_repo(&root, "models--evil--escape", &[]);
    std::fs::create_dir_all(&snap).expect("snap");
    std::os::unix::fs::symlink(outside.join("secret.gguf"), snap.join("x-Q4_K_M.gguf"))
        .expect("link");
    std::os::unix::fs::symlink("/etc/passwd", snap.join("x-Q8_0.gguf")).expect("link");
    // A ref that is a path, not a commit.
    let bad_ref = cached_repo(&root, "models--evil--badref", &[("y-Q4_K_M.gguf", b"y")]);
    std::fs::write(
        bad_ref
            .parent()
            .and_then(Path::parent)
            .expect("repo")
            .join("refs/main"),
        "../../../../etc",
    )
    .expect("ref");
    // A snapshot folder that is a link elsewhere.
    let repo = root.join("models--evil--snaplink");
    std::fs::create_dir_all(repo.join("refs")).expect("refs");
    std::fs::create_dir_all(repo.join("snapshots")).expect("snapshots");
    std::fs::write(repo.join("refs/main"), COMMIT).expect("ref");
    std::os::unix::fs::symlink(&outside, repo.join("snapshots").join(COMMIT)).expect("link");
    // A folder whose name is no repo id, and a repo folder that is a link out.
    std::fs::create_dir_all(root.join("models--evil--..")).expect("dotdot");
    std::os::unix::fs::symlink(&outside, root.join("models--evil--away")).expect("link");
    let before = tree(&home.0);

    let cache = HfCache::at(&root).expect("cache");
    let err = |r: &str| cache.find(&hub(r)).expect_err(r).to_string();
    for (r, why) in [
        ("evil/escape:Q4_K_M", "leads out of the cache"),
        ("evil/escape:Q8_0", "/etc/passwd"),
        (
            "evil/badref:Q4_K_M",
            "\"../../../../etc\", not a commit hash",
        ),
        ("evil/snaplink:Q4_K_M", "leads out of the cache"),
        ("evil/away:Q4_K_M", "leads out of the cache"),
    ] {
        let e = err(r);
        assert!(
            e.contains(why) && e.contains("in the Hugging Face cache is refused"),
            "{r}: {e}"
        );
    }
    assert!(HubRef::parse("evil/..:Q4_K_M").is_err());
    assert!(cache.snapshot("../evil").is_err());
    let (repos, bad) = cache.repos();
    assert!(!repos.iter().any(|r| r.contains("..")), "{repos:?}");
    assert!(
        bad.iter().any(|b| b.contains("models--evil--..")),
        "{bad:?}"
    );
    // The listing names each refusal and lists nothing from outside.
    let (models, bad) = cache.list();
    assert!(models.is_empty(), "{models:?}");
    for name in ["evil/escape", "evil/badref", "evil/snaplink", "evil/away"] {
        assert!(bad.iter().any(|b| b.starts_with(name)), "{name}: {bad:?}");
    }
    assert_eq!(tree(&home.0), before);
}

/// A transformers folder in the cache (config, tokenizer and safetensors, each a link into the
/// blobs, as `huggingface_hub` leaves them) is found by its repo alone, listed as safetensors,
/// and loaded from the snapshot in place; asked with a quant it is not there (no GGUF).
#[test]
fn a_cached_transformers_folder_is_found_and_loaded_in_place() {
    let home = TempDir::new("hf-cache-folder");
    let root = std::fs::canonicalize(&home.0).expect("real").join("hub");
    // The folder: a tiny Llama exported as transformers writes it.
    let work = TempDir::new("hf-cache-folder-src");
    let gguf = work.0.join("tiny.gguf");
    std::fs::write(&gguf, tiny_model::tiny_llama(&[])).expect("tiny gguf");
    let folder = work.0.join("folder");
    let f = tpslab_engine::formats::gguf::GgufFile::open(&gguf).expect("open");
    tpslab_engine::quant::hf_export::export_folder(
        &f,
        &folder,
        tpslab_kernels::WType::F32,
        1,
        &mut |_, _| {},
    )
    .expect("export");
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&folder)
        .expect("folder")
        .flatten()
        .map(|e| {
            let name = e.file_name().into_string().expect("name");
            (name, std::fs::read(e.path()).expect("read"))
        })
        .collect();
    files.sort();
    assert!(
        files.iter().any(|(n, _)| n.ends_with(".safetensors")),
        "{files:?}"
    );
    let borrowed: Vec<(&str, &[u8])> = files.iter().map(|(n, b)| (n.as_str(), &b[..])).collect();
    let snap = cached_repo(&root, "models--tpslab--tiny-st", &borrowed);
    let before = tree(&home.0);

    let cache = HfCache::at(&root).expect("cache");
    assert_eq!(
        cache.find(&hub("tpslab/tiny-st")).expect("find"),
        Some(snap.clone())
    );
    assert_eq!(
        cache.find(&hub("tpslab/tiny-st:Q4_K_M")).expect("quant"),
        None
    );
    let lib = Library::at(&home.0.join("models")).with_hf_cache(Some(cache.clone()));
    let (models, bad) = lib.list_indexed().expect("list");
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(models.len(), 1, "{models:?}");
    assert_eq!(models[0].name, "tpslab/tiny-st");
    assert_eq!(models[0].path, snap);
    // A folder is described by its transformers class, as the library describes one.
    assert_eq!(models[0].arch, "LlamaForCausalLM");
    assert_eq!(
        models[0].source,
        ModelSource::HfCache {
            repo: "tpslab/tiny-st".into(),
            commit: COMMIT.into()
        }
    );
    let m = ModelRef::classify("tpslab/tiny-st", Some(lib.root())).expect("classify");
    assert_eq!(
        lib.find(&m, &mut |_| {}).expect("find"),
        Found::Path(snap.clone())
    );
    // It loads from the snapshot and computes as the GGUF it was exported from.
    let lm = tpslab_engine::model::LoadedModel::load(&snap).expect("loads in place");
    let orig = tpslab_engine::model::LoadedModel::load(&gguf).expect("gguf loads");
    assert_eq!(lm.model.cfg, orig.model.cfg);
    assert_eq!(tree(&home.0), before, "nothing written into the cache");

    // A folder whose config links out of the cache is refused by name, never read.
    let evil = cached_repo(&root, "models--tpslab--evil-st", &borrowed);
    std::fs::remove_file(evil.join("config.json")).expect("unlink");
    std::os::unix::fs::symlink("/etc/hostname", evil.join("config.json")).expect("link out");
    let e = cache
        .find(&hub("tpslab/evil-st"))
        .expect_err("a link out of the cache");
    assert!(e.to_string().contains("config.json"), "{e}");
}

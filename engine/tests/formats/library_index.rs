//! The library index on real folders: importing the default GGUF and a safetensors folder,
//! refusing broken files (and a folder whose tensors are not its model) with nothing left behind, and a full disk or an unwritable folder
//! giving a clear error with the library as it was (a small tmpfs where this machine lets us
//! mount one, as root; an injected failing writer always).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::AtomicBool;

use tpslab_engine::library::index::{IndexError, Library, ModelFormat, ModelSource};
use tpslab_engine::library::{self, default_manifest, sha256_file};

use crate::temp_dir;
use crate::tiny_model;
use temp_dir::TempDir;

fn default_model() -> PathBuf {
    library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("default model")
}

/// A tmpfs of `size` mounted at a fresh folder, unmounted when dropped; None where mounting is
/// not allowed.
struct Tmpfs(TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = TempDir::new("lib-tmpfs");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&dir.0)
            .output()
            .is_ok_and(|o| o.status.success());
        ok.then_some(Self(dir))
    }

    fn remount_ro(&self) -> bool {
        Command::new("mount")
            .args(["-o", "remount,ro"])
            .arg(&self.0.0)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0.0).status();
    }
}

/// A real (tiny, random) Llama folder as the engine loads it, plus a file that is not the
/// model's.
fn tiny_st_folder(dir: &Path) -> PathBuf {
    let f = dir.join("tiny-st");
    tiny_model::tiny_folder(&f);
    std::fs::write(f.join("notes.bin"), [1u8; 16]).expect("write");
    f
}

/// A folder whose `config.json` and `tokenizer.json` are a model's but whose tensors are not:
/// one embedding of the wrong shape and nothing else.
fn not_a_model_folder(dir: &Path) -> PathBuf {
    let f = tiny_st_folder(dir);
    let header = br#"{"model.embed_tokens.weight":{"dtype":"F32","shape":[2,4],"data_offsets":[0,32]},"__metadata__":{"format":"pt"}}"#;
    let mut st = (header.len() as u64).to_le_bytes().to_vec();
    st.extend_from_slice(header);
    st.extend([0u8; 32]);
    std::fs::write(f.join("model.safetensors"), st).expect("write");
    f
}

/// The library folder's files and sizes, to compare before and after a failed change.
fn snapshot(root: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(snapshot(&p));
        } else {
            out.push((p.clone(), std::fs::metadata(&p).map_or(0, |m| m.len())));
        }
    }
    out.sort();
    out
}

fn never() -> AtomicBool {
    AtomicBool::new(false)
}

#[test]
fn imports_the_default_gguf_and_lists_it_with_a_manifest() {
    let home = TempDir::new("lib-import");
    let lib = Library::at(home.0.join("models"));
    let src = default_model();
    let mut last = (0, 0);
    let m = lib
        .import(&src, &never(), &mut |d, t| last = (d, t))
        .expect("import");
    let size = std::fs::metadata(&src).expect("md").len();
    assert_eq!(last, (size, size));
    assert_eq!(m.sha256, default_manifest().expect("manifest").sha256);
    assert_eq!(m.sha256, sha256_file(&m.path).expect("hash"));
    assert_eq!(
        (m.format, m.arch.as_str(), m.precision.to_string().as_str()),
        (ModelFormat::Gguf, "llama", "Q4_1")
    );
    assert_eq!(m.context_len, Some(8192));
    assert!(matches!(&m.source, ModelSource::Imported { from } if from == &src));
    let (models, bad) = lib.list().expect("list");
    assert!(bad.is_empty(), "{bad:?}");
    assert_eq!(models, vec![m.clone()]);
    // The same name again is refused before anything is copied.
    let e = lib
        .import(&src, &never(), &mut |_, _| {})
        .expect_err("exists");
    assert!(matches!(e, IndexError::Exists(_)), "{e}");
    // A staging folder left by a process that is gone is swept by the next change.
    let stale = lib
        .root()
        .join(".staging")
        .join(format!("{}-1-0", u32::MAX - 1));
    std::fs::create_dir_all(&stale).expect("mkdir");
    std::fs::write(stale.join("half.gguf"), b"half").expect("write");
    lib.remove(&m.name).expect("rm");
    assert!(!stale.exists());
    assert!(lib.list().expect("list").0.is_empty());
    assert!(
        snapshot(lib.root()).is_empty(),
        "{:?}",
        snapshot(lib.root())
    );
}

#[test]
fn a_folder_holding_one_gguf_imports_as_that_file() {
    let src_dir = TempDir::new("lib-gguf-folder-src");
    let folder = src_dir.0.join("my-model");
    std::fs::create_dir_all(&folder).expect("mkdir");
    let file = folder.join("model-q4.gguf");
    if std::fs::hard_link(default_model(), &file).is_err() {
        std::fs::copy(default_model(), &file).expect("copy");
    }
    let home = TempDir::new("lib-gguf-folder");
    let lib = Library::at(home.0.join("models"));
    let m = lib
        .import(&folder, &never(), &mut |_, _| {})
        .expect("import");
    assert_eq!(m.name, "model-q4.gguf");
    assert_eq!(m.path, lib.root().join("model-q4.gguf"));
    assert!(m.path.is_file());
    assert_eq!(lib.list().expect("list").0, vec![m]);
}

#[test]
fn a_loose_default_model_is_listed_and_indexed_without_hashing_it() {
    let home = TempDir::new("lib-loose");
    let lib = Library::at(home.0.join("models"));
    std::fs::create_dir_all(lib.root()).expect("mkdir");
    let d = default_manifest().expect("manifest");
    let dest = lib.root().join(&d.file);
    if std::fs::hard_link(default_model(), &dest).is_err() {
        std::fs::copy(default_model(), &dest).expect("copy");
    }
    let (models, _) = lib.list().expect("list");
    assert_eq!(models.len(), 1);
    assert!(!models[0].is_indexed());
    assert!(
        matches!(&models[0].source, ModelSource::Default { package } if *package == d.source.package)
    );
    let (models, _) = lib.list_indexed().expect("list");
    assert_eq!(models[0].sha256, d.sha256);
    assert!(
        lib.list().expect("list").0[0].is_indexed(),
        "the manifest was stored"
    );
}

#[test]
fn imports_a_safetensors_folder_with_its_model_files_only() {
    let src_dir = TempDir::new("lib-st-src");
    let src = tiny_st_folder(&src_dir.0);
    let home = TempDir::new("lib-st");
    let lib = Library::at(home.0.join("models"));
    let m = lib.import(&src, &never(), &mut |_, _| {}).expect("import");
    assert_eq!(m.format, ModelFormat::Safetensors);
    assert_eq!(
        (m.arch.as_str(), m.precision.to_string().as_str()),
        ("LlamaForCausalLM", "F32")
    );
    assert!(m.params > 0);
    assert_eq!(m.context_len, Some(256));
    let names: Vec<&str> = m.files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(
        names,
        ["config.json", "model.safetensors", "tokenizer.json"]
    );
    assert!(!m.path.join("notes.bin").exists());
    for f in &m.files {
        assert_eq!(f.sha256, sha256_file(&src.join(&f.name)).expect("hash"));
    }
    assert_eq!(lib.list().expect("list").0, vec![m]);
}

#[test]
fn broken_files_are_refused_and_nothing_is_left() {
    let src_dir = TempDir::new("lib-broken-src");
    let home = TempDir::new("lib-broken");
    let lib = Library::at(home.0.join("models"));
    // A GGUF cut short: its tensor table points past the end.
    let bytes = std::fs::read(default_model()).expect("read");
    let cut = src_dir.0.join("cut.gguf");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).expect("write");
    let e = lib
        .import(&cut, &never(), &mut |_, _| {})
        .expect_err("truncated");
    assert!(
        e.to_string()
            .starts_with(&format!("{} is not a usable model: ", cut.display())),
        "{e}"
    );
    // Not a GGUF at all.
    let junk = src_dir.0.join("junk.gguf");
    std::fs::write(&junk, b"hello, not a model").expect("write");
    assert!(matches!(
        lib.import(&junk, &never(), &mut |_, _| {}),
        Err(IndexError::Invalid { .. })
    ));
    // A safetensors header longer than its file.
    let st = tiny_st_folder(&src_dir.0);
    let mut f = std::fs::File::create(st.join("model.safetensors")).expect("create");
    f.write_all(&(1u64 << 40).to_le_bytes()).expect("write");
    drop(f);
    let e = lib
        .import(&st, &never(), &mut |_, _| {})
        .expect_err("bad header");
    assert!(
        e.to_string()
            .contains("not a safetensors file or truncated"),
        "{e}"
    );
    // A model's config and tokenizer over tensors that are not the model's.
    let junk = not_a_model_folder(&src_dir.0.join("junk"));
    let e = lib
        .import(&junk, &never(), &mut |_, _| {})
        .expect_err("not a model");
    assert!(
        e.to_string().contains("are not a LlamaForCausalLM model"),
        "{e}"
    );
    assert!(e.to_string().contains("has no tensor named"), "{e}");
    // A folder with no tokenizer.
    std::fs::remove_file(st.join("tokenizer.json")).expect("rm");
    let e = lib
        .import(&st, &never(), &mut |_, _| {})
        .expect_err("no tokenizer");
    assert!(e.to_string().contains("no tokenizer.json"), "{e}");
    assert!(
        snapshot(lib.root()).is_empty(),
        "{:?}",
        snapshot(lib.root())
    );
}

#[test]
fn a_library_folder_that_cannot_be_created_gives_a_clear_error() {
    // As root, permissions do not stop writes; a regular file where a folder must go does.
    let home = TempDir::new("lib-unwritable");
    let blocker = home.0.join("not-a-folder");
    std::fs::write(&blocker, b"file").expect("write");
    let lib = Library::at(blocker.join("models"));
    let e = lib
        .import(&default_model(), &never(), &mut |_, _| {})
        .expect_err("cannot create");
    assert!(matches!(e, IndexError::Unwritable { .. }), "{e}");
    assert!(
        e.to_string().starts_with(&format!(
            "cannot write to the library folder {}",
            lib.root().display()
        )),
        "{e}"
    );
    assert!(e.to_string().ends_with("the library is unchanged"), "{e}");
    assert_eq!(std::fs::read(&blocker).expect("read"), b"file");
}

#[test]
fn a_full_disk_through_the_writer_gives_a_clear_error_and_changes_nothing() {
    let src_dir = TempDir::new("lib-seam-src");
    let home = TempDir::new("lib-seam");
    let lib = Library::at(home.0.join("models"));
    lib.import(&tiny_st_folder(&src_dir.0), &never(), &mut |_, _| {})
        .expect("a first model");
    let before = snapshot(lib.root());
    let listed = lib.list().expect("list").0;
    /// Accepts 1 MiB, then fails as a full disk does.
    struct Full(std::fs::File, usize);
    impl Write for Full {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            if self.1 + b.len() > 1 << 20 {
                return Err(std::io::Error::from_raw_os_error(28));
            }
            self.1 += b.len();
            self.0.write(b)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.0.flush()
        }
    }
    let e = lib
        .import_with(&default_model(), &never(), &mut |_, _| {}, &mut |p| {
            Ok(Box::new(Full(std::fs::File::create_new(p)?, 0)))
        })
        .expect_err("full");
    assert!(matches!(e, IndexError::NoSpace { .. }), "{e}");
    assert!(
        e.to_string().starts_with("not enough space for SmolLM2"),
        "{e}"
    );
    assert_eq!(snapshot(lib.root()), before);
    assert_eq!(lib.list().expect("list").0, listed);
}

#[test]
fn a_real_full_or_read_only_file_system_leaves_the_library_as_it_was() {
    // A real full disk: this machine kind (and CI on it) runs as root, so the mount works; a
    // machine where it cannot fails here rather than passing without the check.
    let fs = Tmpfs::mount("4m").expect("mount a 4 MiB tmpfs (needs root)");
    let src_dir = TempDir::new("lib-tmpfs-src");
    let lib = Library::at(fs.0.0.join("models"));
    lib.import(&tiny_st_folder(&src_dir.0), &never(), &mut |_, _| {})
        .expect("a small model fits");
    let before = snapshot(lib.root());
    let listed = lib.list().expect("list").0;
    // The 98 MB default model does not fit in 4 MiB.
    let e = lib
        .import(&default_model(), &never(), &mut |_, _| {})
        .expect_err("ENOSPC");
    assert!(matches!(e, IndexError::NoSpace { .. }), "{e}");
    assert!(e.to_string().contains("not enough space"), "{e}");
    assert_eq!(snapshot(lib.root()), before);
    assert_eq!(lib.list().expect("list").0, listed);
    // Read-only: even root cannot write.
    assert!(fs.remount_ro(), "remount read-only");
    let other = tiny_st_folder(&src_dir.0.join("again"));
    let e = lib
        .import(&other, &never(), &mut |_, _| {})
        .expect_err("EROFS");
    assert!(matches!(e, IndexError::Exists(_)), "{e}");
    let renamed = src_dir.0.join("tiny-st-2");
    std::fs::rename(&other, &renamed).expect("rename");
    let e = lib
        .import(&renamed, &never(), &mut |_, _| {})
        .expect_err("EROFS");
    assert!(matches!(e, IndexError::Unwritable { .. }), "{e}");
    assert!(e.to_string().contains("Read-only file system"), "{e}");
    assert!(matches!(
        lib.remove("tiny-st"),
        Err(IndexError::Unwritable { .. })
    ));
    assert_eq!(snapshot(lib.root()), before);
    assert_eq!(lib.list().expect("list").0, listed);
}

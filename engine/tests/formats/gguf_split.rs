//! Split GGUF models: the default model written as three parts the way llama.cpp's `gguf-split`
//! lays them out (metadata in part 1; `split.no` / `split.count` as u16, `split.tensors.count`
//! as i32 in every part) opens as one model with the same tensors and the same logits, and a
//! broken set (a part opened alone, a part missing, parts out of order) is refused clearly.

use std::path::{Path, PathBuf};

use tpslab_engine::device::Workspace;
use tpslab_engine::formats::gguf::{GgufFile, Value};
use tpslab_engine::formats::gguf_split::{KEY_COUNT, KEY_NO, KEY_TENSORS, model_files, part_path};
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::library::index::{Library, ModelFormat};
use tpslab_engine::model::LoadedModel;
use tpslab_kernels::ThreadPool;

use crate::split;
use crate::temp_dir;
use temp_dir::TempDir;

fn default_model() -> PathBuf {
    tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("model")
}

/// `src` as `parts` files `smol-0000i-of-0000N.gguf` in `dir`; returns the first. `no_of` gives
/// the `split.no` written into part `i` (normally `i`).
fn write_split(
    src: &GgufFile,
    dir: &Path,
    parts: usize,
    no_of: impl Fn(usize) -> usize,
) -> PathBuf {
    let n = src.tensors.len();
    split::write_split(src, dir, "smol", parts, |i| {
        vec![
            (KEY_NO.to_string(), Value::U16(no_of(i) as u16)),
            (KEY_COUNT.to_string(), Value::U16(parts as u16)),
            (KEY_TENSORS.to_string(), Value::I32(n as i32)),
        ]
    })
}

/// Logits of the last of a few prompt tokens.
fn logits(lm: &LoadedModel) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let prompt = [504u32, 3575, 282, 4649, 314];
    let mut kv = KvCache::new(&lm.model.cfg, 16, 1).expect("kv");
    let mut ws = Workspace::default();
    let mut b = Batch::default();
    b.push_seq(vec![0], 0, &prompt, true);
    lm.model
        .forward(&pool, &b, &mut kv, &mut ws)
        .expect("forward")
        .to_vec()
}

#[test]
fn three_parts_open_as_the_same_model() {
    let dir = TempDir::new("ok");
    let src_path = default_model();
    let src = GgufFile::open(&src_path).expect("open");
    let first = write_split(&src, &dir.0, 3, |i| i);

    let joined = GgufFile::open(&first).expect("open split");
    assert_eq!(joined.tensors.len(), src.tensors.len());
    for (a, b) in joined.tensors.iter().zip(&src.tensors) {
        assert_eq!((&a.name, &a.dims, a.ty), (&b.name, &b.dims, b.ty));
        assert_eq!(
            joined.read_tensor(a).expect("read part"),
            src.read_tensor(b).expect("read"),
            "{}",
            a.name
        );
    }
    let files = model_files(&joined);
    assert_eq!(files.len(), 3, "{files:?}");
    assert!(files.iter().all(|f| f.exists()));

    let whole = LoadedModel::load(&src_path).expect("load");
    let split = LoadedModel::load(&first).expect("load split");
    assert_eq!(logits(&split), logits(&whole));
    assert_eq!(split.precision, whole.precision);
}

#[test]
fn a_broken_set_is_refused_with_the_reason() {
    let src = GgufFile::open(default_model()).expect("open");

    let dir = TempDir::new("broken");
    let first = write_split(&src, &dir.0, 3, |i| i);
    let second = part_path(&first, 2, 3).expect("name");
    let err = GgufFile::open(&second)
        .expect_err("a later part alone")
        .to_string();
    assert!(
        err.contains("part 2 of 3") && err.contains("smol-00001-of-00003.gguf"),
        "{err}"
    );

    std::fs::remove_file(part_path(&first, 3, 3).expect("name")).expect("rm");
    let err = GgufFile::open(&first)
        .expect_err("missing part")
        .to_string();
    assert!(err.contains("smol-00003-of-00003.gguf"), "{err}");

    let swapped = TempDir::new("swapped");
    let first = write_split(&src, &swapped.0, 3, |i| [0, 2, 1][i]);
    let err = GgufFile::open(&first)
        .expect_err("parts out of order")
        .to_string();
    assert!(err.contains("expected part 2 of 3"), "{err}");
}

#[test]
fn the_library_imports_a_split_model_as_a_folder_of_its_parts() {
    let src = GgufFile::open(default_model()).expect("open");
    let parts = TempDir::new("src");
    let first = write_split(&src, &parts.0, 3, |i| i);
    let lib_dir = TempDir::new("lib");
    let lib = Library::at(&lib_dir.0);
    let cancel = std::sync::atomic::AtomicBool::new(false);
    let mut last = (0, 0);
    let entry = lib
        .import(&first, &cancel, &mut |done, total| last = (done, total))
        .expect("import");
    assert_eq!(entry.name, "smol");
    assert_eq!(entry.format, ModelFormat::Gguf);
    assert_eq!(entry.files.len(), 3, "{:?}", entry.files);
    assert!(entry.files.iter().all(|f| f.sha256.len() == 64));
    assert_eq!(last.0, last.1);
    assert_eq!(entry.size, last.1);
    assert_eq!(
        entry.path,
        lib_dir.0.join("smol").join("smol-00001-of-00003.gguf")
    );
    assert_eq!(
        entry.params,
        src.tensors.iter().map(|t| t.n_elements()).sum::<u64>()
    );
    // Listed again from the folder, and it loads.
    let (listed, unreadable) = lib.list().expect("list");
    assert!(unreadable.is_empty(), "{unreadable:?}");
    let again = listed.iter().find(|e| e.name == "smol").expect("listed");
    assert_eq!((&again.path, again.files.len()), (&entry.path, 3));
    let lm = LoadedModel::load(&entry.path).expect("load");
    assert_eq!(lm.model.cfg.vocab, 49152);
    // A part missing from the source: refused, nothing installed.
    std::fs::remove_file(part_path(&first, 2, 3).expect("name")).expect("rm");
    let lib2 = Library::at(lib_dir.0.join("other"));
    let err = lib2
        .import(&first, &cancel, &mut |_, _| {})
        .expect_err("missing part");
    assert!(
        err.to_string().contains("smol-00002-of-00003.gguf"),
        "{err}"
    );
    assert!(!lib_dir.0.join("other").join("smol").exists());
}

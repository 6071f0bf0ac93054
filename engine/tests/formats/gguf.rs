//! The GGUF reader against broken and hostile files: each is refused with an error that names
//! the problem, without panicking and without allocating what the file merely claims.

use std::io::Write;
use std::path::{Path, PathBuf};

use tpslab_engine::formats::gguf::{GgufError, GgufFile};
use tpslab_engine::library::ensure_default_model;

use crate::temp_dir;
use temp_dir::TempDir;

/// A minimal GGUF writer for building test files byte by byte.
#[derive(Default)]
struct W(Vec<u8>);

impl W {
    fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str(self, s: &str) -> Self {
        let mut w = self.u64(s.len() as u64);
        w.0.extend_from_slice(s.as_bytes());
        w
    }
    fn raw(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> Self {
        W::default()
            .raw(b"GGUF")
            .u32(version)
            .u64(n_tensors)
            .u64(n_kv)
    }
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).expect("create test file");
    f.write_all(bytes).expect("write test file");
    p
}

fn open_err(path: &Path) -> (GgufError, String) {
    match GgufFile::open(path) {
        Ok(_) => panic!("{} was accepted", path.display()),
        Err(e) => {
            let msg = e.to_string();
            (e, msg)
        }
    }
}

/// A valid one-tensor file: metadata `general.architecture = llama`, one F32 tensor of 8 floats.
fn tiny_valid() -> Vec<u8> {
    let mut w = W::header(3, 1, 1)
        .str("general.architecture")
        .u32(8)
        .str("llama")
        .str("t")
        .u32(1)
        .u64(8)
        .u32(0)
        .u64(0);
    while !w.0.len().is_multiple_of(32) {
        w.0.push(0);
    }
    w.raw(&[0u8; 32]).0
}

#[test]
fn tiny_valid_file_opens_and_reads() {
    let d = TempDir::new("gguf-valid");
    let p = write(&d, "ok.gguf", &tiny_valid());
    let f = GgufFile::open(&p).expect("valid file");
    assert_eq!(f.get_str("general.architecture").expect("arch"), "llama");
    let t = f.tensor("t").expect("tensor");
    assert_eq!(f.read_tensor(t).expect("data").len(), 32);
}

#[test]
fn missing_and_empty_files() {
    let d = TempDir::new("gguf-empty");
    let (e, msg) = open_err(&d.join("nope.gguf"));
    assert!(matches!(e, GgufError::Open { .. }), "{msg}");
    let (e, msg) = open_err(&write(&d, "empty.gguf", b""));
    assert!(matches!(e, GgufError::Empty { .. }), "{msg}");
    assert!(msg.contains("empty"), "{msg}");
}

#[test]
fn wrong_magic_is_refused() {
    let d = TempDir::new("gguf-magic");
    let (e, msg) = open_err(&write(
        &d,
        "m.gguf",
        b"PK\x03\x04 this is a zip, not a model",
    ));
    assert!(matches!(e, GgufError::BadMagic { .. }), "{msg}");
    let (e, _) = open_err(&write(&d, "short.gguf", b"GG"));
    assert!(matches!(e, GgufError::BadMagic { .. }));
}

#[test]
fn unsupported_versions_are_refused_by_number() {
    let d = TempDir::new("gguf-version");
    for v in [0u32, 1, 4, 0xffff_ffff] {
        let mut bytes = tiny_valid();
        bytes[4..8].copy_from_slice(&v.to_le_bytes());
        let (e, msg) = open_err(&write(&d, &format!("v{v}.gguf"), &bytes));
        assert!(
            matches!(e, GgufError::Version { version, .. } if version == v),
            "{msg}"
        );
        assert!(msg.contains(&v.to_string()), "{msg}");
    }
}

#[test]
fn truncated_header_is_refused() {
    let d = TempDir::new("gguf-trunc-header");
    let full = tiny_valid();
    for n in [5usize, 8, 12, 20, 30] {
        let (e, msg) = open_err(&write(&d, &format!("t{n}.gguf"), &full[..n]));
        assert!(
            matches!(e, GgufError::Truncated { .. }),
            "cut at {n}: {msg}"
        );
    }
}

#[test]
fn absurd_counts_are_refused_before_allocation() {
    let d = TempDir::new("gguf-counts");
    let (e, msg) = open_err(&write(&d, "kv.gguf", &W::header(3, 0, u64::MAX).0));
    assert!(matches!(e, GgufError::Truncated { .. }), "{msg}");
    let (e, msg) = open_err(&write(&d, "tensors.gguf", &W::header(3, 1 << 60, 0).0));
    assert!(matches!(e, GgufError::Truncated { .. }), "{msg}");
    // An array claiming 2^62 items of u64.
    let arr = W::header(3, 0, 1).str("a").u32(9).u32(10).u64(1 << 62).0;
    let (e, msg) = open_err(&write(&d, "array.gguf", &arr));
    assert!(matches!(e, GgufError::Truncated { .. }), "{msg}");
}

#[test]
fn absurd_string_lengths_are_refused() {
    let d = TempDir::new("gguf-strings");
    // Key length of 2^63.
    let key = W::header(3, 0, 1).u64(1 << 63).raw(b"abc").0;
    let (e, msg) = open_err(&write(&d, "key.gguf", &key));
    assert!(matches!(e, GgufError::Truncated { .. }), "{msg}");
    // String value longer than the file.
    let val = W::header(3, 0, 1)
        .str("k")
        .u32(8)
        .u64(1_000_000)
        .raw(b"short")
        .0;
    let (e, msg) = open_err(&write(&d, "val.gguf", &val));
    assert!(matches!(e, GgufError::Truncated { .. }), "{msg}");
}

#[test]
fn bad_tensor_entries_are_refused() {
    let d = TempDir::new("gguf-tensors");
    let tensor = |dims: &[u64], ty: u32, off: u64| {
        let mut w = W::header(3, 1, 0).str("t").u32(dims.len() as u32);
        for &x in dims {
            w = w.u64(x);
        }
        w.u32(ty).u64(off).raw(&[0u8; 64]).0
    };
    let (e, msg) = open_err(&write(&d, "type.gguf", &tensor(&[8], 99, 0)));
    assert!(
        matches!(e, GgufError::UnknownTensorType { type_id: 99, .. }),
        "{msg}"
    );
    let (e, msg) = open_err(&write(&d, "rank.gguf", &tensor(&[1, 1, 1, 1, 1], 0, 0)));
    assert!(matches!(e, GgufError::Corrupt { .. }), "{msg}");
    let (e, msg) = open_err(&write(
        &d,
        "overflow.gguf",
        &tensor(&[1 << 40, 1 << 40], 0, 0),
    ));
    assert!(matches!(e, GgufError::Corrupt { .. }), "{msg}");
    let (e, msg) = open_err(&write(&d, "huge.gguf", &tensor(&[1 << 30], 0, 0)));
    assert!(matches!(e, GgufError::Truncated { .. }), "{msg}");
    let (e, msg) = open_err(&write(&d, "offset.gguf", &tensor(&[8], 0, u64::MAX - 31)));
    assert!(
        matches!(e, GgufError::Truncated { .. } | GgufError::Corrupt { .. }),
        "{msg}"
    );
    // A Q4_0 tensor whose row is not a whole number of 32-element blocks.
    let (e, msg) = open_err(&write(&d, "block.gguf", &tensor(&[33], 2, 0)));
    assert!(matches!(e, GgufError::Corrupt { .. }), "{msg}");
}

#[test]
fn real_model_cut_short_is_refused_at_each_stage() {
    let model = ensure_default_model(&mut |m| eprintln!("{m}")).expect("default model");
    let bytes = std::fs::read(&model).expect("read model");
    let ok = GgufFile::open(&model).expect("the real model opens");
    assert_eq!(ok.tensors.len(), 272);
    let d = TempDir::new("gguf-real");
    // Inside the metadata (vocabulary), inside the tensor table, inside the tensor data.
    for cut in [
        64usize,
        600_000,
        ok.data_offset as usize - 100,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let (e, msg) = open_err(&write(&d, "cut.gguf", &bytes[..cut]));
        assert!(
            matches!(e, GgufError::Truncated { .. }),
            "cut at {cut}: {msg}"
        );
    }
}

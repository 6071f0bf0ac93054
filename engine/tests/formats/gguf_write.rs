//! The GGUF writer against our reader: every metadata value type, alignment, and the default
//! model's own metadata and tensors read back unchanged.

use std::path::PathBuf;

use tpslab_engine::formats::gguf::{GgufFile, Value};
use tpslab_engine::formats::gguf_write::{GgufWriteError, GgufWriter, TensorDesc, write_gguf};
use tpslab_engine::library::ensure_default_model;
use tpslab_kernels::WType;

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpslab-gguf-write-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d.join(name)
}

fn write_file(
    name: &str,
    metadata: &[(String, Value)],
    tensors: &[(TensorDesc, Vec<u8>)],
) -> PathBuf {
    let path = tmp(name);
    let f = std::fs::File::create(&path).expect("create");
    write_gguf(std::io::BufWriter::new(f), metadata, tensors).expect("write");
    path
}

#[test]
fn every_value_type_and_tensor_reads_back() {
    let metadata: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String("llama".into())),
        ("u8".into(), Value::U8(200)),
        ("i8".into(), Value::I8(-100)),
        ("u16".into(), Value::U16(60_000)),
        ("i16".into(), Value::I16(-30_000)),
        ("u32".into(), Value::U32(4_000_000_000)),
        ("i32".into(), Value::I32(-2_000_000_000)),
        ("u64".into(), Value::U64(u64::MAX - 1)),
        ("i64".into(), Value::I64(i64::MIN + 1)),
        ("f32".into(), Value::F32(-1.25e-3)),
        ("f64".into(), Value::F64(std::f64::consts::PI)),
        ("bool".into(), Value::Bool(true)),
        ("string.utf8".into(), Value::String("héllo ✓ \n\t".into())),
        ("string.empty".into(), Value::String(String::new())),
        (
            "array.str".into(),
            Value::Array(vec![Value::String("a".into()), Value::String("bc".into())]),
        ),
        (
            "array.f32".into(),
            Value::Array(vec![Value::F32(1.0), Value::F32(-2.5)]),
        ),
        (
            "array.nested".into(),
            Value::Array(vec![
                Value::Array(vec![Value::I32(1), Value::I32(2)]),
                Value::Array(vec![Value::I32(3)]),
            ]),
        ),
        ("array.empty".into(), Value::Array(vec![])),
        ("general.alignment".into(), Value::U32(64)),
    ];
    let t = |name: &str, dims: Vec<u64>, ty: WType| {
        let d = TensorDesc::new(name, dims, ty);
        let data: Vec<u8> = (0..d.size())
            .map(|i| (i * 7 + name.len() as u64) as u8)
            .collect();
        (d, data)
    };
    let tensors = vec![
        t("a", vec![3], WType::F32),
        t("b", vec![64, 3], WType::Q8_0),
        t("c", vec![256, 2], WType::Q4K),
        t("d", vec![5, 1, 1], WType::F16),
    ];
    let path = write_file("all.gguf", &metadata, &tensors);
    let f = GgufFile::open(&path).expect("read back");
    assert_eq!(f.version, 3);
    assert_eq!(f.metadata.len(), metadata.len());
    for (k, v) in &metadata {
        assert_eq!(f.get(k), Some(v), "metadata '{k}'");
    }
    assert_eq!(f.data_offset % 64, 0);
    assert_eq!(f.tensors.len(), tensors.len());
    for ((d, data), info) in tensors.iter().zip(&f.tensors) {
        assert_eq!(info.name, d.name);
        assert_eq!(info.dims, d.dims);
        assert_eq!(info.ty, d.ty);
        assert_eq!(info.offset % 64, 0, "{} aligned", d.name);
        assert_eq!(&f.read_tensor(info).expect("tensor"), data, "{}", d.name);
    }
}

#[test]
fn invalid_input_is_refused() {
    let sink = Vec::new();
    let dup = vec![
        ("k".to_string(), Value::U8(1)),
        ("k".to_string(), Value::U8(2)),
    ];
    assert!(matches!(
        GgufWriter::new(sink.clone(), &dup, vec![]),
        Err(GgufWriteError::Invalid(_))
    ));
    let mixed = vec![(
        "k".to_string(),
        Value::Array(vec![Value::U8(1), Value::String("x".into())]),
    )];
    assert!(GgufWriter::new(sink.clone(), &mixed, vec![]).is_err());
    let bad_block = vec![TensorDesc::new("t", vec![100], WType::Q4_0)];
    assert!(GgufWriter::new(sink.clone(), &[], bad_block).is_err());
    let mut w = GgufWriter::new(sink, &[], vec![TensorDesc::new("t", vec![4], WType::F32)])
        .expect("header");
    assert!(w.write_tensor(&[0; 15]).is_err(), "wrong size refused");
    assert!(
        w.write_tensor(&[0; 16]).is_ok(),
        "right size accepted after a refusal"
    );
    assert!(w.write_tensor(&[0; 16]).is_err(), "no tensor left");
    let w = GgufWriter::new(
        Vec::new(),
        &[],
        vec![TensorDesc::new("t", vec![4], WType::F32)],
    )
    .expect("header");
    assert!(w.finish().is_err(), "unwritten tensor refused");
}

/// The default model's metadata (tokenizer, chat template and all) and a few of its tensors,
/// written and read back: the same values, bytes, shapes and types.
#[test]
fn default_model_metadata_and_tensors_round_trip() {
    let src = ensure_default_model(&mut |m| eprintln!("{m}")).expect("model");
    let f = GgufFile::open(&src).expect("open");
    let metadata: Vec<(String, Value)> = f
        .metadata
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let picked: Vec<(TensorDesc, Vec<u8>)> = f
        .tensors
        .iter()
        .filter(|t| {
            t.name == "token_embd.weight"
                || t.name == "output_norm.weight"
                || t.name.starts_with("blk.0.")
        })
        .map(|t| {
            (
                TensorDesc::new(t.name.clone(), t.dims.clone(), t.ty),
                f.read_tensor(t).expect("tensor"),
            )
        })
        .collect();
    assert!(picked.len() >= 9, "{} tensors picked", picked.len());
    let path = write_file("default.gguf", &metadata, &picked);
    let g = GgufFile::open(&path).expect("read back");
    assert_eq!(g.metadata, f.metadata);
    assert!(g.get("tokenizer.chat_template").is_some());
    for (d, data) in &picked {
        let info = g.tensor(&d.name).expect("tensor present");
        assert_eq!((&info.dims, info.ty), (&d.dims, d.ty));
        assert_eq!(&g.read_tensor(info).expect("bytes"), data, "{}", d.name);
    }
    let _ = std::fs::remove_file(&path);
}

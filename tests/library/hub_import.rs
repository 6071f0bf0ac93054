//! The library admits only models the engine can load, whether imported by path or pulled from
//! a Hub on 127.0.0.1: a GGUF without tensors or of an unknown architecture, a file that is not
//! a GGUF, a safetensors set without config.json, of an unknown model type or without tensors
//! are each refused before they enter the library, with a message saying why; an import also
//! reads the headers as the engine loads them (a Llama config over tensors that are not one).

use crate::hub_fixtures;
use crate::hub_server;
use crate::tiny_model;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use hub_fixtures::{TempDir, assert_no_model, cfg, default_model, pull, req, tiny_safetensors};
use hub_server::{File, HubServer, RepoData};
use tpslab::hub::{Choice, PullRequest};
use tpslab_engine::formats::gguf::{GgufFile, Value};
use tpslab_engine::formats::gguf_write::{TensorDesc, write_gguf};
use tpslab_engine::library::index::Library;

/// The default model's metadata with `general.architecture` set to `arch`, and its first
/// `n_tensors` tensors.
fn gguf_with(arch: &str, n_tensors: usize) -> Vec<u8> {
    let src = GgufFile::open(default_model()).expect("open");
    let md: Vec<(String, Value)> = src
        .metadata
        .iter()
        .map(|(k, v)| match k.as_str() {
            "general.architecture" => (k.clone(), Value::String(arch.into())),
            _ => (k.clone(), v.clone()),
        })
        .collect();
    let tensors: Vec<(TensorDesc, Vec<u8>)> = src.tensors[..n_tensors]
        .iter()
        .map(|t| {
            let d = TensorDesc::new(t.name.clone(), t.dims.clone(), t.ty);
            (d, src.read_tensor(t).expect("read"))
        })
        .collect();
    write_gguf(Vec::new(), &md, &tensors).expect("write")
}

fn st_set(config: &str, weights: Vec<u8>) -> Files {
    vec![
        ("config.json", config.as_bytes().to_vec()),
        ("tokenizer.json", b"{\"model\":{}}".to_vec()),
        ("model.safetensors", weights),
    ]
}

/// A safetensors file with no tensors at all.
fn empty_safetensors() -> Vec<u8> {
    let header = b"{}";
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header);
    v
}

const LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"max_position_embeddings":64}"#;

/// A model's files: (name, bytes).
type Files = Vec<(&'static str, Vec<u8>)>;

/// The broken models, each with what its refusal must say.
fn broken() -> Vec<(&'static str, Files, &'static str)> {
    vec![
        (
            "no-tensors",
            vec![("no-tensors.gguf", gguf_with("llama", 0))],
            "it holds no tensors",
        ),
        (
            "gpt2",
            vec![("gpt2.gguf", gguf_with("gpt2", 2))],
            "unsupported model architecture 'gpt2'",
        ),
        (
            "not-gguf",
            vec![("not-gguf.gguf", b"GGUF? no, just text".to_vec())],
            "is not a usable model",
        ),
        (
            "st-no-config",
            st_set(LLAMA, tiny_safetensors())[1..].to_vec(),
            "no config.json",
        ),
        (
            "st-gpt2",
            st_set(r#"{"model_type":"gpt2"}"#, tiny_safetensors()),
            "unsupported model architecture 'gpt2'",
        ),
        (
            "st-empty",
            st_set(LLAMA, empty_safetensors()),
            "it holds no tensors",
        ),
    ]
}

#[test]
fn import_refuses_what_the_engine_cannot_load() {
    let home = TempDir::new("import-checks");
    let lib = Library::at(home.0.join("models"));
    for (name, files, why) in broken() {
        let src = home.0.join("src").join(name);
        let path = if let [(f, bytes)] = files.as_slice() {
            std::fs::create_dir_all(&src).expect("mkdir");
            let p = src.join(f);
            std::fs::write(&p, bytes).expect("write");
            p
        } else {
            std::fs::create_dir_all(&src).expect("mkdir");
            for (f, bytes) in &files {
                std::fs::write(src.join(f), bytes).expect("write");
            }
            src
        };
        let e = lib
            .import(&path, &AtomicBool::new(false), &mut |_, _| {})
            .expect_err(name)
            .to_string();
        assert!(e.contains(why), "{name}: {e}");
        assert!(
            e.contains(&path.display().to_string()),
            "{name} names the file: {e}"
        );
        assert!(!lib.root().join(name).exists());
    }
    // A Llama config and tokenizer over a tensor that is not a Llama's: its headers say so.
    let fake = home.0.join("src/fake");
    tiny_model::tiny_folder(&fake);
    std::fs::write(fake.join("model.safetensors"), tiny_safetensors()).expect("write");
    let e = lib
        .import(&fake, &AtomicBool::new(false), &mut |_, _| {})
        .expect_err("not a model")
        .to_string();
    assert!(
        e.contains("its tensors are not a LlamaForCausalLM model"),
        "{e}"
    );
    assert!(lib.list().expect("list").0.is_empty());
    // What the engine loads still goes in.
    let ok = home.0.join("src/ok");
    tiny_model::tiny_folder(&ok);
    lib.import(&ok, &AtomicBool::new(false), &mut |_, _| {})
        .expect("a loadable set imports");
}

#[test]
fn pull_refuses_what_the_engine_cannot_load() {
    let s = HubServer::start();
    for (name, files, _) in broken() {
        let files = files
            .into_iter()
            .map(|(f, bytes)| File::new(f, Arc::new(bytes), f.ends_with(".safetensors")))
            .collect();
        s.add(
            &format!("evil/{name}"),
            RepoData {
                files,
                ..RepoData::default()
            },
        );
    }
    let home = TempDir::new("pull-checks");
    let lib = Library::at(home.0.join("models"));
    for (name, files, why) in broken() {
        let choice = match files.as_slice() {
            [(f, _)] => Choice::File((*f).to_string()),
            _ => Choice::Auto,
        };
        let r = PullRequest {
            choice,
            ..req(&format!("evil/{name}"))
        };
        let e = pull(&cfg(&s), &lib, &r, &AtomicBool::new(false))
            .0
            .expect_err(name)
            .to_string();
        // A set without config.json is not a safetensors model to the listing already.
        let why = if name == "st-no-config" {
            "no GGUF file and no safetensors model"
        } else {
            why
        };
        assert!(e.contains(why), "{name}: {e}");
        assert_no_model(&lib);
        assert!(!Path::new(&lib.root().join(name)).exists());
    }
}

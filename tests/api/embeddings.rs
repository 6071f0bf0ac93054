//! `POST /v1/embeddings` as clients see it, held against llama-server's vectors
//! (tests/data/embed_refs.json, recorded by tests/reference/make_embed_refs.py): the official
//! OpenAI Python client on a tiny Qwen3 (the shape of Qwen3-Embedding) pooled `last`; the
//! default model pooled `mean` while a chat streams beside it (the engine batches both); and
//! what a hostile or careless client sends, refused by name.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::http_client::*;
use crate::llamacpp;
use crate::openai_python::{run, venv};

const REFS: &str = include_str!("../data/embed_refs.json");

fn text(r: &Resp) -> String {
    String::from_utf8_lossy(&r.body).into_owned()
}

fn refs() -> Value {
    serde_json::from_str(REFS).expect("embed_refs.json")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .expect("a list of numbers")
        .iter()
        .map(|x| x.as_f64().expect("a number"))
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// A folder removed when dropped.
struct Tmp(std::path::PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn the_official_client_gets_llama_cpps_last_token_embeddings() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let python = venv(&root.join("tests/python/requirements.txt"));
    let tmp = Tmp(std::env::temp_dir().join(format!("tpslab-embed-{}", std::process::id())));
    std::fs::create_dir_all(&tmp.0).expect("temp folder");
    let path = tmp.0.join("qwen3-embed.gguf");
    let tokenizer =
        tpslab_engine::model::tiny::tokenizer_of(&llamacpp::vocab("qwen2")).expect("vocabulary");
    tpslab_engine::model::tiny::write_tiny_f32("qwen3", &tokenizer, &path).expect("tiny model");
    let model = path.to_string_lossy().into_owned();
    let server = ServeProcess::start(&["--model", &model, "--pooling", "last"], &[], loopback);
    let out = run(Command::new(python)
        .arg(root.join("tests/python/openai_embed_check.py"))
        .arg(format!("http://{}/v1", server.addr()))
        .arg("qwen3-embed")
        .arg(root.join("tests/data/embed_refs.json"))
        .arg("qwen3"))
    .unwrap_or_else(|e| panic!("{e}\n{}", server.log()));
    eprintln!("{out}");
    assert!(out.contains("all checks passed"), "{out}");
}

#[test]
fn mean_pooled_embeddings_match_llama_cpp_while_a_chat_streams_beside_them() {
    let refs = refs();
    let want = &refs["models"]["default"];
    assert_eq!(want["pooling"], "mean");
    let server = ServeProcess::start(&["--model", "default", "--pooling", "mean"], &[], loopback);
    let addr = server.addr();
    // A chat answer streaming while the embeddings run: the engine batches them together.
    let chat = std::thread::spawn(move || {
        post(
            addr,
            "/v1/chat/completions",
            &chat_body(json!({"max_tokens": 48, "stream": true, "ignore_eos": true})),
        )
    });
    let r = post(
        addr,
        "/v1/embeddings",
        &json!({"input": refs["inputs"], "model": serve_model_id()}),
    );
    assert_eq!(r.status, 200, "{}", text(&r));
    let body = r.json();
    assert_eq!(body["object"], "list");
    let data = body["data"].as_array().expect("data");
    assert_eq!(data.len(), 4);
    for (i, d) in data.iter().enumerate() {
        assert_eq!(d["index"], i);
        assert_eq!(d["object"], "embedding");
        let got = floats(&d["embedding"]);
        let c = cosine(&got, &floats(&want["vectors"][i]));
        // The 4-bit model's final states part from llama.cpp's by its activations' 8-bit
        // rounding, compounded over 30 layers: 0.99926-0.99999 here, last-token pooling
        // alike (0.99967-0.99999); on F32 weights (the Python check) they agree to 1e-4.
        assert!(c >= 0.999, "input {i}: cosine {c} against llama.cpp");
        for j in (0..4).filter(|&j| j != i) {
            let other = cosine(&got, &floats(&want["vectors"][j]));
            assert!(
                other < c - 0.01,
                "input {i} is as near input {j}'s vector ({other})"
            );
        }
        let norm: f64 = got.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "input {i}: length {norm}");
    }
    let tokens: usize = want["tokens"]
        .as_array()
        .expect("tokens")
        .iter()
        .map(|t| t.as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(body["usage"]["prompt_tokens"], tokens);
    let chat = chat.join().expect("chat thread");
    assert_eq!(chat.status, 200);
    assert!(text(&chat).contains("[DONE]"), "{}", text(&chat));
}

#[test]
fn bad_embedding_requests_are_refused_by_name() {
    let addr = shared();
    let long = "word ".repeat(9000);
    let many: Vec<&str> = vec!["x"; 2049];
    let cases: Vec<(Value, u16, &str)> = vec![
        (json!({"input": []}), 400, "input"),
        (json!({"input": [1, "a"]}), 400, "input"),
        (json!({"input": [[]]}), 400, "input"),
        (json!({"input": [-1]}), 400, "input"),
        (json!({"input": {"text": "x"}}), 400, "input"),
        (json!({"input": many}), 400, "input"),
        (json!({"input": "x", "dimensions": 3}), 400, "dimensions"),
        (
            json!({"input": "x", "encoding_format": "int8"}),
            400,
            "encoding_format",
        ),
    ];
    for (body, status, param) in cases {
        let r = post(addr, "/v1/embeddings", &body);
        let shown = body.to_string();
        let shown = &shown[..shown.len().min(80)];
        assert_eq!(r.status, status, "{shown}: {}", text(&r));
        assert_eq!(r.error()["param"], param, "{shown}: {}", text(&r));
    }
    // A token id outside the vocabulary, an input past the context, another model's name.
    let r = post(
        addr,
        "/v1/embeddings",
        &json!({"input": [[4_000_000_000u32]]}),
    );
    assert_eq!(r.status, 400, "{}", text(&r));
    assert!(text(&r).contains("vocabulary"), "{}", text(&r));
    let r = post(addr, "/v1/embeddings", &json!({"input": long}));
    assert_eq!(r.status, 400, "{}", text(&r));
    assert_eq!(r.error()["code"], "context_length_exceeded", "{}", text(&r));
    let r = post(
        addr,
        "/v1/embeddings",
        &json!({"input": "x", "model": "no-such-model"}),
    );
    assert_eq!(r.status, 404, "{}", text(&r));
    // The server still answers: nothing above stalled or broke the engine.
    let r = post(addr, "/v1/embeddings", &json!({"input": ["a", "b"]}));
    assert_eq!(r.status, 200, "{}", text(&r));
    assert_eq!(r.json()["data"].as_array().map(Vec::len), Some(2));
}

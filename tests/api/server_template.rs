//! Copies of the default model with other metadata, behind the real server over loopback.
//! A chat template that runs away: each chat request is a 400 naming the model and the limit
//! within seconds, the blocking worker it used is freed (more runaway requests than workers
//! still get their answers), and the same server goes on answering completions and
//! `/v1/models` meanwhile. FIM tokens named: `suffix` and `/infill` build llama-server's
//! fill-in-the-middle prompt; without them, a 400 saying why.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tpslab::serve;
use tpslab::serve::limits::Limits;
use tpslab_engine::formats::gguf::Value;
use tpslab_engine::model::LoadedModel;

use crate::http_client;
use crate::runaway;
use http_client::{chat_body, post, request, serve_model, serve_model_with};

/// The default model with `template` as its chat template, loaded, behind a server of its own.
fn server_with_template(dir: &std::path::Path, template: &str) -> (serve::RunningServer, String) {
    let path = runaway::model_with_template(dir, template, "Runaway Served");
    serve_model(Arc::new(LoadedModel::load(&path).expect("load")))
}

#[test]
fn a_runaway_template_is_a_400_and_the_server_goes_on() {
    let dir = std::env::temp_dir().join(format!("tpslab-serve-runaway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (server, model_id) = server_with_template(&dir, runaway::NESTED_LOOPS);
    let addr = server.addr;
    // More runaway requests at once than the server has blocking workers (one per core, at
    // least 2), and a completion among them.
    let start = Instant::now();
    let chats: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(move || post(addr, "/v1/chat/completions", &chat_body(json!({}))))
        })
        .collect();
    let completion = std::thread::spawn(move || {
        post(
            addr,
            "/v1/completions",
            &json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}),
        )
    });
    for c in chats {
        let r = c.join().expect("chat thread");
        assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
        let msg = r.error()["message"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains("Runaway Served") && msg.contains("ran past its budget"),
            "{msg}"
        );
    }
    // Generous: four renders of ~1 s each on two workers, on a loaded machine.
    assert!(
        start.elapsed() < Duration::from_secs(60),
        "{:?}",
        start.elapsed()
    );
    let c = completion.join().expect("completion thread");
    assert_eq!(c.status, 200, "{}", String::from_utf8_lossy(&c.body));
    assert!(c.json()["choices"][0]["text"].is_string());
    let m = request(addr, "GET", "/v1/models", &[], b"");
    assert_eq!(m.status, 200);
    assert_eq!(m.json()["data"][0]["id"], model_id);
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The default model with FIM tokens named in its metadata (three of its unused special
/// tokens, as a converter writes `tokenizer.ggml.fim_*_token_id` for a code model).
fn model_with_fim(dir: &std::path::Path) -> (Arc<LoadedModel>, [u32; 3]) {
    let default = tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}"))
        .expect("default model");
    let tok = &http_client::model().tokenizer;
    let ids = ["<issue_start>", "<issue_comment>", "<issue_closed>"]
        .map(|t| tok.token_to_id(t).expect("special token"));
    let path = dir.join("fim.gguf");
    let keys = ["fim_pre_token_id", "fim_suf_token_id", "fim_mid_token_id"];
    let meta: Vec<(String, Value)> = keys
        .iter()
        .zip(ids)
        .map(|(k, id)| (format!("tokenizer.ggml.{k}"), Value::U32(id)))
        .collect();
    tpslab_engine::formats::gguf_write::copy_with_metadata(&default, &path, &meta)
        .expect("copy the default model with FIM tokens");
    (Arc::new(LoadedModel::load(&path).expect("load")), ids)
}

/// `suffix` on `/v1/completions` and llama-server's `/infill` build llama.cpp's
/// `format_infill` prompt (the repository token and name, then prefix, suffix and middle
/// tokens around the texts; `input_extra` as snippets), token for token as the prompt's
/// log-probabilities name them; both answer the same greedy text.
#[test]
fn fill_in_the_middle_builds_llama_server_prompt() {
    let dir = std::env::temp_dir().join(format!("tpslab-serve-fim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let (lm, [pre, suf, mid]) = model_with_fim(&dir);
    let tok = lm.tokenizer.clone();
    let (server, _) = serve_model(Arc::clone(&lm));
    let addr = server.addr;
    let (prefix, suffix) = ("def add(a, b):\n    return", "\n\nprint(add(1, 2))\n");
    let enc = |t: &str| tok.encode(t, false).expect("tokens");
    let rep = tok.token_to_id("<reponame>").expect("repo token");
    let mut want = vec![rep];
    want.extend(enc("myproject\n"));
    want.extend(tok.add_bos().then(|| tok.bos_id()).flatten());
    want.push(pre);
    want.extend(enc(prefix));
    want.push(suf);
    want.extend(enc(suffix));
    want.push(mid);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": prefix, "suffix": suffix, "max_tokens": 3, "temperature": 0,
                "prompt_logprobs": 0}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["usage"]["prompt_tokens"], want.len());
    let scored: Vec<u32> = v["choices"][0]["prompt_logprobs"]
        .as_array()
        .expect("prompt_logprobs")
        .iter()
        .skip(1)
        .map(|pos| {
            let keys: Vec<&String> = pos.as_object().expect("position").keys().collect();
            keys[0].parse().expect("token id")
        })
        .collect();
    assert_eq!(scored, want[1..], "the prompt after its first token");
    let text = v["choices"][0]["text"].as_str().expect("text");
    let r = post(
        addr,
        "/infill",
        &json!({"input_prefix": prefix, "input_suffix": suffix, "n_predict": 3,
                "temperature": 0}),
    );
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let i = r.json();
    assert_eq!(i["content"], text, "{i}");
    assert_eq!(i["tokens_evaluated"], want.len());
    assert_eq!(i["tokens_predicted"], v["usage"]["completion_tokens"]);
    // Extra context goes before the prefix, as snippets (this vocabulary has no file token).
    let extra = json!([{"filename": "util.py", "text": "x = 1\n"}]);
    let r = post(
        addr,
        "/infill",
        &json!({"input_prefix": prefix, "input_suffix": suffix, "input_extra": extra,
                "max_tokens": 1}),
    );
    let snippet = enc("\n\n--- snippet ---\n\n").len() + enc("x = 1\n").len();
    assert_eq!(r.json()["tokens_evaluated"], want.len() + snippet);
    drop(server);
    // A context under llama-server's batch of 2048 leaves no room for the repository lines.
    let limits = Limits {
        ctx_size: Some(1024),
        default_max_tokens: Some(3),
        ..http_client::test_limits()
    };
    let (server, _) = serve_model_with(Arc::clone(&lm), limits);
    let body = json!({"input_prefix": prefix, "input_suffix": suffix, "temperature": 0});
    let r = post(server.addr, "/infill", &body).json();
    let repo = 1 + enc("myproject\n").len();
    assert_eq!(r["tokens_evaluated"], want.len() - repo, "{r}");
    assert!(
        r["tokens_predicted"].as_u64().is_some_and(|n| n <= 3),
        "-n 3: {r}"
    );
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model without FIM tokens (the default one) says so, as a 400 on the field that asked;
/// `/infill` refuses what it cannot answer.
#[test]
fn fill_in_the_middle_needs_fim_tokens() {
    let addr = http_client::shared();
    let cases = [
        (
            "/v1/completions",
            json!({"prompt": "a", "suffix": "b"}),
            "suffix",
            "fill in the middle",
        ),
        (
            "/infill",
            json!({"input_prefix": "a", "input_suffix": "b"}),
            "input_prefix",
            "FIM",
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2], "suffix": "b"}),
            "suffix",
            "token ids",
        ),
        (
            "/infill",
            json!({"input_suffix": "b"}),
            "input_prefix",
            "input_prefix",
        ),
        (
            "/infill",
            json!({"input_prefix": "a", "stream": true}),
            "stream",
            "/v1/completions",
        ),
        (
            "/infill",
            json!({"input_prefix": 7}),
            "input_prefix",
            "string",
        ),
        (
            "/infill",
            json!({"input_prefix": "a", "input_extra": [3]}),
            "input_extra",
            "filename",
        ),
    ];
    for (path, body, param, says) in cases {
        let r = post(addr, path, &body);
        assert_eq!(
            r.status,
            400,
            "{body}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let e = r.error();
        assert_eq!(e["param"], param, "{e}");
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(says)),
            "{e}"
        );
    }
}

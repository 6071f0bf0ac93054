//! A model whose chat template runs away, behind the real server over loopback: each chat
//! request is a 400 naming the model and the limit within seconds, the blocking worker it used is
//! freed (more runaway requests than workers still get their answers), and the same server goes
//! on answering completions and `/v1/models` meanwhile.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tpslab::serve;
use tpslab_engine::model::LoadedModel;

#[path = "support/http_client.rs"]
mod http_client;
#[path = "support/runaway.rs"]
mod runaway;
use http_client::{chat_body, post, request, serve_model};

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

//! A model whose chat template runs away, behind the real server over loopback: each chat
//! request is a 400 naming the model and the limit within seconds, the blocking worker it used is
//! freed (more runaway requests than workers still get their answers), and the same server goes
//! on answering completions and `/v1/models` meanwhile.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tpslab::serve::{self, ServerState};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};

#[path = "support/http_client.rs"]
mod http_client;
#[path = "support/runaway.rs"]
mod runaway;
use http_client::{chat_body, post, request, test_limits};

/// The default model with `template` as its chat template, loaded, behind a server of its own.
fn server_with_template(dir: &std::path::Path, template: &str) -> (serve::RunningServer, String) {
    let path = runaway::model_with_template(dir, template, "Runaway Served");
    let lm = Arc::new(LoadedModel::load(&path).expect("load"));
    let mut knobs = Knobs::default();
    knobs.kv.budget_bytes = 64 << 20;
    let config = EngineConfig {
        threads: 2,
        knobs,
        device: DeviceChoice::Cpu,
        gpu_kv_fraction: 0.0,
    };
    let engine = EngineHandle::start(Arc::clone(&lm), config, None).expect("engine");
    let mut state = ServerState::new(engine, lm, None);
    state.limits = test_limits();
    let id = state.model_id.clone();
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    (serve::spawn(Arc::new(state), addr).expect("server"), id)
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

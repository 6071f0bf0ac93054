//! The server's limits over real HTTP on loopback with the real default model: a client that
//! dribbles its headers or stalls its body is cut off while others are served, idle keep-alive
//! connections close, connections past the cap wait while the others are busy, every request cap is a 400 naming the
//! parameter and its limit, `/metrics` sits behind the key, token ids the model lacks are
//! refused alone, `max_tokens` omitted means "as much as fits", a 4 MiB prompt does not
//! hold up a short request, and `tpslab serve`'s `-c`, `-n`, `--parallel` and `--kv-budget-mb`
//! hold.

use std::io::{ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tpslab::serve::limits::Limits;
use tpslab_engine::kv::{KvType, KvTypes};
use tpslab_engine::serving::engine::{Event, RefusalKind, Request};

use crate::http_client;
use http_client::*;

fn quick_timeouts() -> Limits {
    Limits {
        header_timeout: Duration::from_secs(1),
        body_timeout: Duration::from_secs(1),
        idle_timeout: Duration::from_secs(1),
        ..test_limits()
    }
}

fn models_ok(addr: SocketAddr) {
    let r = request(addr, "GET", "/v1/models", &[], b"");
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

/// Reads until the server closes (Ok) or `limit` passes (Err).
fn read_until_closed(s: &mut std::net::TcpStream, limit: Duration) -> Result<Vec<u8>, String> {
    let t0 = Instant::now();
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while t0.elapsed() < limit {
        match s.read(&mut buf) {
            Ok(0) => return Ok(got),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(_) => return Ok(got),
        }
    }
    Err(format!(
        "still open after {limit:?}; got {:?}",
        String::from_utf8_lossy(&got)
    ))
}

#[test]
fn a_client_dribbling_its_headers_is_cut_off_while_another_is_served() {
    let server = start_with(engine(2, None), None, quick_timeouts(), false);
    let addr = server.addr;
    let slow = std::thread::spawn(move || {
        let mut s = connect(addr);
        let head = b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nX-Slow: aaaaaaaaaaaaaaaaa";
        let t0 = Instant::now();
        for &b in head.iter() {
            if s.write_all(&[b]).is_err() {
                break;
            }
            // The server closing shows up as a read of 0 (or a reset) between the bytes.
            s.set_read_timeout(Some(Duration::from_millis(1000)))
                .expect("timeout");
            let mut buf = [0u8; 256];
            match s.read(&mut buf) {
                Ok(_) => break,
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        t0.elapsed()
    });
    // Served meanwhile, more than once.
    for _ in 0..3 {
        models_ok(addr);
        std::thread::sleep(Duration::from_millis(200));
    }
    let took = slow.join().expect("slow client");
    assert!(
        took < Duration::from_secs(10),
        "a one-byte-a-second client was kept for {took:?}"
    );
    models_ok(addr);
}

#[test]
fn a_stalled_body_gets_408_and_the_connection_closes() {
    let server = start_with(engine(2, None), None, quick_timeouts(), false);
    let mut s = connect(server.addr);
    s.write_all(
        b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
          Content-Length: 100\r\n\r\n{\"prompt\": ",
    )
    .expect("write");
    let raw = read_until_closed(&mut s, Duration::from_secs(10)).expect("closed");
    let r = parse(&raw);
    assert_eq!(r.status, 408, "{}", String::from_utf8_lossy(&r.body));
    assert!(
        r.error()["message"]
            .as_str()
            .expect("message")
            .contains("did not arrive")
    );
    models_ok(server.addr);
}

/// One response of a kept-alive connection, read by its Content-Length.
fn read_one(s: &mut std::net::TcpStream) -> Resp {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        if let Some(end) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&raw[..end]).to_ascii_lowercase();
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .expect("content-length");
            if raw.len() >= end + 4 + len {
                return parse(&raw[..end + 4 + len]);
            }
        }
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "closed mid-response");
        raw.extend_from_slice(&buf[..n]);
    }
}

#[test]
fn an_idle_kept_alive_connection_is_closed() {
    let server = start_with(engine(2, None), None, quick_timeouts(), false);
    let mut s = connect(server.addr);
    let keep = [("Connection", "keep-alive")];
    // Two requests on one connection: it is kept alive between them.
    for _ in 0..2 {
        send(&mut s, "GET", "/v1/models", &keep, b"");
        assert_eq!(read_one(&mut s).status, 200);
    }
    let t0 = Instant::now();
    read_until_closed(&mut s, Duration::from_secs(10)).expect("idle connection closed");
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "closed too early"
    );
    models_ok(server.addr);
}

#[test]
fn connections_past_the_cap_wait_for_a_free_slot() {
    let limits = Limits {
        max_connections: 2,
        ..test_limits()
    };
    let server = start_with(engine(2, None), None, limits, false);
    // Two connections busy sending a request head: not idle, so nobody may evict them.
    let holders: Vec<_> = (0..2)
        .map(|_| {
            let mut s = connect(server.addr);
            s.write_all(b"GET /v1/models HTTP/1.1\r\n").expect("head");
            s
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    // Accepted but not served while both slots are held.
    let mut third = connect(server.addr);
    send(&mut third, "GET", "/v1/models", &[], b"");
    third
        .set_read_timeout(Some(Duration::from_millis(1500)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    match third.read(&mut buf) {
        Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
        other => panic!("a connection past the cap was served: {other:?}"),
    }
    drop(holders);
    let raw = read_until_closed(&mut third, Duration::from_secs(10)).expect("answered");
    assert_eq!(parse(&raw).status, 200);
}

fn over_cap(r: &Resp, param: &str, names: &str) {
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
    let e = r.error();
    assert_eq!(e["param"], param, "{e}");
    let msg = e["message"].as_str().expect("message");
    assert!(msg.contains(names), "{msg:?} should name {names:?}");
}

#[test]
fn every_request_cap_is_a_400_naming_the_parameter_and_the_limit() {
    let addr = shared();
    let chat = "/v1/chat/completions";
    let l = Limits::default();
    let stops: Vec<String> = (0..10_000).map(|i| format!("s{i}")).collect();
    let r = post(addr, chat, &chat_body(json!({ "stop": stops })));
    over_cap(&r, "stop", &l.max_stop.to_string());
    assert_eq!(r.error()["code"], "limit_exceeded");
    let long = "x".repeat(l.max_stop_bytes + 1);
    over_cap(
        &post(addr, chat, &chat_body(json!({ "stop": [long] }))),
        "stop",
        &l.max_stop_bytes.to_string(),
    );
    over_cap(
        &post(addr, chat, &chat_body(json!({"n": l.max_n + 1}))),
        "n",
        &l.max_n.to_string(),
    );
    let ctx = model().model.cfg.context_len;
    over_cap(
        &post(addr, chat, &chat_body(json!({"max_tokens": ctx + 1}))),
        "max_tokens",
        &ctx.to_string(),
    );
    let bias: serde_json::Map<String, Value> = (0..=l.max_logit_bias)
        .map(|i| (i.to_string(), json!(1)))
        .collect();
    over_cap(
        &post(addr, chat, &chat_body(json!({ "logit_bias": bias }))),
        "logit_bias",
        &l.max_logit_bias.to_string(),
    );
    over_cap(
        &post(addr, chat, &chat_body(json!({"logit_bias": {"5": 101}}))),
        "logit_bias",
        "[-100, 100]",
    );
    over_cap(
        &post(
            addr,
            chat,
            &chat_body(json!({"logit_bias": {"99999999": 1}})),
        ),
        "logit_bias",
        "not a token id",
    );
    let ok = post(
        addr,
        chat,
        &chat_body(json!({"logit_bias": {"5": 0}, "stop": ["s1", "s2"]})),
    );
    assert_eq!(ok.status, 200, "{}", String::from_utf8_lossy(&ok.body));
}

#[test]
fn the_prompt_is_capped_in_bytes_before_tokenizing() {
    let limits = Limits {
        max_body_bytes: 4 << 20,
        max_prompt_bytes: 1 << 20,
        ..Limits::default()
    };
    let server = start_with(engine(2, None), None, limits, false);
    let big = "hello ".repeat((2 << 20) / 6);
    let r = post(server.addr, "/v1/completions", &json!({"prompt": big}));
    over_cap(&r, "prompt", &(1 << 20).to_string());
    let msgs = json!([{"role": "user", "content": big}]);
    let r = post(
        server.addr,
        "/v1/chat/completions",
        &json!({"messages": msgs}),
    );
    over_cap(&r, "messages", "--max-prompt-bytes");
}

#[test]
fn no_api_client_outranks_the_window_chat_and_the_range_is_the_operators() {
    let addr = shared();
    let r = post(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"priority": -1})),
    );
    over_cap(&r, "priority", "0 to");
    let ok = post(
        addr,
        "/v1/chat/completions",
        &chat_body(json!({"priority": 0})),
    );
    assert_eq!(ok.status, 200);

    let limits = Limits {
        min_priority: 1,
        max_priority: 10,
        ..test_limits()
    };
    let server = start_with(engine(2, None), None, limits, false);
    let body = |p: i64| chat_body(json!({ "priority": p, "max_tokens": 2 }));
    over_cap(
        &post(server.addr, "/v1/chat/completions", &body(11)),
        "priority",
        "1 to 10",
    );
    over_cap(
        &post(server.addr, "/v1/chat/completions", &body(0)),
        "priority",
        "1 to 10",
    );
    assert_eq!(
        post(server.addr, "/v1/chat/completions", &body(5)).status,
        200
    );
}

#[test]
fn token_ids_the_model_lacks_are_refused_alone() {
    let eng = engine(4, None);
    let server = start(eng.clone(), None);
    let addr = server.addr;
    let vocab = model().model.cfg.vocab as u64;
    let good = json!({"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": true,
                      "temperature": 0});
    let bad = json!({"prompt": [1, 2, vocab + 7], "max_tokens": 8});
    let replies: Vec<Resp> = std::thread::scope(|sc| {
        let hs: Vec<_> = [&good, &bad, &good]
            .into_iter()
            .map(|b| sc.spawn(move || post(addr, "/v1/completions", b)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    for r in [&replies[0], &replies[2]] {
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
        assert_eq!(r.json()["usage"]["completion_tokens"], 8);
    }
    assert_eq!(replies[1].status, 400);
    let e = replies[1].error();
    assert_eq!(e["param"], "prompt");
    assert!(
        e["message"]
            .as_str()
            .expect("msg")
            .contains(&vocab.to_string())
    );

    // Straight into the engine (the window's and the CLI's way in): refused at submit while a
    // request already running goes on to its end.
    let prompt = model().raw_prompt("Once upon a time").expect("prompt");
    let (tx, rx) = mpsc::channel();
    let mut stop = model().default_stop(Some(12));
    stop.ignore_eos = true;
    let running = eng.submit(
        Request {
            prompt: prompt.clone(),
            stop,
            ..Request::default()
        },
        tx.clone(),
    );
    let mut oov = prompt;
    oov.push(u32::MAX);
    let refused = eng.submit(
        Request {
            prompt: oov,
            ..Request::default()
        },
        tx,
    );
    let (mut finished, mut was_refused) = (false, false);
    while !(finished && was_refused) {
        match rx.recv_timeout(Duration::from_secs(60)).expect("events") {
            Event::Refused { id, reason } => {
                let (kind, reason) = (reason.kind(), reason.to_string());
                assert_eq!(id, refused, "{reason}");
                assert_eq!(kind, RefusalKind::Invalid);
                assert!(
                    reason.contains("outside the model's vocabulary"),
                    "{reason}"
                );
                was_refused = true;
            }
            Event::Finished { id, usage, .. } => {
                assert_eq!(id, running);
                assert_eq!(usage.completion_tokens, 12);
                finished = true;
            }
            _ => {}
        }
    }
}

#[test]
fn max_tokens_omitted_is_as_much_as_fits_the_kv_pool() {
    let cfg = &model().model.cfg;
    let blocks = 6;
    let kv_bytes = KvTypes::F16.bytes_per_block(cfg, 16) * blocks;
    let eng = engine_with_kv(2, None, kv_bytes);
    let capacity = eng.stats().kv_total_blocks * 16;
    assert!(
        capacity < cfg.context_len,
        "the pool ({capacity} tokens) must be smaller than the context ({})",
        cfg.context_len
    );
    let server = start(eng, None);
    let prompt = model().raw_prompt("Once upon a time").expect("prompt");
    let body = json!({"prompt": "Once upon a time", "ignore_eos": true, "temperature": 0});
    let r = post(server.addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64(),
        Some((capacity + 1 - prompt.len()) as u64),
        "every token the pool holds, plus the last one sampled"
    );
    // A chat without max_tokens answers too (and ends at its end-of-turn token).
    let mut chat = chat_body(json!({}));
    chat.as_object_mut().expect("object").remove("max_tokens");
    let r = post(server.addr, "/v1/chat/completions", &chat);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn metrics_need_the_key_unless_opened() {
    let key = [("Authorization", "Bearer sesame")];
    let server = start(engine(2, None), Some("sesame"));
    let r = request(server.addr, "GET", "/metrics", &[], b"");
    assert_eq!(r.status, 401);
    assert_eq!(r.error()["code"], "invalid_api_key");
    let wrong = [("Authorization", "Bearer sesame-but-longer")];
    assert_eq!(
        request(server.addr, "GET", "/metrics", &wrong, b"").status,
        401
    );
    let r = request(server.addr, "GET", "/metrics", &key, b"");
    assert_eq!(r.status, 200);
    assert!(String::from_utf8_lossy(&r.body).contains("tpslab:num_requests_running"));

    let open = start_with(engine(2, None), Some("sesame"), test_limits(), true);
    assert_eq!(request(open.addr, "GET", "/metrics", &[], b"").status, 200);
    assert_eq!(
        request(open.addr, "GET", "/v1/models", &[], b"").status,
        401
    );
}

#[test]
fn a_4_mib_prompt_does_not_hold_up_a_short_request() {
    let limits = Limits {
        max_body_bytes: 8 << 20,
        max_prompt_bytes: 8 << 20,
        ..Limits::default()
    };
    let server = start_with(engine(2, None), None, limits, false);
    let addr = server.addr;
    let big = std::thread::spawn(move || {
        let text = "hello world ".repeat((4 << 20) / 12);
        post(
            addr,
            "/v1/completions",
            &json!({"prompt": text, "max_tokens": 4}),
        )
    });
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let body = json!({"prompt": "Hi", "max_tokens": 4, "ignore_eos": true, "temperature": 0});
    let short = post(addr, "/v1/completions", &body);
    assert_eq!(
        short.status,
        200,
        "{}",
        String::from_utf8_lossy(&short.body)
    );
    assert!(t0.elapsed() < Duration::from_secs(60), "{:?}", t0.elapsed());
    let big = big.join().expect("big client");
    assert_eq!(big.status, 400, "{}", String::from_utf8_lossy(&big.body));
    assert_eq!(big.error()["code"], "context_length_exceeded");
}

/// `tpslab serve -c 96 -n 5 --parallel 3 --kv-budget-mb 8 -ctk q8_0` (the real binary): a
/// request that names no `max_tokens` gets 5, prompt + `max_tokens` past 96 is
/// `context_length_exceeded`, and the KV pool (8 MiB in blocks of 16, q8_0 keys and f16 values)
/// and the batch cap are stated alike on stderr and in /metrics.
#[test]
fn serve_holds_the_context_answer_length_and_pool_it_is_given() {
    let args = [
        "-m",
        "default",
        "-t",
        "2",
        "-c",
        "96",
        "-n",
        "5",
        "--parallel",
        "3",
        "--kv-budget-mb",
        "8",
        "-ctk",
        "q8_0",
    ];
    let srv = ServeProcess::start(&args, &[], loopback);
    let addr = srv.addr();
    let complete = |max_tokens: Option<u32>| {
        let mut b = json!({"prompt": "The capital of France is", "temperature": 0,
                           "ignore_eos": true});
        if let Some(m) = max_tokens {
            b["max_tokens"] = json!(m);
        }
        post(addr, "/v1/completions", &b)
    };
    let r = complete(None);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.json()["usage"]["completion_tokens"], 5, "-n 5");
    // Five prompt tokens and 95 to generate do not fit 96; 60 do.
    let r = complete(Some(95));
    assert_eq!(r.status, 400);
    let e = r.error();
    assert_eq!(e["code"], "context_length_exceeded", "{e}");
    assert!(
        e["message"]
            .as_str()
            .is_some_and(|m| m.contains("--ctx-size")),
        "{e}"
    );
    assert_eq!(complete(Some(60)).json()["usage"]["completion_tokens"], 60);
    let models = request(addr, "GET", "/v1/models", &[], b"").json();
    assert_eq!(models["data"][0]["max_model_len"], 96);
    let types = KvTypes {
        k: KvType::Q8_0,
        v: KvType::F16,
    };
    let blocks = (types.pool_for_budget(&model().model.cfg, 16, 8 << 20)).expect("blocks");
    assert!(
        blocks
            > KvTypes::F16
                .pool_for_budget(&model().model.cfg, 16, 8 << 20)
                .expect("f16")
    );
    let text = String::from_utf8(request(addr, "GET", "/metrics", &[], b"").body).expect("utf8");
    let gauge = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("tpslab:{name}{{")))
            .and_then(|l| l.rsplit_once(' '))
            .and_then(|(_, v)| v.parse::<f64>().ok())
    };
    assert_eq!(
        gauge("kv_cache_capacity_tokens"),
        Some((blocks * 16) as f64)
    );
    assert_eq!(gauge("max_num_seqs"), Some(3.0));
    let log = srv.log();
    let said = format!(
        "KV pool: {} tokens ({blocks} blocks of 16, K q8_0, V f16), up to 3 sequences",
        blocks * 16
    );
    assert!(log.contains(&said), "{log}");
}

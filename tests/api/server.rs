//! `tpslab serve` over real HTTP on loopback, with the real default model: chat and completions,
//! whole and streamed, usage, stop strings, cancellation on disconnect, every error status, 429
//! under a burst, the API key and the Prometheus metrics. The client is a plain HTTP/1.1 one over
//! `TcpStream`, so what is tested is the bytes on the wire.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tpslab_engine::serving::engine::EngineHandle;

use crate::http_client;
use http_client::*;

#[test]
fn chat_whole_and_streamed_agree_with_usage() {
    let addr = shared();
    let whole = post(addr, "/v1/chat/completions", &chat_body(json!({})));
    assert_eq!(
        whole.status,
        200,
        "{}",
        String::from_utf8_lossy(&whole.body)
    );
    let v = whole.json();
    assert_eq!(v["object"], "chat.completion");
    let text = v["choices"][0]["message"]["content"]
        .as_str()
        .expect("content");
    assert!(text.contains("Paris"), "{text}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    let prompt = model()
        .chat_prompt(&[tpslab_engine::text::chat::ChatMessage::user(CHAT_QUESTION)])
        .expect("prompt");
    let u = &v["usage"];
    assert_eq!(u["prompt_tokens"], prompt.len());
    let done = u["completion_tokens"].as_u64().expect("completion_tokens");
    assert!((1..=12).contains(&done), "{u}");
    assert_eq!(u["total_tokens"].as_u64(), Some(prompt.len() as u64 + done));

    let body = chat_body(json!({"stream": true, "stream_options": {"include_usage": true}}));
    let streamed = post(addr, "/v1/chat/completions", &body);
    assert_eq!(streamed.status, 200);
    assert_eq!(streamed.header("content-type"), Some("text/event-stream"));
    let events = streamed.events();
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).expect("chunk JSON"))
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let mut joined = String::new();
    for c in &chunks {
        assert_eq!(c["object"], "chat.completion.chunk");
        if let Some(t) = c["choices"][0]["delta"]["content"].as_str() {
            joined.push_str(t);
        }
    }
    assert_eq!(joined, text, "greedy: streamed text = whole text");
    let last_choice = &chunks[chunks.len() - 2]["choices"][0];
    assert_eq!(
        last_choice["finish_reason"],
        v["choices"][0]["finish_reason"]
    );
    let usage = chunks.last().expect("usage chunk");
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"], *u, "streamed usage = whole usage");
}

#[test]
fn completion_usage_counts_tokens_and_length_finish() {
    let addr = shared();
    let body = json!({"prompt": "The capital of France is", "max_tokens": 7, "temperature": 0,
                      "ignore_eos": true, "model": serve_model_id()});
    let r = post(addr, "/v1/completions", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let v = r.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 7);
    let prompt = model()
        .raw_prompt("The capital of France is")
        .expect("prompt");
    assert_eq!(v["usage"]["prompt_tokens"], prompt.len());
    // Streamed: one chunk per token that made text, the usage chunk counts all seven.
    let mut sb = body.clone();
    sb["stream"] = json!(true);
    sb["stream_options"] = json!({"include_usage": true});
    let s = post(addr, "/v1/completions", &sb);
    let ev = s.events();
    let usage: Value = serde_json::from_str(&ev[ev.len() - 2]).expect("usage chunk");
    assert_eq!(usage["usage"]["completion_tokens"], 7);
    let text: String = ev[..ev.len() - 2]
        .iter()
        .map(|e| serde_json::from_str::<Value>(e).expect("chunk"))
        .filter_map(|c| c["choices"][0]["text"].as_str().map(String::from))
        .collect();
    assert_eq!(text, v["choices"][0]["text"].as_str().expect("text"));
}

#[test]
fn stop_strings_cut_the_output() {
    let addr = shared();
    let base = json!({"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0});
    let free = post(addr, "/v1/completions", &base).json();
    let text = free["choices"][0]["text"]
        .as_str()
        .expect("text")
        .to_string();
    // Stop at the second word of the greedy output.
    let word = text
        .split_whitespace()
        .nth(1)
        .expect("two words")
        .to_string();
    let cut = &text[..text.find(&word).expect("word")];
    for stop in [json!(word), json!(["zzzz", word])] {
        let mut b = base.clone();
        b["stop"] = stop;
        let v = post(addr, "/v1/completions", &b).json();
        assert_eq!(v["choices"][0]["text"], cut, "{text:?} stopped at {word:?}");
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
}

fn wait_idle(engine: &EngineHandle, aborted: u64) {
    let t0 = Instant::now();
    loop {
        let s = engine.stats();
        if s.kv_used_blocks == 0 && s.running == 0 && s.live.counters.requests_aborted >= aborted {
            return;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "not cancelled: {} KV blocks used, {} running, {} aborted",
            s.kv_used_blocks,
            s.running,
            s.live.counters.requests_aborted
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// As real clients send it: the server must notice the hang-up mid-request all the same.
const KEEP_ALIVE: &[(&str, &str)] = &[("Connection", "keep-alive")];

/// A kept-alive connection with a completion request sent on it (the response is left unread).
fn open_completion(addr: SocketAddr, body: &Value) -> TcpStream {
    let mut s = connect(addr);
    send(
        &mut s,
        "POST",
        "/v1/completions",
        KEEP_ALIVE,
        body.to_string().as_bytes(),
    );
    s
}

#[test]
fn a_client_that_disconnects_cancels_its_request() {
    let eng = engine(4, None);
    let server = start(eng.clone(), None);
    // Long enough that it would run for many seconds if not cancelled.
    let body = json!({"prompt": "Once upon a time", "max_tokens": 1000, "ignore_eos": true,
                      "temperature": 0, "stream": true});
    let mut s = open_completion(server.addr, &body);
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while seen.windows(6).filter(|w| w == b"data: ").count() < 3 {
        let n = s.read(&mut buf).expect("read");
        assert!(n > 0, "stream ended early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(s);
    wait_idle(&eng, 1);

    // The same for a whole (non-streamed) response: the handler is dropped with the connection.
    let mut body = body;
    body["stream"] = json!(false);
    let before = eng.stats().live.counters.generation_tokens_total;
    let s = open_completion(server.addr, &body);
    let t0 = Instant::now();
    while eng.stats().live.counters.generation_tokens_total < before + 3 {
        assert!(t0.elapsed() < Duration::from_secs(30), "never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(s);
    wait_idle(&eng, 2);
}

#[test]
fn bad_requests_get_openai_errors_with_their_status() {
    let addr = shared();
    let chat = "/v1/chat/completions";
    let r = request(addr, "POST", chat, &[], b"{\"messages\": [");
    assert_eq!(r.status, 400);
    assert!(
        r.error()["message"]
            .as_str()
            .expect("msg")
            .contains("not valid JSON")
    );

    let r = post(addr, chat, &json!({"messages": "hello"}));
    assert_eq!(r.status, 422);
    assert_eq!(r.error()["param"], "messages");
    let r = post(addr, chat, &chat_body(json!({"temperature": "hot"})));
    assert_eq!(r.status, 422);
    assert_eq!(r.error()["param"], "temperature");
    let r = post(addr, chat, &json!({"temperature": 0}));
    assert_eq!(r.status, 422, "missing messages");

    let r = post(addr, chat, &chat_body(json!({"temperature": -1})));
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "temperature");
    let r = post(addr, chat, &chat_body(json!({"n": 0})));
    assert_eq!(r.status, 400);
    assert_eq!(r.error()["param"], "n");

    let r = post(addr, chat, &chat_body(json!({"model": "gpt-17"})));
    assert_eq!(r.status, 404);
    let e = r.error();
    assert_eq!(e["code"], "model_not_found");
    assert!(e["message"].as_str().expect("msg").contains("gpt-17"));

    let ctx = model().model.cfg.context_len;
    let long = "hello ".repeat(ctx + 16);
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": long, "max_tokens": 4}),
    );
    assert_eq!(r.status, 400);
    let e = r.error();
    assert_eq!(e["code"], "context_length_exceeded");
    assert!(
        e["message"]
            .as_str()
            .expect("msg")
            .contains(&ctx.to_string())
    );

    let big = format!("{{\"prompt\": \"{}\"}}", "a".repeat(BODY_LIMIT + 1));
    let r = request(addr, "POST", "/v1/completions", &[], big.as_bytes());
    assert_eq!(r.status, 413);
    r.error();

    let r = request(addr, "GET", "/v1/nothing", &[], b"");
    assert_eq!(r.status, 404);
    r.error();
    // The server is still there.
    assert_eq!(request(addr, "GET", "/v1/models", &[], b"").status, 200);
}

#[test]
fn api_key_is_required_when_set() {
    let server = start(engine(2, None), Some("sesame"));
    let models = |h: &[(&str, &str)]| request(server.addr, "GET", "/v1/models", h, b"");
    let r = models(&[]);
    assert_eq!(r.status, 401);
    assert_eq!(r.error()["code"], "invalid_api_key");
    assert_eq!(models(&[("Authorization", "Bearer nope")]).status, 401);
    let ok = models(&[("Authorization", "Bearer sesame")]);
    assert_eq!(ok.status, 200);
    assert_eq!(ok.json()["data"][0]["id"], serve_model_id());
}

#[test]
fn a_burst_past_the_queue_limit_gets_429_then_the_server_answers() {
    let server = start(engine(1, Some(1)), None);
    let addr = server.addr;
    let body = json!({"prompt": "Hello", "max_tokens": 16, "ignore_eos": true, "temperature": 0});
    let replies: Vec<Resp> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..8)
            .map(|_| sc.spawn(|| post(addr, "/v1/completions", &body)))
            .collect();
        hs.into_iter().map(|h| h.join().expect("thread")).collect()
    });
    let busy: Vec<&Resp> = replies.iter().filter(|r| r.status == 429).collect();
    let ok = replies.iter().filter(|r| r.status == 200).count();
    assert!(
        !busy.is_empty(),
        "no 429 in {:?}",
        replies.iter().map(|r| r.status).collect::<Vec<_>>()
    );
    assert!(ok >= 1);
    assert_eq!(ok + busy.len(), 8);
    for r in busy {
        assert!(r.header("retry-after").is_some());
        assert_eq!(r.error()["code"], "rate_limit_exceeded");
    }
    assert_eq!(post(addr, "/v1/completions", &body).status, 200);
}

/// `name{labels} value` lines: each value parses, each sample belongs to a family declared by a
/// `# TYPE` line (histograms by their `_bucket`/`_sum`/`_count` series), and the named one is
/// returned (summed over labels).
fn metric(text: &str, name: &str) -> f64 {
    let declared: Vec<(&str, &str)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .map(|l| l.split_once(' ').expect("# TYPE name kind"))
        .collect();
    let mut sum = 0.0;
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let (key, value) = line.rsplit_once(' ').expect("name value");
        let v: f64 = value
            .parse()
            .unwrap_or_else(|_| panic!("bad value in {line}"));
        let n = key.split('{').next().expect("name");
        let family_ok = declared.iter().any(|&(f, kind)| match kind {
            "histogram" => {
                [f, "_bucket"].concat() == n
                    || [f, "_sum"].concat() == n
                    || [f, "_count"].concat() == n
            }
            _ => f == n,
        });
        assert!(family_ok, "sample {n} has no # TYPE line for its family");
        if n == name {
            sum += v;
        }
    }
    sum
}

#[test]
fn metrics_count_the_requests_made() {
    let server = start(engine(2, None), None);
    let mut generated = 0;
    let mut prompt = 0;
    // The same long prompt twice: the second finds the first one's full KV blocks cached.
    let text = "One two three four five six seven eight nine ten. ".repeat(8);
    for max in [3, 5] {
        let body = json!({"prompt": text, "max_tokens": max, "ignore_eos": true, "temperature": 0});
        let v = post(server.addr, "/v1/completions", &body).json();
        generated += v["usage"]["completion_tokens"].as_u64().expect("usage");
        prompt += v["usage"]["prompt_tokens"].as_u64().expect("usage");
    }
    let r = request(server.addr, "GET", "/metrics", &[], b"");
    assert_eq!(r.status, 200);
    let text = String::from_utf8(r.body).expect("utf8");
    assert_eq!(
        metric(&text, "tpslab:generation_tokens_total"),
        generated as f64
    );
    assert_eq!(metric(&text, "tpslab:prompt_tokens_total"), prompt as f64);
    assert_eq!(metric(&text, "tpslab:request_success_total"), 2.0);
    assert_eq!(
        metric(&text, "tpslab:time_to_first_token_seconds_count"),
        2.0
    );
    assert_eq!(
        metric(&text, "tpslab:e2e_request_latency_seconds_count"),
        2.0
    );
    assert_eq!(
        metric(&text, "tpslab:inter_token_latency_seconds_count"),
        (generated - 2) as f64
    );
    assert_eq!(
        metric(&text, "tpslab:request_queue_time_seconds_count"),
        2.0
    );
    let queries = metric(&text, "tpslab:prefix_cache_queries_total");
    let hits = metric(&text, "tpslab:prefix_cache_hits_total");
    assert!(
        queries >= prompt as f64,
        "{queries} queries for {prompt} prompt tokens"
    );
    assert!(
        hits > 0.0 && hits < prompt as f64 / 2.0 + 1.0,
        "{hits} hits: the second prompt should hit the first one's blocks"
    );
    assert!(text.contains("tpslab:kv_cache_usage_perc{"));
    // The gauges come from the engine's snapshot, published just after the last event went out.
    let t0 = Instant::now();
    loop {
        let r = request(server.addr, "GET", "/metrics", &[], b"");
        let text = String::from_utf8(r.body).expect("utf8");
        if metric(&text, "tpslab:num_requests_running") == 0.0 {
            assert_eq!(metric(&text, "tpslab:kv_cache_usage_perc"), 0.0);
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(5),
            "still running: {text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A server whose engine speculates (n-gram lookup) counts it under vLLM's spec-decode names,
/// with the time spent proposing and verifying, and the per-position acceptances summing to the
/// accepted tokens.
#[test]
fn metrics_count_speculation_and_its_time() {
    use tpslab_engine::serving::engine::{EngineConfig, Knobs};
    use tpslab_engine::spec::{SpecConfig, SpecMethod};
    let mut knobs = Knobs::default();
    knobs.kv.budget_bytes = 64 << 20;
    knobs.spec = SpecConfig {
        method: SpecMethod::Ngram,
        // Every proposal verified: this test counts them.
        payoff: false,
        ..SpecConfig::default()
    };
    let config = EngineConfig {
        threads: 2,
        knobs,
        ..EngineConfig::default()
    };
    let server = start(
        EngineHandle::start(model(), config, None).expect("engine"),
        None,
    );
    // Copy-heavy: the passage, then its start again, so lookup finds what comes next.
    let passage = "The quick brown fox jumps over the lazy dog near the quiet river bank. ";
    let body = json!({
        "prompt": format!("{}Repeat: {}", passage.repeat(3), &passage[..30]),
        "max_tokens": 24,
        "ignore_eos": true,
        "temperature": 0,
    });
    post(server.addr, "/v1/completions", &body).json();
    // The counters come from the engine's snapshot, published just after the last event.
    let t0 = Instant::now();
    let text = loop {
        let r = request(server.addr, "GET", "/metrics", &[], b"");
        let text = String::from_utf8(r.body).expect("utf8");
        if metric(&text, "tpslab:num_requests_running") == 0.0 || t0.elapsed().as_secs() > 5 {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let drafts = metric(&text, "tpslab:spec_decode_num_drafts_total");
    let proposed = metric(&text, "tpslab:spec_decode_num_draft_tokens_total");
    let accepted = metric(&text, "tpslab:spec_decode_num_accepted_tokens_total");
    assert!(drafts > 0.0 && proposed >= drafts, "{text}");
    assert!(accepted > 0.0 && accepted <= proposed, "{text}");
    assert!(metric(&text, "tpslab:spec_decode_propose_seconds_total") > 0.0);
    assert!(metric(&text, "tpslab:spec_decode_verify_seconds_total") > 0.0);
    assert_eq!(
        metric(
            &text,
            "tpslab:spec_decode_num_accepted_tokens_per_pos_total"
        ),
        accepted
    );
}

/// `tpslab bench --endpoint URL --prompt-len 24 --output-len 6 EXTRA...`, run to the end.
fn bench_endpoint(url: &str, extra: &[&str]) -> std::process::Output {
    let mut args = vec![
        "bench",
        "--endpoint",
        url,
        "--prompt-len",
        "24",
        "--output-len",
        "6",
    ];
    args.extend_from_slice(extra);
    std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(&args)
        .env_remove("TPSLAB_API_KEY")
        .output()
        .expect("run tpslab")
}

/// `tpslab bench --endpoint` with `--json-schema` and `--tools` runs each level again with
/// structured-output and tool requests, beside the plain one.
#[test]
fn bench_endpoint_sends_structured_and_tool_requests() {
    let server = start(engine(4, None), None);
    let url = format!("http://{}/v1", server.addr);
    let dir = std::env::temp_dir().join(format!("tpslab-bench-tools-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json_path = dir.join("remote.json");
    let bench = |extra: &[&str]| bench_endpoint(&url, extra);
    // Structured output and tool requests, each level again beside the plain one.
    let schema = dir.join("schema.json");
    let schema_json = json!({"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]});
    std::fs::write(&schema, schema_json.to_string()).expect("schema");
    let tools = dir.join("tools.json");
    let tools_json = json!([{"type": "function", "function": {"name": "lookup",
        "parameters": schema_json}}]);
    std::fs::write(&tools, tools_json.to_string()).expect("tools");
    let out = bench(&[
        "--concurrency",
        "1",
        "--num-requests",
        "2",
        "--json-schema",
        schema.to_str().expect("utf8 path"),
        "--tools",
        tools.to_str().expect("utf8 path"),
        "--json",
        json_path.to_str().expect("utf8 path"),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("with tools"), "{stdout}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("report")).expect("json");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 3, "{report}");
    assert!(
        runs[1]["json_schema"].is_string() && runs[2]["tools"].is_string(),
        "{report}"
    );
    for r in runs {
        assert_eq!(r["completed"], 2, "{r}");
        assert_eq!(r["refused"], 0, "{r}");
        assert_eq!(r["total_output_tokens"], 12, "{r}");
    }

    let _ = std::fs::remove_dir_all(&dir);
}

/// `tpslab bench --endpoint` drives this server over HTTP: every request completes with the
/// asked lengths (counted from the server's usage), figures are client-side, and a wrong model
/// name or an unreachable endpoint fails at once with a clear line.
#[test]
fn bench_endpoint_drives_the_server() {
    let server = start(engine(4, None), None);
    let url = format!("http://{}/v1", server.addr);
    let dir = std::env::temp_dir().join(format!("tpslab-bench-endpoint-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let json_path = dir.join("remote.json");
    let bench = |extra: &[&str]| bench_endpoint(&url, extra);
    let out = bench(&[
        "--concurrency",
        "1,3",
        "--num-requests",
        "3",
        "--goodput",
        "ttft:600000",
        "e2el:600000",
        "--json",
        json_path.to_str().expect("utf8 path"),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(&json_path).expect("report")).expect("json");
    assert!(
        report["device"]
            .as_str()
            .expect("device")
            .starts_with("remote http://127.0.0.1:")
    );
    // The remote server's precision is not known: "", as these reports have always said.
    assert_eq!(report["precision"], "");
    let runs = report["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for r in runs {
        assert_eq!(r["completed"], 3, "{r}");
        assert_eq!(r["refused"], 0, "{r}");
        assert_eq!(r["total_output_tokens"], 18, "{r}");
        assert_eq!(r["total_input_tokens"], 72, "{r}");
        assert!(r["mean_ttft_ms"].as_f64().expect("ttft") > 0.0, "{r}");
        assert!(r["output_throughput"].as_f64().expect("tput") > 0.0, "{r}");
        // Objectives of ten minutes: every request meets them.
        assert_eq!(r["request_goodput"], r["request_throughput"], "{r}");
    }

    let out = bench(&["--concurrency", "1", "--model", "no-such-model"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("does not serve a model named \"no-such-model\""),
        "{stderr}"
    );

    // A port nothing listens on (bound, then released).
    let free = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let dead = format!("http://{}", free.local_addr().expect("addr"));
    drop(free);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"))
        .args(["bench", "--endpoint", &dead, "--concurrency", "1"])
        .output()
        .expect("run tpslab");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("cannot reach"), "{stderr}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `tpslab serve` as llama-server's users start it (the real binary): `-m`, `-t`, `--host
/// localhost`, the key in a file, two `--alias`es: health open, the key the file's first line
/// (trimmed), the model listed, retrieved and accepted under each alias, other names refused.
#[test]
fn serve_answers_health_and_names_as_llama_server_users_expect() {
    let dir = std::env::temp_dir().join(format!("tpslab-serve-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let key = dir.join("api.key");
    std::fs::write(&key, "  sesame \nnot-the-key\n").expect("key file");
    let key = key.to_str().expect("utf8");
    let args = [
        "--model",
        "default",
        "--threads",
        "2",
        "--host",
        "localhost",
        "--api-key-file",
        key,
    ];
    let aliases = ["--alias", "smol", "--alias", "org/smol-v2"];
    let srv = ServeProcess::start(&[&args[..], &aliases].concat(), &[], loopback);
    let addr = srv.addr();
    let get = |path: &str, h: &[(&str, &str)]| request(addr, "GET", path, h, b"");
    let auth = [("Authorization", "Bearer sesame")];
    for path in ["/health", "/v1/health"] {
        let r = get(path, &[]);
        assert_eq!(r.status, 200, "{path}");
        assert_eq!(r.json(), json!({"status": "ok"}));
    }
    assert_eq!(get("/v1/models", &[]).status, 401);
    let wrong = [("Authorization", "Bearer not-the-key")];
    assert_eq!(get("/v1/models", &wrong).status, 401);
    let list = get("/v1/models", &auth).json();
    let ids: Vec<&str> = list["data"]
        .as_array()
        .expect("data")
        .iter()
        .map(|m| m["id"].as_str().expect("id"))
        .collect();
    let stem = serve_model_id();
    assert_eq!(ids, [stem.as_str(), "smol", "org/smol-v2"]);
    for id in ids {
        let r = get(&format!("/v1/models/{id}"), &auth);
        assert_eq!(r.status, 200, "{id}");
        let v = r.json();
        assert_eq!(
            (v["id"].as_str(), v["object"].as_str()),
            (Some(id), Some("model"))
        );
    }
    let r = get("/v1/models/no-such-model", &auth);
    assert_eq!(r.status, 404);
    assert_eq!(r.error()["code"], "model_not_found");
    assert_eq!(get("/v1/models/no-such-model", &[]).status, 401);
    let r = get("/v1/models/%FF%FE", &auth);
    assert_eq!(
        (r.status, r.error()["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let complete = |model: &str| {
        let body = json!({"prompt": "The capital of France is", "max_tokens": 2, "model": model});
        request(
            addr,
            "POST",
            "/v1/completions",
            &auth,
            body.to_string().as_bytes(),
        )
    };
    assert_eq!(complete("org/smol-v2").status, 200);
    let r = complete("no-such-model");
    assert_eq!(r.status, 404);
    assert_eq!(r.error()["code"], "model_not_found");
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--host ::` listens on IPv6, and the key comes from `TPSLAB_API_KEY` when no flag gives one.
#[test]
fn serve_listens_on_ipv6_with_the_key_from_the_environment() {
    let v6 = |port| SocketAddr::from(([0u16, 0, 0, 0, 0, 0, 0, 1], port));
    let srv = ServeProcess::start(
        &["--model", "default", "--threads", "2", "--host", "::"],
        &[("TPSLAB_API_KEY", "from-env")],
        v6,
    );
    let addr = v6(srv.port);
    assert_eq!(request(addr, "GET", "/v1/models", &[], b"").status, 401);
    let r = request(
        addr,
        "GET",
        "/v1/models",
        &[("Authorization", "Bearer from-env")],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["data"][0]["id"], serve_model_id());
    assert_eq!(request(addr, "GET", "/health", &[], b"").status, 200);
    assert!(
        srv.log().contains(&format!("http://[::]:{}/v1", srv.port)),
        "{}",
        srv.log()
    );
}

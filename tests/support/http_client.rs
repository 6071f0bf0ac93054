//! The HTTP side of the server tests: the real default model, engines of their own, servers
//! over loopback, and a plain HTTP/1.1 client over `TcpStream`, so what is tested is the bytes
//! on the wire.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde_json::{Value, json};
use tpslab::serve::limits::Limits;
use tpslab::serve::{self, RunningServer, ServerState};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs};

/// Small enough to test the 413 cheaply, large enough for the too-long prompt.
pub const BODY_LIMIT: usize = 256 << 10;

pub fn model() -> Arc<LoadedModel> {
    static LM: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    Arc::clone(LM.get_or_init(|| {
        let path = tpslab_engine::library::resolve_model("default", &mut |m| eprintln!("{m}"))
            .expect("default model");
        Arc::new(LoadedModel::load(&path).expect("load model"))
    }))
}

/// An engine of its own (so tests that count or fill the queue see only their own requests).
pub fn engine(max_num_seqs: usize, max_waiting: Option<usize>) -> EngineHandle {
    engine_with_kv(max_num_seqs, max_waiting, 64 << 20)
}

/// As [`engine`], with a KV pool of `kv_bytes`.
pub fn engine_with_kv(
    max_num_seqs: usize,
    max_waiting: Option<usize>,
    kv_bytes: usize,
) -> EngineHandle {
    let mut knobs = Knobs::default();
    knobs.kv.budget_bytes = kv_bytes;
    knobs.scheduler.max_num_seqs = max_num_seqs;
    knobs.scheduler.max_waiting = max_waiting;
    let config = EngineConfig {
        threads: 2,
        knobs,
        device: DeviceChoice::Cpu,
        draft: None,
        ..EngineConfig::default()
    };
    EngineHandle::start(model(), config, None).expect("engine")
}

/// The test servers' limits: the defaults with a body limit of [`BODY_LIMIT`].
pub fn test_limits() -> Limits {
    Limits {
        max_body_bytes: BODY_LIMIT,
        ..Limits::default()
    }
}

/// A server of its own over another model than the default (one with another chat template),
/// with an engine of its own; returns the server and the model id it answers to.
pub fn serve_model(lm: Arc<LoadedModel>) -> (RunningServer, String) {
    serve_model_with(lm, test_limits())
}

/// As [`serve_model`], under `limits`.
pub fn serve_model_with(lm: Arc<LoadedModel>, limits: Limits) -> (RunningServer, String) {
    let mut knobs = Knobs::default();
    knobs.kv.budget_bytes = 64 << 20;
    let config = EngineConfig {
        threads: 2,
        knobs,
        device: DeviceChoice::Cpu,
        draft: None,
        ..EngineConfig::default()
    };
    let engine = EngineHandle::start(Arc::clone(&lm), config, None).expect("engine");
    let mut state = ServerState::new(engine, lm, None);
    state.limits = limits;
    let id = state.model_id.clone();
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    (serve::spawn(Arc::new(state), addr).expect("server"), id)
}

pub fn start(engine: EngineHandle, api_key: Option<&str>) -> RunningServer {
    start_with(engine, api_key, test_limits(), false)
}

pub fn start_with(
    engine: EngineHandle,
    api_key: Option<&str>,
    limits: Limits,
    metrics_open: bool,
) -> RunningServer {
    let mut state = ServerState::new(engine, model(), api_key.map(String::from));
    state.limits = limits;
    state.metrics_open = metrics_open;
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    serve::spawn(Arc::new(state), addr).expect("server")
}

/// One server shared by the tests that neither count nor cancel.
pub fn shared() -> SocketAddr {
    static S: OnceLock<RunningServer> = OnceLock::new();
    S.get_or_init(|| start(engine(8, None), None)).addr
}

pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `data:` payloads of an SSE body, in order.
    pub fn events(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.body)
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: ").map(String::from))
            .collect()
    }

    /// The error object, checked for OpenAI's shape.
    pub fn error(&self) -> Value {
        let v = self.json();
        let e = v["error"].clone();
        assert!(e["message"].is_string(), "no error message: {v}");
        assert!(e["type"].is_string(), "no error type: {v}");
        assert!(e.get("param").is_some() && e.get("code").is_some(), "{v}");
        e
    }
}

pub fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .expect("timeout");
    s
}

pub fn send(s: &mut TcpStream, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) {
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n",
        body.len()
    );
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("connection"))
    {
        req.push_str("Connection: close\r\n");
    }
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    // A server that answers early (413) may close before it read everything: keep its answer.
    let _ = s.write_all(&bytes);
}

pub fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(i) = b.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&b[..i]).expect("chunk size");
        let n = usize::from_str_radix(size.split(';').next().unwrap_or("0").trim(), 16)
            .expect("hex size");
        if n == 0 {
            break;
        }
        out.extend_from_slice(&b[i + 2..i + 2 + n]);
        b = &b[i + 2 + n + 2..];
    }
    out
}

pub fn parse(raw: &[u8]) -> Resp {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no head in {:?}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..end]).into_owned();
    let mut lines = head.split("\r\n");
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|s| s.parse().ok())
        .expect("status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let rest = &raw[end + 4..];
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Resp {
        status,
        headers,
        body,
    }
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Resp {
    let mut s = connect(addr);
    send(&mut s, method, path, headers, body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse(&raw)
}

pub fn post(addr: SocketAddr, path: &str, body: &Value) -> Resp {
    request(addr, "POST", path, &[], body.to_string().as_bytes())
}

pub const CHAT_QUESTION: &str = "Tell me the capital of France.";

/// A greedy chat request (`extra` merged in). The question is one whose greedy answer llama.cpp
/// gives as we do ("The capital of France is Paris."); "What is the capital of France?" starts
/// at a near-tie that llama.cpp answers "L'Étoile…".
pub fn chat_body(extra: Value) -> Value {
    let mut b = json!({
        "messages": [{"role": "user", "content": CHAT_QUESTION}],
        "temperature": 0,
        "max_tokens": 12,
    });
    for (k, v) in extra.as_object().expect("object") {
        b[k] = v.clone();
    }
    b
}

pub fn serve_model_id() -> String {
    model()
        .path
        .file_stem()
        .expect("stem")
        .to_string_lossy()
        .into_owned()
}

/// `tpslab serve ARGS` (the real binary) on a free port, its stderr kept in a file; killed
/// when dropped.
pub struct ServeProcess {
    pub child: std::process::Child,
    pub port: u16,
    pub stderr: std::path::PathBuf,
}

impl ServeProcess {
    /// Starts `tpslab serve --device cpu --port P ARGS` with `env` set, and waits until `probe`
    /// (given the port) accepts a connection.
    pub fn start(args: &[&str], env: &[(&str, &str)], probe: fn(u16) -> SocketAddr) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let stderr =
            std::env::temp_dir().join(format!("tpslab-serve-{}-{n}.log", std::process::id()));
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_tpslab"));
        cmd.args(["serve", "--device", "cpu", "--port", &port.to_string()])
            .args(args)
            .env_remove("TPSLAB_API_KEY")
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&stderr).expect("log file"));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start tpslab serve");
        let deadline = std::time::Instant::now() + Duration::from_secs(300);
        while TcpStream::connect(probe(port)).is_err() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = std::fs::read_to_string(&stderr).unwrap_or_default();
                panic!("tpslab serve exited ({status}): {log}");
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the server did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        Self {
            child,
            port,
            stderr,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// What the server has printed on stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// The IPv4 loopback address of a port (the usual probe of [`ServeProcess::start`]).
pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

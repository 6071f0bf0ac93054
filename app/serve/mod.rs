//! `tpslab serve`: an OpenAI-compatible HTTP server over the engine (tokio, axum's router on
//! hyper's HTTP/1.1 connections).
//!
//! - [`openai`]: request shapes, their caps, and their translation to engine requests;
//!   [`openai_out`]: the responses' and stream chunks' shapes.
//! - [`structured`]: the structured-output fields (`response_format`, vLLM's `guided_*`,
//!   llama-server's `json_schema` / `grammar`) as one compiled constraint.
//! - [`tools`]: `tools` and `tool_choice` (`required` and a named tool enforced with a JSON
//!   schema), the calls read out of an answer in OpenAI's shapes; [`tool_list`] reads
//!   `required`'s list of calls as it streams.
//! - [`responses`]: `POST /v1/responses` (OpenAI's Responses API) over the chat path, its SSE
//!   events in [`responses_stream`], the `response` object and its items in
//!   [`responses_json`].
//! - [`chat_input`]: a chat request's messages, tools and thinking switch as the chat template
//!   gets them, and the prompt with its reasoning splitter (the window's chat uses it too).
//! - [`fim`]: fill-in-the-middle prompts (`suffix`, llama-server's `input_*`), built as its
//!   `format_infill` builds them; [`infill`]: llama-server's `POST /infill` over them.
//! - [`unhonoured`]: fields the engine cannot honour (audio, images, beam search...), each a 400
//!   naming it.
//! - [`embeddings`]: `POST /v1/embeddings`, each input pooled by the engine beside the rest.
//! - [`handlers`]: the completion endpoints (bounded body read, blocking work off the runtime).
//! - [`bridge`]: a request's choices submitted (sharing the prompt's KV blocks) and their
//!   engine events merged for async handlers; cancel on client disconnect.
//! - [`answer`]: the choices' events as the whole response or as the SSE body.
//! - [`logprobs_json`]: token log-probabilities in chat's and completions' shapes.
//! - [`json_body`]: a whole answer's JSON body with its largest parts (a prompt's
//!   log-probabilities) written as it goes out.
//! - [`tokenize`]: `/tokenize` and `/detokenize` (vLLM's shapes).
//! - [`models`]: `/v1/models`, `/v1/models/{id}` (every name the model is served under) and
//!   `/health`.
//! - [`errors`]: OpenAI's error JSON with its HTTP status.
//! - [`auth`]: the API key (`--api-key`, `--api-key-file`, `TPSLAB_API_KEY`) and its check.
//! - [`metrics`]: `GET /metrics` in Prometheus text (`tpslab:*`, vLLM's shapes).
//! - [`trace`]: `--record-trace FILE`: each finished request as a line of a trace the tuner
//!   replays.
//! - [`limits`]: every limit the server enforces, and its `tpslab serve` flags.
//! - [`http`]: connections: the cap, the header and idle timeouts.
//! - [`browser`]: the `Host` (DNS rebinding) and `Origin` guards, and CORS for named origins.
//! - [`share`]: each client's share of the sequences and tokens in flight (429 past it).
//! - [`state`]: what every handler shares ([`ServerState`]).
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `POST /v1/responses`,
//! `POST /v1/embeddings`,
//! `POST /infill`, `GET /v1/models`, `GET /v1/models/{id}`,
//! `POST /tokenize`, `POST /detokenize` and `GET /metrics`, all behind the API key when one is
//! set (`--metrics-open` leaves `/metrics` open); `GET /health` and `GET /v1/health` without
//! it; every one behind the browser guards.
//! Binds to loopback unless told otherwise, and warns when told otherwise with no API key.

pub mod answer;
pub mod auth;
pub mod bridge;
pub mod browser;
pub mod chat_input;
pub mod embeddings;
pub mod errors;
pub mod fim;
pub mod handlers;
pub mod http;
pub mod infill;
pub mod json_body;
pub mod limits;
pub mod logprobs_json;
pub mod metrics;
pub mod models;
pub mod openai;
pub mod openai_out;
pub mod responses;
pub mod responses_json;
pub mod responses_stream;
pub mod share;
pub mod state;
pub mod structured;
pub mod tokenize;
pub mod tool_list;
pub mod tools;
pub mod trace;
pub mod unhonoured;

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::Arc;

use anyhow::{Context, Result};
use axum::Router;
use axum::extract::State;
use axum::http::{Uri, header};
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, Knobs, KvSettings};

use self::errors::ApiError;
use self::limits::LimitArgs;
pub use self::state::{ServerChoices, ServerState};
use crate::kv_args::KvArgs;
use crate::model_args::ModelArgs;
use crate::spec_args::SpecArgs;
use tpslab_engine::model::pooling::Pooling;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on: an IP address (`::` is every IPv6 and IPv4 address) or a name
    /// such as `localhost`, resolved; loopback unless you mean to expose the server.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    #[command(flatten)]
    pub key: auth::KeyArgs,
    /// Serve /metrics without the API key (for a scraper that cannot send one).
    #[arg(long)]
    pub metrics_open: bool,
    /// Most requests running at once, in one batch (vLLM's name; llama-server's
    /// `--parallel`).
    #[arg(long, visible_alias = "parallel", default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=65_536))]
    pub max_num_seqs: u32,
    #[command(flatten)]
    pub kv: KvArgs,
    /// Requests allowed to wait; past it new requests get 429.
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub browser: browser::BrowserArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Also list and accept the model under NAME (repeatable), as llama-server's `--alias` and
    /// vLLM's `--served-model-name`; requests may name it or the file's stem.
    #[arg(long = "alias", value_name = "NAME", value_parser = alias_name)]
    pub aliases: Vec<String>,
    /// Append one JSON line per finished request (arrival time, prompt and completion tokens)
    /// to FILE: a trace `tpslab tune --trace FILE` replays.
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<std::path::PathBuf>,
    /// How /v1/embeddings makes one vector of a prompt (llama.cpp's names): `mean` of every
    /// token's state, `cls` (the first) or `last`. Default: the file's `pooling_type`, else
    /// `last`.
    #[arg(long, value_name = "RULE")]
    pub pooling: Option<Pooling>,
}

/// An `--alias`: a name a client can send (not empty, no control characters, not huge).
pub(crate) fn alias_name(s: &str) -> Result<String, String> {
    let t = s.trim();
    if t.is_empty() || t.len() > 256 || t.chars().any(char::is_control) {
        return Err("an alias is 1 to 256 printable characters".into());
    }
    Ok(t.to_string())
}

/// The routes, with the API key check on /v1/* (and /metrics unless `metrics_open`).
pub fn router(state: Arc<ServerState>) -> Router {
    let mut v1 = Router::new()
        .route("/v1/completions", post(handlers::completions))
        .route("/v1/chat/completions", post(handlers::chat))
        .route("/v1/responses", post(responses::responses))
        .route("/v1/embeddings", post(embeddings::embeddings))
        .route("/infill", post(infill::infill))
        .route("/v1/models", get(models::list))
        .route("/v1/models/{*id}", get(models::retrieve))
        .route("/tokenize", post(tokenize::tokenize))
        .route("/detokenize", post(tokenize::detokenize));
    let open = Router::new().route("/metrics", get(prometheus));
    // As llama-server: a load balancer's health check carries no key.
    let health = Router::new()
        .route("/health", get(models::health))
        .route("/v1/health", get(models::health));
    if state.metrics_open {
        v1 = v1.route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::auth,
        ));
        v1 = v1.merge(open);
    } else {
        v1 = v1.merge(open).route_layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            auth::auth,
        ));
    }
    v1.merge(health)
        .fallback(|uri: Uri| async move { ApiError::not_found(uri.path()) })
        .layer(middleware::from_fn_with_state(
            Arc::clone(&state),
            browser::guard,
        ))
        .with_state(state)
}

async fn prometheus(State(st): State<Arc<ServerState>>) -> Response {
    let text = st.metrics.render(&st.engine.stats());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// A server running on its own thread and runtime; dropping it stops the server (requests in
/// flight are dropped, which cancels them in the engine).
pub struct RunningServer {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("tpslab-http")
        .enable_all()
        .build()
        .context("cannot start the HTTP runtime")
}

/// Binds `addr` (port 0 picks a free one) and serves on a background thread, under the
/// state's limits.
pub fn spawn(state: Arc<ServerState>, addr: SocketAddr) -> Result<RunningServer> {
    let rt = runtime()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let addr = listener.local_addr()?;
    let limits = state.limits.clone();
    let app = router(state);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("tpslab-serve".into())
        .spawn(move || {
            rt.block_on(http::serve_until(listener, app, limits, stopped));
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
        })
        .context("cannot start the server thread")?;
    Ok(RunningServer {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// `--host` and `--port` as the address to bind: an IP address (v6 with or without brackets),
/// or a name resolved to its first IPv4 address (its first address when it has none).
fn bind_addr(host: &str, port: u16) -> Result<SocketAddr> {
    let h = host.trim();
    let bare = h
        .strip_prefix('[')
        .and_then(|v| v.strip_suffix(']'))
        .unwrap_or(h);
    if let Ok(ip) = bare.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    if bare.is_empty() || bare.len() > 253 {
        anyhow::bail!("--host {host:?} is no address or host name");
    }
    let found: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve --host {bare}"))?
        .collect();
    found
        .iter()
        .find(|a| a.is_ipv4())
        .or(found.first())
        .copied()
        .with_context(|| format!("--host {bare} resolves to no address"))
}

/// `tpslab serve`: loads the model, starts the engine and serves until killed.
pub fn run(a: &ServeArgs) -> Result<()> {
    let limits = a.limits.limits().map_err(anyhow::Error::msg)?;
    let api_key = a.key.key(|k| std::env::var(k).ok())?;
    let lm = a.model.load()?;
    let mut knobs = Knobs::default();
    knobs.scheduler.max_num_seqs = a.max_num_seqs as usize;
    knobs.kv = a.kv.settings(KvSettings::default().budget_bytes >> 20);
    knobs.scheduler.max_waiting = Some(a.max_waiting);
    let (spec, draft) = a.spec.resolve()?;
    knobs.spec = spec;
    let config = EngineConfig {
        threads: a.model.threads,
        knobs,
        device: a.model.device,
        gpu_kv_fraction: a.kv.gpu_fraction(),
        cpu_moe_layers: a.model.cpu_moe_layers(),
        draft,
    };
    let engine = EngineHandle::start(Arc::clone(&lm), config, None)?;
    let choices = ServerChoices {
        listed_aliases: a.aliases.clone(),
        browser: a.browser.policy(),
        limits: limits.clone(),
        pooling: a.pooling,
    };
    let mut state = ServerState::configured(engine, lm, api_key, choices);
    state.metrics_open = a.metrics_open;
    if let Some(path) = &a.record_trace {
        let w = trace::TraceWriter::open(path).map_err(anyhow::Error::msg)?;
        state.metrics = Arc::new(metrics::ServerMetrics::new(&state.model_id).with_trace(w));
        eprintln!("recording each finished request to {}", path.display());
    }
    state.aliases.push(a.model.name().to_string());
    if let Some(s) = &a.model.synthetic {
        state.aliases.push(s.clone());
    }
    let addr = bind_addr(&a.host, a.port)?;
    if !addr.ip().is_loopback() && state.api_key.is_none() {
        eprintln!(
            "WARNING: serving on {addr} without an API key: anyone who can reach this address \
             can use the model. Pass --api-key KEY (or bind 127.0.0.1)."
        );
    }
    let rt = runtime()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let snap = state.engine.stats();
    eprintln!(
        "serving {} ({}) on http://{}/v1 — {}; KV pool: {} tokens ({} blocks of {}, {}), up to {} \
         sequences at once",
        state.model_id,
        state.lm.precision,
        listener.local_addr()?,
        snap.device,
        metrics::kv_capacity_tokens(&snap),
        snap.kv_total_blocks,
        snap.knobs.kv.block_size,
        snap.knobs.kv.types,
        snap.knobs.scheduler.max_num_seqs,
    );
    let app = router(Arc::new(state));
    rt.block_on(http::serve(listener, app, limits));
    Ok(())
}

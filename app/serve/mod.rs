//! `tpslab serve`: an OpenAI-compatible HTTP server over the engine (tokio + axum).
//!
//! - [`openai`]: request and response shapes, and their translation to engine requests.
//! - [`bridge`]: engine events to async handlers; cancel on client disconnect; the SSE body.
//! - [`errors`]: OpenAI's error JSON with its HTTP status.
//! - [`metrics`]: `GET /metrics` in Prometheus text (`tpslab:*`, vLLM's shapes).
//!
//! Routes: `POST /v1/completions`, `POST /v1/chat/completions`, `GET /v1/models` (behind the API
//! key when one is set) and `GET /metrics`. Binds to loopback unless told otherwise.

pub mod bridge;
pub mod errors;
pub mod metrics;
pub mod openai;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result};
use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request as HttpRequest, State};
use axum::http::{StatusCode, Uri, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use clap::Args;
use serde_json::json;
use tpslab_engine::engine::{EngineConfig, EngineHandle, Event, Knobs, Usage};
use tpslab_engine::generate::LoadedModel;
use tpslab_engine::stop::FinishReason;

use self::bridge::{SseStream, submit};
use self::errors::ApiError;
use self::metrics::ServerMetrics;
use self::openai::{Kind, Meta};
use crate::cli::ModelArgs;

/// Request bodies larger than this get a 413.
pub const DEFAULT_BODY_LIMIT: usize = 4 << 20;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on; loopback unless you mean to expose the server.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/*.
    #[arg(long)]
    pub api_key: Option<String>,
    /// Most requests running at once.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Requests allowed to wait; past it new requests get 429.
    #[arg(long, default_value_t = 256)]
    pub max_waiting: usize,
}

/// Everything a handler needs; shared by all connections.
pub struct ServerState {
    pub engine: EngineHandle,
    pub lm: Arc<LoadedModel>,
    /// The id `/v1/models` lists; requests may name it or any alias.
    pub model_id: String,
    pub aliases: Vec<String>,
    pub api_key: Option<String>,
    pub metrics: Arc<ServerMetrics>,
    pub created: u64,
}

impl ServerState {
    /// State over a running engine; the model id is the file's stem.
    pub fn new(engine: EngineHandle, lm: Arc<LoadedModel>, api_key: Option<String>) -> Self {
        let model_id = lm
            .path
            .file_stem()
            .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
        Self {
            metrics: Arc::new(ServerMetrics::new(&model_id)),
            engine,
            lm,
            aliases: Vec::new(),
            model_id,
            api_key,
            created: unix_now(),
        }
    }

    fn check_model(&self, asked: Option<&str>) -> Result<(), ApiError> {
        match asked {
            None => Ok(()),
            Some(m) if m == self.model_id || self.aliases.iter().any(|a| a == m) => Ok(()),
            Some(m) => Err(ApiError::model_not_found(m)),
        }
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The routes, with the API key check on /v1/* and the body size limit.
pub fn router(state: Arc<ServerState>, body_limit: usize) -> Router {
    let v1 = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route_layer(middleware::from_fn_with_state(Arc::clone(&state), auth));
    Router::new()
        .merge(v1)
        .route("/metrics", get(prometheus))
        .fallback(|uri: Uri| async move { ApiError::not_found(uri.path()) })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(state)
}

async fn auth(State(st): State<Arc<ServerState>>, req: HttpRequest, next: Next) -> Response {
    if let Some(key) = &st.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if !given.is_some_and(|g| same_key(g.as_bytes(), key.as_bytes())) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

/// Compares keys without an early exit on the first differing byte.
fn same_key(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn models(State(st): State<Arc<ServerState>>) -> Response {
    errors::json_response(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{
                "id": st.model_id,
                "object": "model",
                "created": st.created,
                "owned_by": "tpslab",
                "max_model_len": st.lm.model.cfg.context_len,
            }],
        }),
    )
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

async fn chat(st: State<Arc<ServerState>>, body: Result<Bytes, BytesRejection>) -> Response {
    complete(st, Kind::Chat, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn completions(st: State<Arc<ServerState>>, body: Result<Bytes, BytesRejection>) -> Response {
    complete(st, Kind::Completion, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// Both endpoints: parse, tokenize (off the runtime threads), submit, then answer whole or as
/// an SSE stream. The response status waits for the engine's first event, so a refusal (queue
/// full) is a real 429 and not an error inside a 200 stream.
async fn complete(
    State(st): State<Arc<ServerState>>,
    kind: Kind,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = errors::parse_body(&body?)?;
    let parsed = openai::parse(kind, &body)?;
    st.check_model(parsed.common.model.as_deref())?;
    let lm = Arc::clone(&st.lm);
    let p = parsed.clone();
    let req = tokio::task::spawn_blocking(move || openai::to_request(&p, &lm))
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))??;
    let mut sub = submit(&st.engine, req, Arc::clone(&st.metrics));
    let meta = Meta {
        kind,
        id: format!("{}-{}", kind.id_prefix(), sub.guard.id()),
        created: unix_now(),
        model: st.model_id.clone(),
    };
    match sub.events.recv().await {
        Some(Event::Started { .. }) => {}
        Some(Event::Refused { reason, kind, .. }) => {
            sub.guard.done();
            return Err(ApiError::refused(&reason, kind));
        }
        Some(_) | None => {
            sub.guard.done();
            return Err(ApiError::internal("the engine stopped"));
        }
    }
    if parsed.stream() {
        let stream = SseStream::new(sub, meta, parsed.include_usage());
        return Ok((
            StatusCode::OK,
            [
                (header::CONTENT_TYPE, "text/event-stream"),
                (header::CACHE_CONTROL, "no-cache"),
            ],
            Body::from_stream(stream),
        )
            .into_response());
    }
    // Dropping this future (the client hung up) drops `sub`, whose guard cancels the request.
    let (text, reason, usage) = collect(&mut sub).await?;
    Ok(errors::json_response(
        StatusCode::OK,
        &openai::full_response(&meta, &text, reason, &usage),
    ))
}

/// The whole text of a non-streamed request.
async fn collect(sub: &mut bridge::Submitted) -> Result<(String, FinishReason, Usage), ApiError> {
    let mut out = String::new();
    while let Some(ev) = sub.events.recv().await {
        match ev {
            Event::Started { .. } => {}
            Event::Token { text, .. } => out.push_str(&text),
            Event::Finished {
                reason,
                usage,
                text,
                ..
            } => {
                sub.guard.done();
                out.push_str(&text);
                return Ok((out, reason, usage));
            }
            Event::Refused { reason, kind, .. } => {
                sub.guard.done();
                return Err(ApiError::refused(&reason, kind));
            }
        }
    }
    sub.guard.done();
    Err(ApiError::internal("the engine stopped"))
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

/// Binds `addr` (port 0 picks a free one) and serves on a background thread.
pub fn spawn(
    state: Arc<ServerState>,
    addr: SocketAddr,
    body_limit: usize,
) -> Result<RunningServer> {
    let rt = runtime()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    let addr = listener.local_addr()?;
    let app = router(state, body_limit);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("tpslab-serve".into())
        .spawn(move || {
            rt.spawn(async move {
                let _ = axum::serve(listener, app).await;
            });
            let _ = rt.block_on(stopped);
            rt.shutdown_timeout(std::time::Duration::from_secs(1));
        })
        .context("cannot start the server thread")?;
    Ok(RunningServer {
        addr,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// `tpslab serve`: loads the model, starts the engine and serves until killed.
pub fn run(a: &ServeArgs) -> Result<()> {
    let lm = a.model.load()?;
    let mut knobs = Knobs::default();
    knobs.scheduler.max_num_seqs = a.max_num_seqs;
    knobs.scheduler.max_waiting = Some(a.max_waiting);
    let config = EngineConfig {
        threads: a.model.threads,
        knobs,
        device: a.model.device,
        gpu_kv_fraction: 0.0,
    };
    let engine = EngineHandle::start(Arc::clone(&lm), config, None)?;
    let mut state = ServerState::new(engine, lm, a.api_key.clone());
    state.aliases.push(a.model.model.clone());
    if let Some(s) = &a.model.synthetic {
        state.aliases.push(s.clone());
    }
    let addr: SocketAddr = format!("{}:{}", a.host, a.port)
        .parse()
        .with_context(|| format!("bad --host/--port: {}:{}", a.host, a.port))?;
    let rt = runtime()?;
    let listener = rt
        .block_on(tokio::net::TcpListener::bind(addr))
        .with_context(|| format!("cannot listen on {addr}"))?;
    eprintln!(
        "serving {} ({}) on http://{}/v1 — {}",
        state.model_id,
        state.lm.precision,
        listener.local_addr()?,
        state.engine.stats().device
    );
    let app = router(Arc::new(state), DEFAULT_BODY_LIMIT);
    rt.block_on(async move { axum::serve(listener, app).await })
        .context("the server stopped")
}

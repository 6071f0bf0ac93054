//! The two completion endpoints: read the body (bounded in size and time), parse, render and
//! tokenize on a bounded blocking pool ([`prepare`], which `/v1/responses` shares), submit every
//! choice, then answer whole or as an SSE stream.

use std::sync::Arc;
use std::time::Instant;

use axum::Extension;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use super::answer::{AnswerSpec, SseStream, collect};
use super::bridge::Choices;
use super::errors::{self, ApiError};
use super::openai::{self, Kind};
use super::openai_out::Meta;
use super::state::{Peer, ServerState, client_of, unix_now};
use super::tools::ToolParse;

pub async fn chat(
    st: State<Arc<ServerState>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    complete(st, Kind::Chat, peer, headers, body).await
}

pub async fn completions(
    st: State<Arc<ServerState>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    complete(st, Kind::Completion, peer, headers, body).await
}

/// The whole body, at most `limit` bytes, within `timeout` of the headers: a client that stalls
/// its body gets a 408, one that sends too much a 413.
pub(super) async fn read_body(
    headers: &HeaderMap,
    body: Body,
    limit: usize,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    // Read up to the limit even when the declared length is over it: answering before the
    // client has sent what fits would close on unread bytes, and a reset can eat the answer.
    let deadline = Instant::now() + timeout;
    let mut stream = body.into_data_stream();
    let mut out = Vec::with_capacity(declared.map_or(0, |n| n.min(limit as u64) as usize));
    loop {
        let next = std::future::poll_fn(|cx| {
            futures_core::Stream::poll_next(std::pin::Pin::new(&mut stream), cx)
        });
        let chunk = match tokio::time::timeout_at(deadline.into(), next).await {
            Err(_) => return Err(ApiError::body_timeout(timeout)),
            Ok(None) => break,
            Ok(Some(Err(e))) => {
                return Err(ApiError::bad_request(format!("cannot read the body: {e}")));
            }
            Ok(Some(Ok(c))) => c,
        };
        if out.len() + chunk.len() > limit {
            return Err(ApiError::too_large(limit));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(out))
}

/// The body read (bounded in size and time), then a prepare slot taken: how every endpoint
/// that parses on the blocking pool starts ([`prepare`], `/tokenize`, `/v1/embeddings`).
pub(super) async fn body_and_slot(
    st: &Arc<ServerState>,
    headers: &HeaderMap,
    body: Body,
) -> Result<(Bytes, tokio::sync::OwnedSemaphorePermit), ApiError> {
    let limits = &st.limits;
    let bytes = read_body(headers, body, limits.max_body_bytes, limits.body_timeout).await?;
    let slot = Arc::clone(&st.prepare)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::internal("the server is stopping"))?;
    Ok((bytes, slot))
}

/// A request read, checked and started: what it asked, its running choices, and how its
/// answer is read ([`AnswerSpec`]).
pub struct Started {
    pub parsed: openai::Parsed,
    pub choices: Choices,
    pub spec: AnswerSpec,
}

/// Reads the body (bounded), translates it (`/v1/responses` into the chat body it means),
/// parses it as `kind`, and submits its choices. JSON parsing, the translation, the chat
/// template and the tokenizer run on tokio's blocking pool, at most `ServerState::prepare` of
/// them at once (a 4 MiB prompt takes seconds and holds its bytes several times over). Returns
/// once the engine has accepted every choice, so a refusal (queue full) is a real 429 and not
/// an error inside a 200 stream. The request's sequences and tokens count against its
/// client's share ([`super::share`]) until its choices are dropped.
pub async fn prepare(
    st: &Arc<ServerState>,
    kind: Kind,
    peer: Option<Peer>,
    headers: &HeaderMap,
    body: Body,
    translate: fn(Value) -> Result<Value, ApiError>,
) -> Result<Started, ApiError> {
    let client = client_of(headers, peer);
    let (bytes, slot) = body_and_slot(st, headers, body).await?;
    let state = Arc::clone(st);
    let (parsed, (req, reasoning)) = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let body = translate(errors::parse_body(&bytes)?)?;
        drop(bytes);
        let parsed = openai::parse(kind, &body, &state.limits, state.shape())?;
        state.check_model(parsed.common.model.as_deref())?;
        let req = openai::to_request(&parsed, &state.lm, &state.limits, client)?;
        Ok::<_, ApiError>((parsed, req))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))??;
    let n = parsed.n.max(1);
    let budget = req
        .stop
        .max_tokens
        .unwrap_or_else(|| st.context_len().saturating_sub(req.prompt.len()));
    let tokens = n.saturating_mul(req.prompt.len().saturating_add(budget));
    let held = st.shares.reserve(client, n, tokens, st.share())?;
    let mut choices = Choices::start(&st.engine, &st.metrics, req, parsed.n).await?;
    choices.hold(held);
    let echo = parsed.echo.then(|| echo_text(&parsed, st));
    let spec = AnswerSpec {
        meta: Meta {
            kind,
            id: format!("{}-{}", kind.id_prefix(), choices.first_id()),
            created: unix_now(),
            model: st.model_id.clone(),
        },
        lm: Arc::clone(&st.lm),
        reasoning,
        echo,
        include_usage: parsed.include_usage(),
        token_ids: parsed.common.return_tokens_as_token_ids.unwrap_or(false),
        tools: ToolParse::for_plan(parsed.tools.as_ref(), &st.lm),
        grammar_field: parsed.constraint.as_ref().map(|a| a.field),
        logprobs: parsed.logprobs,
        prompt_logprobs: parsed.prompt_logprobs,
    };
    Ok(Started {
        parsed,
        choices,
        spec,
    })
}

/// A 200 whose body is an SSE stream.
pub fn sse(stream: Body) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        stream,
    )
        .into_response()
}

/// Both endpoints: the request prepared, then the answer whole or streamed.
async fn complete(
    st: State<Arc<ServerState>>,
    kind: Kind,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(st, kind, peer.map(|Extension(p)| p), headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn answer(
    State(st): State<Arc<ServerState>>,
    kind: Kind,
    peer: Option<Peer>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let Started {
        parsed,
        mut choices,
        spec,
    } = prepare(&st, kind, peer, &headers, body, Ok).await?;
    if parsed.stream() {
        let stream = SseStream::new(choices, spec);
        return Ok(sse(Body::from_stream(stream)));
    }
    // Dropping this future (the client hung up) drops `choices`, whose guards cancel them.
    collect(&mut choices, &spec).await
}

/// The prompt's text for `echo`: as sent, or the token ids decoded.
fn echo_text(p: &openai::Parsed, st: &ServerState) -> String {
    match (&p.prompt_text, &p.prompt_tokens) {
        (Some(t), _) => t.clone(),
        (None, Some(ids)) => st.lm.tokenizer.decode(ids, false).unwrap_or_default(),
        (None, None) => String::new(),
    }
}

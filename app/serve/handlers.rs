//! The two completion endpoints: read the body (bounded in size and time), parse, render and
//! tokenize on a bounded blocking pool, submit, then answer whole or as an SSE stream.

use std::sync::Arc;
use std::time::Instant;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{Event, Usage};
use tpslab_engine::text::reasoning::Split;

use super::bridge::{self, SseStream, submit};
use super::errors::{self, ApiError};
use super::openai::{self, Kind, Meta};
use super::state::{ServerState, unix_now};
use super::tools::ToolParse;

pub async fn chat(st: State<Arc<ServerState>>, headers: HeaderMap, body: Body) -> Response {
    complete(st, Kind::Chat, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn completions(st: State<Arc<ServerState>>, headers: HeaderMap, body: Body) -> Response {
    complete(st, Kind::Completion, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
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

/// Both endpoints. JSON parsing, the chat template and the tokenizer run on tokio's blocking
/// pool, at most `ServerState::prepare` of them at once (a 4 MiB prompt takes seconds and holds
/// its bytes several times over). The response status waits for the engine's first event, so a
/// refusal (queue full) is a real 429 and not an error inside a 200 stream.
async fn complete(
    State(st): State<Arc<ServerState>>,
    kind: Kind,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let limits = &st.limits;
    let bytes = read_body(&headers, body, limits.max_body_bytes, limits.body_timeout).await?;
    let slot = Arc::clone(&st.prepare)
        .acquire_owned()
        .await
        .map_err(|_| ApiError::internal("the server is stopping"))?;
    let state = Arc::clone(&st);
    let (parsed, (req, reasoning)) = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let body = errors::parse_body(&bytes)?;
        drop(bytes);
        let parsed = openai::parse(kind, &body, &state.limits, state.shape())?;
        state.check_model(parsed.common.model.as_deref())?;
        let req = openai::to_request(&parsed, &state.lm, &state.limits)?;
        Ok::<_, ApiError>((parsed, req))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))??;
    let mut sub = submit(&st.engine, req, Arc::clone(&st.metrics));
    let meta = Meta {
        kind,
        id: format!("{}-{}", kind.id_prefix(), sub.guard.id()),
        created: unix_now(),
        model: st.model_id.clone(),
    };
    match sub.events.recv().await {
        Some(Event::Started { .. }) => {}
        Some(Event::Refused { reason, .. }) => {
            sub.guard.done();
            return Err(ApiError::refused(&reason));
        }
        Some(_) | None => {
            sub.guard.done();
            return Err(ApiError::internal("the engine stopped"));
        }
    }
    let tool_parse = ToolParse::for_plan(parsed.tools.as_ref(), &st.lm);
    if parsed.stream() {
        let stream =
            SseStream::new(sub, meta, parsed.include_usage(), reasoning).with_tools(tool_parse);
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
    let text = match reasoning {
        Some(parser) => parser.split_all(&text),
        None => Split {
            reasoning: String::new(),
            content: text,
        },
    };
    let mut answer = openai::full_response(&meta, &text, reason, &usage);
    if let Some(parse) = tool_parse {
        let (content, calls) = parse.parse_all(&text.content);
        super::tools::into_chat_response(&mut answer, &content, &calls);
    }
    Ok(errors::json_response(StatusCode::OK, &answer))
}

/// The whole text of a non-streamed request.
pub(super) async fn collect(sub: &mut bridge::Submitted) -> Result<(String, FinishReason, Usage), ApiError> {
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
            Event::Refused { reason, .. } => {
                sub.guard.done();
                return Err(ApiError::refused(&reason));
            }
        }
    }
    sub.guard.done();
    Err(ApiError::internal("the engine stopped"))
}

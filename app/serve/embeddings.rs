//! `POST /v1/embeddings` in OpenAI's shape: `input` as a string, a list of strings, a list of
//! token ids or a list of such lists; `encoding_format` `float` (default) or `base64` (the
//! little-endian f32 bytes, which the official Python client asks for); `dimensions` only as
//! the model's own width (no truncation). Each input is one engine request pooled by the
//! server's rule (`--pooling`, else the file's `pooling_type`, else `last`), batched by the
//! engine with whatever else runs; at most a window of them is in flight at once, so a list of
//! two thousand inputs does not take the whole batch. Vectors have unit length, as OpenAI's
//! and llama-server's do.

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc::unbounded_channel;
use tpslab_engine::sched::stop::StopCriteria;
use tpslab_engine::serving::engine::{Event, Request};
use tpslab_engine::serving::sampler::SamplingParams;

use super::bridge::{CancelGuard, submit_to};
use super::errors::{self, ApiError, typed};
use super::handlers::body_and_slot;
use super::state::{Peer, ServerState, client_of};

/// Inputs one request may carry (OpenAI's limit).
pub const MAX_INPUTS: usize = 2048;

/// Inputs of one request in the engine at once.
const WINDOW: usize = 32;

/// The body; other fields (vLLM's and llama-server's extras) are ignored, as OpenAI's own
/// clients send none.
#[derive(Debug, Deserialize)]
struct EmbedBody {
    input: Value,
    model: Option<String>,
    encoding_format: Option<String>,
    dimensions: Option<u64>,
    /// OpenAI's end-user id: accepted, unused.
    #[allow(dead_code)]
    user: Option<String>,
}

/// What a request asks, read and tokenized.
struct Asked {
    prompts: Vec<Vec<u32>>,
    base64: bool,
}

pub async fn embeddings(
    State(st): State<Arc<ServerState>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(&st, peer.map(|Extension(p)| p), &headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

async fn run(
    st: &Arc<ServerState>,
    peer: Option<Peer>,
    headers: &HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let client = client_of(headers, peer);
    let (bytes, slot) = body_and_slot(st, headers, body).await?;
    let state = Arc::clone(st);
    let asked = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let body = errors::parse_body(&bytes)?;
        drop(bytes);
        parse(&state, &body)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))??;
    let n = asked.prompts.len();
    let longest = asked.prompts.iter().map(Vec::len).max().unwrap_or(0);
    let window = WINDOW.min(n);
    let _held = st.shares.reserve(
        client,
        window,
        window.saturating_mul(longest + 1),
        st.share(),
    )?;
    let (vectors, prompt_tokens) = embed_all(st, asked.prompts, client, window).await?;
    let data: Vec<Value> = vectors
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let embedding = if asked.base64 {
                Value::String(base64(v))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let out = json!({
        "object": "list",
        "data": data,
        "model": st.model_id,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    });
    Ok(errors::json_response(StatusCode::OK, &out))
}

/// Every prompt's vector, in order, and the prompt tokens they took: at most `window` in the
/// engine at once. A refusal of any ends the whole request with it (the others are cancelled
/// as their guards drop, as when the client hangs up).
async fn embed_all(
    st: &ServerState,
    prompts: Vec<Vec<u32>>,
    client: tpslab_engine::sched::ClientId,
    window: usize,
) -> Result<(Vec<Vec<f32>>, usize), ApiError> {
    let n = prompts.len();
    let (tx, mut rx) = unbounded_channel();
    let mut guards: Vec<Option<CancelGuard>> = (0..n).map(|_| None).collect();
    let mut vectors: Vec<Option<Vec<f32>>> = vec![None; n];
    // Inputs submitted (`next`) and ended (`done`): `next - done` are in the engine.
    let (mut next, mut done, mut tokens) = (0, 0, 0);
    let mut prompts = prompts.into_iter();
    while done < n {
        while next - done < window {
            let Some(prompt) = prompts.next() else { break };
            let req = Request {
                prompt,
                sampling: SamplingParams::greedy(),
                stop: StopCriteria {
                    max_tokens: Some(1),
                    ..StopCriteria::default()
                },
                priority: st.limits.min_priority,
                client,
                embed: Some(st.pooling),
                ..Request::default()
            };
            guards[next] = Some(submit_to(
                &st.engine,
                req,
                Arc::clone(&st.metrics),
                next,
                tx.clone(),
            ));
            next += 1;
        }
        let Some((i, ev)) = rx.recv().await else {
            return Err(ApiError::internal("the engine stopped"));
        };
        match ev {
            Event::Embedding { vector, .. } => vectors[i] = Some(vector),
            Event::Finished { usage, reason, .. } => {
                if let Some(g) = guards[i].as_mut() {
                    g.done();
                }
                done += 1;
                tokens += usage.prompt_tokens;
                if vectors[i].is_none() {
                    return Err(ApiError::internal(format!(
                        "input {i} ended ({reason:?}) without its embedding"
                    )));
                }
            }
            Event::Refused { reason, .. } => {
                if let Some(g) = guards[i].as_mut() {
                    g.done();
                }
                return Err(ApiError::refused(&reason));
            }
            _ => {}
        }
    }
    let vectors = vectors.into_iter().map(Option::unwrap_or_default).collect();
    Ok((vectors, tokens))
}

/// The body read: the model named, the format, the width, and every input tokenized (with BOS
/// and EOS where the model adds them, as llama-server's embeddings do), each within the
/// server's context.
fn parse(st: &ServerState, body: &Value) -> Result<Asked, ApiError> {
    let b: EmbedBody = typed(body)?;
    st.check_model(b.model.as_deref())?;
    let base64 = match b.encoding_format.as_deref() {
        None | Some("float") => false,
        Some("base64") => true,
        Some(other) => {
            return Err(ApiError::bad_param(
                "encoding_format",
                format!("encoding_format '{other}' is not one of float, base64"),
            ));
        }
    };
    let width = st.lm.model.cfg.hidden;
    if let Some(d) = b.dimensions
        && d != width as u64
    {
        return Err(ApiError::bad_param(
            "dimensions",
            format!(
                "dimensions: this model's embeddings have {width} dimensions and are not \
                 truncated; omit dimensions or send {width}"
            ),
        ));
    }
    let prompts = inputs(st, &b.input)?;
    let ctx = st.limits.context(st.context_len());
    if let Some((i, p)) = prompts.iter().enumerate().find(|(_, p)| p.len() > ctx) {
        return Err(ApiError::context_exceeded(format!(
            "input {i} has {} tokens; this model's maximum context length is {ctx} tokens",
            p.len()
        )));
    }
    Ok(Asked { prompts, base64 })
}

/// `input`'s prompts: a string, a list of strings, a list of token ids, or a list of lists.
fn inputs(st: &ServerState, input: &Value) -> Result<Vec<Vec<u32>>, ApiError> {
    let bad = |m: &str| ApiError::bad_param("input", m.to_string());
    let items: Vec<&Value> = match input {
        Value::String(_) => vec![input],
        Value::Array(a) if a.is_empty() => return Err(bad("input must not be empty")),
        Value::Array(a) if a.iter().all(Value::is_number) => vec![input],
        Value::Array(a) => a.iter().collect(),
        _ => {
            return Err(bad(
                "input must be a string, a list of strings, a list of token ids or a list \
                 of lists of token ids",
            ));
        }
    };
    if items.len() > MAX_INPUTS {
        return Err(ApiError::over_cap(
            "input",
            format!(
                "input has {} items; at most {MAX_INPUTS} may be embedded at once",
                items.len()
            ),
        ));
    }
    let text_bytes: usize = items.iter().filter_map(|v| v.as_str()).map(str::len).sum();
    st.limits.check_prompt_bytes("input", text_bytes)?;
    let lm = &st.lm;
    items
        .into_iter()
        .enumerate()
        .map(|(i, v)| {
            let ids = match v {
                Value::String(s) => lm
                    .tokenizer
                    .encode_prompt(s, false)
                    .map_err(|e| bad(&format!("input {i}: {e}")))?,
                Value::Array(ids) => ids
                    .iter()
                    .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| bad(&format!("input {i}: token ids are integers from 0")))?,
                _ => return Err(bad(&format!("input {i} is not a string or a token list"))),
            };
            if ids.is_empty() {
                return Err(bad(&format!("input {i} is empty")));
            }
            Ok(ids)
        })
        .collect()
}

/// The vector's little-endian f32 bytes in standard base64 (with padding), as OpenAI sends.
fn base64(v: &[f32]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(char::from(ABC[(n >> (18 - 6 * k)) as usize & 63]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::base64;

    #[test]
    fn base64_is_the_standard_alphabet_with_padding() {
        // 1.0f32 = 00 00 80 3f; 2.0 = 00 00 00 40.
        assert_eq!(base64(&[1.0]), "AACAPw==");
        assert_eq!(base64(&[1.0, 2.0]), "AACAPwAAAEA=");
        assert_eq!(base64(&[]), "");
    }
}

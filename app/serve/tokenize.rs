//! `POST /tokenize` and `POST /detokenize`, in vLLM's shapes: a prompt's text (or a chat
//! conversation, rendered by the model's template as a chat request would be) to its token ids,
//! and token ids back to text. Bodies are read under the same caps as the completion
//! endpoints, and the work runs on the same bounded blocking pool.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::chat_input::{self, ChatBody};
use super::errors::{self, ApiError, typed};
use super::handlers::body_and_slot;
use super::logprobs_json::token_text;
use super::state::ServerState;

#[derive(Debug, Deserialize)]
struct TokenizeBody {
    model: Option<String>,
    /// The text; llama-server calls it `content`.
    #[serde(alias = "content")]
    prompt: Option<String>,
    /// BOS where the model adds one (vLLM's default: true). Chat prompts write their own.
    add_special_tokens: Option<bool>,
    #[serde(default)]
    return_token_strs: bool,
}

#[derive(Debug, Deserialize)]
struct DetokenizeBody {
    model: Option<String>,
    tokens: Vec<i64>,
}

/// Runs `work` on the blocking pool behind the server's prepare slots.
async fn blocking(
    st: &Arc<ServerState>,
    headers: &HeaderMap,
    body: Body,
    work: impl FnOnce(&ServerState, &Value) -> Result<Value, ApiError> + Send + 'static,
) -> Result<Response, ApiError> {
    let (bytes, slot) = body_and_slot(st, headers, body).await?;
    let state = Arc::clone(st);
    let v = tokio::task::spawn_blocking(move || {
        let _slot = slot;
        let body = errors::parse_body(&bytes)?;
        if !body.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        work(&state, &body)
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))??;
    Ok(errors::json_response(StatusCode::OK, &v))
}

pub async fn tokenize(
    State(st): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    blocking(&st, &headers, body, tokenize_body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

pub async fn detokenize(
    State(st): State<Arc<ServerState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    blocking(&st, &headers, body, detokenize_body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

fn tokenize_body(st: &ServerState, body: &Value) -> Result<Value, ApiError> {
    let b: TokenizeBody = typed(body)?;
    st.check_model(b.model.as_deref())?;
    let lm = &st.lm;
    let tokens = match (&b.prompt, body.get("messages")) {
        (Some(text), None) => {
            st.limits.check_prompt_bytes("prompt", text.len())?;
            let mut ids = lm
                .tokenizer
                .encode(text, true)
                .map_err(|e| ApiError::bad_param("prompt", e.to_string()))?;
            if b.add_special_tokens.unwrap_or(true)
                && lm.tokenizer.add_bos()
                && let Some(bos) = lm.tokenizer.bos_id()
                && ids.first() != Some(&bos)
            {
                ids.insert(0, bos);
            }
            ids
        }
        (None, Some(_)) => {
            let chat: ChatBody = typed(body)?;
            st.limits.check_prompt_bytes("messages", chat.text_len())?;
            let (messages, mut options) = chat.into_chat()?;
            if let Some(g) = body.get("add_generation_prompt") {
                options.add_generation_prompt = g.as_bool().ok_or_else(|| {
                    ApiError::bad_param(
                        "add_generation_prompt",
                        "add_generation_prompt must be a boolean",
                    )
                })?;
            }
            chat_input::chat_prompt(lm, &messages, &options)
                .map_err(|e| ApiError::bad_param("messages", e.to_string()))?
                .tokens
        }
        _ => {
            return Err(ApiError::bad_request(
                "send either prompt (a string) or messages (a conversation)",
            ));
        }
    };
    let strs = b.return_token_strs.then(|| {
        tokens
            .iter()
            .map(|&t| token_text(&lm.tokenizer, t).0)
            .collect::<Vec<_>>()
    });
    Ok(json!({
        "count": tokens.len(),
        "max_model_len": lm.model.cfg.context_len,
        "tokens": tokens,
        "token_strs": strs,
    }))
}

fn detokenize_body(st: &ServerState, body: &Value) -> Result<Value, ApiError> {
    let b: DetokenizeBody = typed(body)?;
    st.check_model(b.model.as_deref())?;
    let vocab = st.shape().vocab;
    let mut ids = Vec::with_capacity(b.tokens.len());
    for (i, &t) in b.tokens.iter().enumerate() {
        match u32::try_from(t) {
            Ok(id) if (id as usize) < vocab => ids.push(id),
            _ => {
                return Err(ApiError::bad_param(
                    "tokens",
                    format!(
                        "tokens[{i}] = {t} is not a token id of this model (0 to {})",
                        vocab.saturating_sub(1)
                    ),
                ));
            }
        }
    }
    let text = st
        .lm
        .tokenizer
        .decode(&ids, false)
        .map_err(|e| ApiError::bad_param("tokens", e.to_string()))?;
    Ok(json!({ "prompt": text }))
}

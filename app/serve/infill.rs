//! llama-server's `POST /infill`: its body (`input_prefix`, `input_suffix`, `input_extra`, an
//! optional `prompt`, `n_predict`) read as a completions body with a gap ([`super::fim`]), and
//! answered whole in its shape (`content`, `tokens_predicted`, `tokens_evaluated`,
//! `stop_type`).

use std::sync::Arc;

use axum::Extension;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tpslab_engine::sched::stop::FinishReason;

use super::answer::gather;
use super::errors::{self, ApiError};
use super::handlers::{Started, prepare};
use super::openai::Kind;
use super::state::{Peer, ServerState};

/// `/infill`'s body as the completions body it means: its `prompt` (optional) as text, the
/// `input_*` fields kept for [`asked`]. Not streamed (its answer is one JSON object).
fn from_llama_server(mut body: Value) -> Result<Value, ApiError> {
    let Some(obj) = body.as_object_mut() else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    if obj.get("stream").and_then(Value::as_bool) == Some(true) {
        return Err(ApiError::bad_param(
            "stream",
            "/infill answers in one piece; for a stream use /v1/completions with prompt and \
             suffix",
        ));
    }
    if !obj.contains_key("input_prefix") {
        return Err(ApiError::bad_param(
            "input_prefix",
            "/infill needs input_prefix (the text before the gap) and input_suffix",
        ));
    }
    if obj.get("n").is_some_and(|n| n.as_u64() != Some(1)) {
        return Err(ApiError::bad_param("n", "/infill returns one answer"));
    }
    // llama-server's `n_predict` is our `max_tokens`.
    if let Some(n) = obj.remove("n_predict")
        && !obj.contains_key("max_tokens")
        && n.as_i64().is_some_and(|n| n > 0)
    {
        obj.insert("max_tokens".into(), n);
    }
    let prompt = obj.remove("prompt").unwrap_or(Value::Null);
    let prompt = match prompt {
        Value::Null => Value::String(String::new()),
        Value::String(s) => Value::String(s),
        _ => {
            return Err(ApiError::bad_param(
                "prompt",
                "the /infill prompt must be a string",
            ));
        }
    };
    obj.insert("prompt".into(), prompt);
    Ok(body)
}

/// `POST /infill`: llama-server's fill-in-the-middle, answered in its shape.
pub async fn infill(
    State(st): State<Arc<ServerState>>,
    peer: Option<Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let peer = peer.map(|Extension(p)| p);
    let answer = async {
        let Started {
            mut choices, spec, ..
        } = prepare(
            &st,
            Kind::Completion,
            peer,
            &headers,
            body,
            from_llama_server,
        )
        .await?;
        let (outs, usage) = gather(&mut choices, &spec).await?;
        let first = outs.first();
        let stop_type = match first.and_then(|w| w.finish) {
            Some(FinishReason::Length) => "limit",
            _ => "eos",
        };
        Ok::<_, ApiError>(errors::json_response(
            StatusCode::OK,
            &json!({
                "content": first.map_or("", |w| w.text.content.as_str()),
                "model": spec.meta.model,
                "stop": true,
                "stop_type": stop_type,
                "tokens_predicted": usage.completion_tokens,
                "tokens_evaluated": usage.prompt_tokens,
            }),
        ))
    };
    answer.await.unwrap_or_else(IntoResponse::into_response)
}

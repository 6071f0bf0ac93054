//! What the server says about itself: `GET /v1/models` and `GET /v1/models/{id}` (OpenAI's
//! list and retrieve shapes, each name the model is served under: its file's stem, then every
//! `--alias`), and `GET /health` (llama-server's `{"status":"ok"}`, open without the key).

use std::sync::Arc;

use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::errors::{self, ApiError};
use super::state::ServerState;

/// One entry of the list, in OpenAI's `model` object shape (with vLLM's extra fields).
fn model_object(st: &ServerState, id: &str) -> Value {
    json!({
        "id": id,
        "object": "model",
        "created": st.created,
        "owned_by": "tpslab",
        "max_model_len": st.context_len(),
        "quantization": st.lm.precision.to_string(),
        "vocab_size": st.lm.model.cfg.vocab,
    })
}

pub async fn list(State(st): State<Arc<ServerState>>) -> Response {
    let data: Vec<Value> = st.listed_names().map(|id| model_object(&st, id)).collect();
    errors::json_response(StatusCode::OK, &json!({"object": "list", "data": data}))
}

/// OpenAI's retrieve: the model under any name it is listed by; a 404 in OpenAI's error
/// shape for any other.
pub async fn retrieve(
    State(st): State<Arc<ServerState>>,
    id: Result<Path<String>, PathRejection>,
) -> Response {
    // An id that does not decode (not UTF-8) names no model either.
    let id = id.map_or_else(|_| String::from("?"), |Path(id)| id);
    match st.listed_names().find(|n| *n == id) {
        Some(n) => errors::json_response(StatusCode::OK, &model_object(&st, n)),
        None => {
            let shown: String = id.chars().take(200).collect();
            ApiError::model_not_found(&shown).into_response()
        }
    }
}

/// llama-server's health check: 200 `{"status":"ok"}`. The server only listens once the model
/// is loaded and its engine started, so being answered at all means ready.
pub async fn health() -> Response {
    errors::json_response(StatusCode::OK, &json!({"status": "ok"}))
}

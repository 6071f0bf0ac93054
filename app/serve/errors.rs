//! Errors in OpenAI's JSON shape (`{"error": {"message", "type", "param", "code"}}`) with their
//! HTTP status, and the JSON body parser that tells malformed JSON (400) from wrong types (422).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tpslab_engine::serving::engine::{Refusal, RefusalKind};

/// Seconds a client is told to wait after a 429.
pub const RETRY_AFTER_S: u64 = 1;

/// One failed request: rendered once, at the edge, as OpenAI's error object.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// A request parameter out of range or not supported (400, naming the parameter).
    pub fn bad_param(param: &str, message: impl Into<String>) -> Self {
        Self {
            param: Some(param.into()),
            ..Self::bad_request(message)
        }
    }

    pub fn context_exceeded(message: impl Into<String>) -> Self {
        Self {
            code: Some("context_length_exceeded"),
            ..Self::bad_param("messages", message)
        }
    }

    pub fn model_not_found(model: &str) -> Self {
        Self {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{model}` does not exist."),
            )
        }
    }

    pub fn not_found(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no route for {path}"),
        )
    }

    pub fn unauthorized() -> Self {
        Self {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                "missing or wrong API key: send `Authorization: Bearer <key>`",
            )
        }
    }

    /// The engine's queue is past its limit: 429 with `Retry-After`.
    pub fn busy(message: impl Into<String>) -> Self {
        Self {
            code: Some("rate_limit_exceeded"),
            ..Self::new(StatusCode::TOO_MANY_REQUESTS, "rate_limit_error", message)
        }
    }

    /// A body past the server's limit (413).
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the server's limit of {limit} bytes"),
        )
    }

    /// A body that did not arrive in time (408; the connection is closed after it).
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s",
                limit.as_secs_f64()
            ),
        )
    }

    /// A request over one of the server's caps: 400 naming the parameter, the value and the
    /// limit (`code`: `limit_exceeded`).
    pub fn over_cap(param: &str, message: impl Into<String>) -> Self {
        Self {
            code: Some("limit_exceeded"),
            ..Self::bad_param(param, message)
        }
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// An engine refusal: queue full is 429, a stopped or failed engine 503, a request that
    /// cannot fit the context or the KV pool 400 `context_length_exceeded`, a bad prompt or
    /// parameter 400 naming it, the rest 400. The message is the refusal's own.
    pub fn refused(r: &Refusal) -> Self {
        let message = r.to_string();
        match r {
            Refusal::EmptyPrompt | Refusal::OutOfVocab { .. } => Self::bad_param("prompt", message),
            Refusal::ZeroMaxTokens => Self::bad_param("max_tokens", message),
            Refusal::Sampling(e) => Self::bad_param(e.name, message),
            Refusal::Grammar(_) => Self::bad_param("response_format", message),
            _ => match r.kind() {
                RefusalKind::Busy => Self::busy(message),
                RefusalKind::Unavailable => {
                    Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
                }
                RefusalKind::TooLong => Self::context_exceeded(message),
                RefusalKind::Invalid => Self::bad_request(message),
            },
        }
    }

    /// The error object alone (also sent as an SSE event when a stream fails midway).
    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut resp = json_response(self.status, &self.body());
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            resp.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_S));
        }
        // The rest of the body may still be on its way: end the connection rather than read it.
        if matches!(
            self.status,
            StatusCode::REQUEST_TIMEOUT | StatusCode::PAYLOAD_TOO_LARGE
        ) {
            resp.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        resp
    }
}

/// A JSON response (axum's `Json` needs its `json` feature, which pulls more than we use).
pub fn json_response(status: StatusCode, v: &Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        v.to_string(),
    )
        .into_response()
}

/// Parses a request body: bytes that are not JSON are a 400, JSON whose fields have the wrong
/// type (or miss a required one) a 422 naming the field.
pub fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
}

/// Reads a typed view of an already parsed body (unknown fields are ignored, as OpenAI's API does).
pub fn typed<T: DeserializeOwned>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        let (param, message) = if path == "." || path.is_empty() {
            (None, inner.to_string())
        } else {
            (Some(path.clone()), format!("{path}: {inner}"))
        };
        ApiError::from_parts(StatusCode::UNPROCESSABLE_ENTITY, param, message)
    })
}

impl ApiError {
    fn from_parts(status: StatusCode, param: Option<String>, message: String) -> Self {
        Self {
            param,
            ..Self::new(status, "invalid_request_error", message)
        }
    }
}

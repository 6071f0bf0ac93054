//! `POST /v1/responses`, OpenAI's Responses API, over the chat path: the body is translated to
//! a chat completions body (`input` and `instructions` to messages, `max_output_tokens`, the flat
//! function tools, `tool_choice`, `text.format`) and goes through the same parse, template,
//! admission and engine as `/v1/chat/completions`; the answer comes back as a `response`
//! object whole, or as its SSE events ([`super::responses_stream`]).
//!
//! Refused by name (400): `previous_response_id` (nothing is stored), `background: true`, and
//! input that is not text (`input_image`, `input_file`, ...). `store` is accepted and ignored.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{Event, Usage};
use tpslab_engine::text::reasoning::Split;
use tpslab_engine::text::tool_calls::ToolCall;

use super::bridge::submit;
use super::errors::{self, ApiError};
use super::handlers::{collect, read_body};
use super::openai::{self, Kind};
use super::responses_stream::ResponsesStream;
use super::state::{ServerState, unix_now};
use super::tools::{ToolParse, call_id};

/// A fresh id: `prefix` and 24 random hex digits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", super::tools::random_hex())
}

fn bad(param: &str, m: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, m)
}

/// One input message's content: a string, or `input_text` / `output_text` parts.
fn content_text(c: &Value) -> Result<String, ApiError> {
    match c {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for p in parts {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "input_text" | "output_text" | "text" => out.push(
                        p.get("text")
                            .and_then(Value::as_str)
                            .ok_or_else(|| bad("input", format!("an {kind} part needs its text")))?,
                    ),
                    other => {
                        return Err(bad(
                            "input",
                            format!(
                                "input parts of type {other:.40?} are not supported: this server \
                                 takes text only (input_text)"
                            ),
                        ));
                    }
                }
            }
            Ok(out.join("\n"))
        }
        _ => Err(bad("input", "a message's content must be a string or a list of parts")),
    }
}

/// `input` (and `instructions`, first) as chat messages. Function calls and their outputs
/// become an assistant turn's `tool_calls` and `tool` messages.
fn messages(input: &Value, instructions: Option<&str>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::new();
    if let Some(i) = instructions {
        out.push(json!({"role": "system", "content": i}));
    }
    let items = match input {
        Value::String(s) => {
            out.push(json!({"role": "user", "content": s}));
            return Ok(out);
        }
        Value::Array(items) => items,
        _ => return Err(bad("input", "input must be a string or a list of items")),
    };
    for (i, it) in items.iter().enumerate() {
        let kind = it.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = it.get("role").and_then(Value::as_str).ok_or_else(|| {
                    bad("input", format!("input[{i}] needs a role"))
                })?;
                let role = if role == "developer" { "system" } else { role };
                if !["system", "user", "assistant"].contains(&role) {
                    return Err(bad("input", format!("input[{i}] has role {role:.40?}")));
                }
                let text = content_text(it.get("content").unwrap_or(&Value::Null))?;
                out.push(json!({"role": role, "content": text}));
            }
            "function_call" => {
                let field = |k: &str| {
                    it.get(k).and_then(Value::as_str).ok_or_else(|| {
                        bad("input", format!("input[{i}] (function_call) needs {k}"))
                    })
                };
                let call = json!({"id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?}});
                // Calls in a row are one assistant turn.
                match out.last_mut() {
                    Some(Value::Object(m))
                        if m.get("role") == Some(&json!("assistant")) && m.contains_key("tool_calls") =>
                    {
                        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
                            calls.push(call);
                        }
                    }
                    _ => out.push(json!({"role": "assistant", "content": "", "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let id = it.get("call_id").and_then(Value::as_str).ok_or_else(|| {
                    bad("input", format!("input[{i}] (function_call_output) needs call_id"))
                })?;
                let output = match it.get("output") {
                    Some(Value::String(s)) => s.clone(),
                    Some(v) => content_text(v)?,
                    None => String::new(),
                };
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            other => {
                return Err(bad(
                    "input",
                    format!("input items of type {other:.40?} are not supported"),
                ));
            }
        }
    }
    Ok(out)
}

/// Responses' flat `{type: "function", name, description, parameters}` as chat tools.
fn chat_tools(tools: &Value) -> Result<Value, ApiError> {
    let Some(list) = tools.as_array() else {
        return Err(bad("tools", "tools must be a list"));
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return Err(bad(
                "tools",
                format!("tools[{i}] has type {kind:.40?}; only function tools are supported"),
            ));
        }
        let mut f = Map::new();
        for k in ["name", "description", "parameters", "strict"] {
            if let Some(v) = t.get(k) {
                f.insert(k.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Value::Array(out))
}

/// `text.format` as chat's `response_format`.
fn response_format(text: &Value) -> Result<Option<Value>, ApiError> {
    let Some(f) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    match f.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(json!({"type": "json_object"}))),
        Some("json_schema") => Ok(Some(json!({"type": "json_schema", "json_schema": {
            "name": f.get("name").cloned().unwrap_or(json!("output")),
            "schema": f.get("schema").cloned().unwrap_or(Value::Null),
            "strict": f.get("strict").cloned().unwrap_or(json!(false)),
        }}))),
        _ => Err(bad("text", "text.format.type must be text, json_object or json_schema")),
    }
}

/// A Responses body as the chat completions body it means.
pub fn to_chat_body(body: &Value) -> Result<Value, ApiError> {
    let Some(o) = body.as_object() else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    if o.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(bad(
            "previous_response_id",
            "previous_response_id is not supported: this server stores no responses; send the \
             whole conversation in input",
        ));
    }
    if o.get("background").and_then(Value::as_bool) == Some(true) {
        return Err(bad("background", "background responses are not supported"));
    }
    let input = o.get("input").ok_or_else(|| bad("input", "input is required"))?;
    let instructions = match o.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(bad("instructions", "instructions must be a string")),
    };
    let mut chat = Map::new();
    chat.insert("messages".into(), Value::Array(messages(input, instructions)?));
    for (from, to) in [
        ("model", "model"),
        ("max_output_tokens", "max_tokens"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
    ] {
        if let Some(v) = o.get(from).filter(|v| !v.is_null()) {
            chat.insert(to.into(), v.clone());
        }
    }
    if let Some(t) = o.get("tools").filter(|v| !v.is_null()) {
        chat.insert("tools".into(), chat_tools(t)?);
    }
    if let Some(c) = o.get("tool_choice").filter(|v| !v.is_null()) {
        let c = match c.get("name") {
            Some(name) if c.get("type") == Some(&json!("function")) => {
                json!({"type": "function", "function": {"name": name}})
            }
            _ => c.clone(),
        };
        chat.insert("tool_choice".into(), c);
    }
    if let Some(t) = o.get("text")
        && let Some(rf) = response_format(t)?
    {
        chat.insert("response_format".into(), rf);
    }
    Ok(Value::Object(chat))
}

/// What every form of one response shares.
#[derive(Debug, Clone)]
pub struct RespMeta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
}

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "output_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": 0},
    })
}

/// The `response` object; `usage` and `reason` once it is over.
pub fn response_json(
    m: &RespMeta,
    output: Vec<Value>,
    end: Option<(FinishReason, &Usage)>,
) -> Value {
    let (status, incomplete, usage) = match end {
        None => ("in_progress", Value::Null, Value::Null),
        Some((FinishReason::Length, u)) => (
            "incomplete",
            json!({"reason": "max_output_tokens"}),
            usage_json(u),
        ),
        Some((_, u)) => ("completed", Value::Null, usage_json(u)),
    };
    json!({
        "id": m.id,
        "object": "response",
        "created_at": m.created_at,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "model": m.model,
        "output": output,
        "parallel_tool_calls": true,
        "usage": usage,
    })
}

/// A message output item.
pub fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": status,
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    })
}

/// A function call output item.
pub fn call_item(id: &str, call_id: &str, name: &str, arguments: &str, status: &str) -> Value {
    json!({
        "type": "function_call",
        "id": id,
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    })
}

/// The output items of a whole answer: its text as one message (when there is text, or
/// nothing at all), then one item per call.
fn output(content: &str, calls: &[ToolCall], status: &str) -> Vec<Value> {
    let mut out = Vec::new();
    if !content.trim().is_empty() || calls.is_empty() {
        out.push(message_item(&new_id("msg"), content, status));
    }
    for c in calls {
        out.push(call_item(&new_id("fc"), &call_id(), &c.name, &c.arguments, "completed"));
    }
    out
}

pub async fn responses(st: State<Arc<ServerState>>, headers: HeaderMap, body: Body) -> Response {
    respond(st, headers, body)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// As the chat endpoint: body bounded, parse and template on the bounded blocking pool, the
/// status after the engine's first event.
async fn respond(
    State(st): State<Arc<ServerState>>,
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
        let chat = to_chat_body(&body)?;
        let parsed = openai::parse(Kind::Chat, &chat, &state.limits, state.shape())?;
        state.check_model(parsed.common.model.as_deref())?;
        let req = openai::to_request(&parsed, &state.lm, &state.limits)?;
        Ok::<_, ApiError>((parsed, req))
    })
    .await
    .map_err(|e| ApiError::internal(format!("the request task failed: {e}")))??;
    let mut sub = submit(&st.engine, req, Arc::clone(&st.metrics));
    let meta = RespMeta {
        id: new_id("resp"),
        created_at: unix_now(),
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
    let tools = ToolParse::for_plan(parsed.tools.as_ref(), &st.lm);
    if parsed.stream() {
        let stream = ResponsesStream::new(sub, meta, reasoning, tools);
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
    let (text, reason, usage) = collect(&mut sub).await?;
    let text = match reasoning {
        Some(parser) => parser.split_all(&text),
        None => Split {
            reasoning: String::new(),
            content: text,
        },
    };
    let (content, calls) = match tools {
        Some(t) => t.parse_all(&text.content),
        None => (text.content, Vec::new()),
    };
    let status = if reason == FinishReason::Length { "incomplete" } else { "completed" };
    let out = output(&content, &calls, status);
    Ok(errors::json_response(
        StatusCode::OK,
        &response_json(&meta, out, Some((reason, &usage))),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_translate_to_chat() {
        let c = to_chat_body(&json!({
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "instructions": "be brief", "max_output_tokens": 8, "store": true,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
        }))
        .expect("translates");
        assert_eq!(c["messages"][0], json!({"role": "system", "content": "be brief"}));
        assert_eq!(c["messages"][1], json!({"role": "user", "content": "hi"}));
        assert_eq!(c["max_tokens"], json!(8));
        assert_eq!(c["tools"][0]["function"]["name"], json!("f"));
        assert_eq!(c["tool_choice"]["function"]["name"], json!("f"));
        let e = to_chat_body(&json!({"input": "x", "previous_response_id": "resp_1"}))
            .expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("previous_response_id"));
        let e = to_chat_body(&json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "x"}]}]}))
        .expect_err("refused");
        assert!(e.message.contains("input_image"), "{}", e.message);
    }
}

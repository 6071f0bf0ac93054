//! `POST /v1/responses`, OpenAI's Responses API, over the chat path: the body is translated to
//! the chat completions body it means ([`to_chat_body`]: `input` and `instructions` to messages,
//! `max_output_tokens`, the flat function tools, `tool_choice`, `text.format`) and goes through
//! the same parse, template, admission and engine as `/v1/chat/completions`; the answer comes
//! back as a `response` object whole, or as its SSE events ([`super::responses_stream`]).
//!
//! A thinking model's reasoning comes back as a `reasoning` item ahead of the message (its text
//! as `reasoning_text` content, as vLLM returns it; `usage.output_tokens_details.reasoning_tokens`
//! counts it). `include: ["message.output_text.logprobs"]` (or `top_logprobs` above 0) gives the
//! answer's token log-probabilities on the message's `output_text`, in chat's entry shape.
//!
//! Fields it cannot honour are 400s naming them ([`super::unhonoured::check_responses`]); input
//! that is not text (`input_image`, `input_file`, ...) is a 400 naming `input`. `store` is
//! accepted and nothing is stored.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use tpslab_engine::sched::stop::FinishReason;

use super::answer::{Part, gather};
use super::errors::{self, ApiError};
use super::handlers::{prepare, sse};
use super::openai::Kind;
use super::responses_json::{
    End, RespMeta, call_item, message_item, new_id, reasoning_item, reasoning_tokens, renamed,
    response_json, text_part,
};
use super::responses_stream::ResponsesStream;
use super::state::{Peer, ServerState, unix_now};
use super::tools::call_id;

fn bad(param: &str, m: impl Into<String>) -> ApiError {
    ApiError::bad_param(param, m)
}

/// One input message's content: a string, or `input_text` / `output_text` parts.
fn content_text(i: usize, c: &Value) -> Result<String, ApiError> {
    match c {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => {
            let mut out = Vec::with_capacity(parts.len());
            for p in parts {
                let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
                match kind {
                    "input_text" | "output_text" | "text" => {
                        out.push(p.get("text").and_then(Value::as_str).ok_or_else(|| {
                            bad(
                                "input",
                                format!("input[{i}]: an {kind} part needs its text"),
                            )
                        })?);
                    }
                    other => {
                        return Err(bad(
                            "input",
                            format!(
                                "input[{i}] has a part of type {other:.40?}: this server takes \
                                 text only (input_text)"
                            ),
                        ));
                    }
                }
            }
            Ok(out.join("\n"))
        }
        _ => Err(bad(
            "input",
            format!("input[{i}]: a message's content must be a string or a list of parts"),
        )),
    }
}

/// `input[i]`'s string field `k`.
fn item_field<'a>(it: &'a Value, i: usize, kind: &str, k: &str) -> Result<&'a str, ApiError> {
    it.get(k).and_then(Value::as_str).ok_or_else(|| {
        bad(
            "input",
            format!("input[{i}] ({kind}) needs {k} as a string"),
        )
    })
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
        Value::Array(items) if !items.is_empty() => items,
        _ => {
            return Err(bad(
                "input",
                "input must be a string or a non-empty list of items",
            ));
        }
    };
    for (i, it) in items.iter().enumerate() {
        let kind = it.get("type").and_then(Value::as_str).unwrap_or("message");
        match kind {
            "message" => {
                let role = item_field(it, i, kind, "role")?;
                let role = if role == "developer" { "system" } else { role };
                if !["system", "user", "assistant"].contains(&role) {
                    return Err(bad("input", format!("input[{i}] has role {role:.40?}")));
                }
                let text = content_text(i, it.get("content").unwrap_or(&Value::Null))?;
                out.push(json!({"role": role, "content": text}));
            }
            "function_call" => {
                let call = json!({"id": item_field(it, i, kind, "call_id")?, "type": "function",
                    "function": {"name": item_field(it, i, kind, "name")?,
                                 "arguments": item_field(it, i, kind, "arguments")?}});
                // Calls in a row are one assistant turn.
                match out.last_mut() {
                    Some(Value::Object(m))
                        if m.get("role") == Some(&json!("assistant"))
                            && m.contains_key("tool_calls") =>
                    {
                        if let Some(Value::Array(calls)) = m.get_mut("tool_calls") {
                            calls.push(call);
                        }
                    }
                    _ => out
                        .push(json!({"role": "assistant", "content": null, "tool_calls": [call]})),
                }
            }
            "function_call_output" => {
                let id = item_field(it, i, kind, "call_id")?;
                let output = content_text(i, it.get("output").unwrap_or(&Value::Null))?;
                out.push(json!({"role": "tool", "tool_call_id": id, "content": output}));
            }
            other => {
                return Err(bad(
                    "input",
                    format!(
                        "input[{i}] is of type {other:.40?}; this server takes message, \
                         function_call and function_call_output items"
                    ),
                ));
            }
        }
    }
    Ok(out)
}

/// Responses' flat `{type: "function", name, description, parameters}` as chat tools; built-in
/// tools (`web_search`, `file_search`, ...) are refused by name.
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
                format!(
                    "tools[{i}] is the built-in tool {kind:.40?}, which this server does not \
                     have; only function tools are supported"
                ),
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
        _ => Err(bad(
            "text",
            "text.format.type must be text, json_object or json_schema",
        )),
    }
}

/// A Responses body as the chat completions body it means.
pub fn to_chat_body(body: Value) -> Result<Value, ApiError> {
    let Some(o) = body.as_object() else {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    };
    super::unhonoured::check_responses(&body)?;
    let input = o
        .get("input")
        .ok_or_else(|| bad("input", "input is required"))?;
    let instructions = match o.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return Err(bad("instructions", "instructions must be a string")),
    };
    let mut chat = Map::new();
    chat.insert(
        "messages".into(),
        Value::Array(messages(input, instructions)?),
    );
    for (from, to) in [
        ("max_output_tokens", "max_tokens"),
        ("model", "model"),
        ("temperature", "temperature"),
        ("top_p", "top_p"),
        ("stream", "stream"),
        ("parallel_tool_calls", "parallel_tool_calls"),
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
    if let Some(effort) = o.get("reasoning").and_then(|r| r.get("effort")) {
        chat.insert("reasoning_effort".into(), effort.clone());
    }
    if let Some(t) = o.get("text").filter(|v| !v.is_null())
        && let Some(rf) = response_format(t)?
    {
        chat.insert("response_format".into(), rf);
    }
    logprobs(o, &mut chat)?;
    Ok(Value::Object(chat))
}

/// What `include` may name here.
pub const INCLUDE_LOGPROBS: &str = "message.output_text.logprobs";

/// `include: ["message.output_text.logprobs"]` and `top_logprobs` as chat's `logprobs` and
/// `top_logprobs`: either asks for the answer's log-probabilities. Other `include` entries name
/// output this server does not compute (encrypted reasoning, built-in tools' results): a 400.
fn logprobs(o: &Map<String, Value>, chat: &mut Map<String, Value>) -> Result<(), ApiError> {
    let mut on = false;
    match o.get("include") {
        None | Some(Value::Null) => {}
        Some(Value::Array(list)) => {
            for v in list {
                match v.as_str() {
                    Some(INCLUDE_LOGPROBS) => on = true,
                    Some(other) => {
                        return Err(bad(
                            "include",
                            format!(
                                "include names {other:.60?}, which this server does not compute; \
                                 it can include {INCLUDE_LOGPROBS}"
                            ),
                        ));
                    }
                    None => return Err(bad("include", "include must be a list of strings")),
                }
            }
        }
        Some(_) => return Err(bad("include", "include must be a list of strings")),
    }
    if let Some(k) = o.get("top_logprobs").filter(|v| !v.is_null()) {
        on |= k.as_u64().is_some_and(|k| k > 0);
        chat.insert("top_logprobs".into(), k.clone());
    }
    if on {
        chat.insert("logprobs".into(), json!(true));
    }
    Ok(())
}

pub async fn responses(
    st: State<Arc<ServerState>>,
    peer: Option<axum::Extension<Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    respond(st, peer.map(|axum::Extension(p)| p), headers, body)
        .await
        .unwrap_or_else(|e| renamed(e).into_response())
}

/// The chat path's preparation, then the answer as a `response` object or its events.
async fn respond(
    State(st): State<Arc<ServerState>>,
    peer: Option<Peer>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let mut started = prepare(&st, Kind::Chat, peer, &headers, body, to_chat_body).await?;
    let meta = RespMeta {
        id: new_id("resp"),
        created_at: unix_now(),
        model: st.model_id.clone(),
    };
    if started.parsed.stream() {
        let events = ResponsesStream::new(started.choices, started.spec, meta);
        return Ok(sse(Body::from_stream(events)));
    }
    let (outs, usage) = gather(&mut started.choices, &started.spec).await?;
    let Some(w) = outs.into_iter().next() else {
        return Err(ApiError::internal("the answer has no choice"));
    };
    let reason = w.finish.unwrap_or(FinishReason::Stop);
    let status = if reason == FinishReason::Length {
        "incomplete"
    } else {
        "completed"
    };
    // The reasoning, the text as one message (when there is text, or nothing at all), then
    // one item per call.
    let mut output = Vec::new();
    if !w.text.reasoning.is_empty() {
        output.push(reasoning_item(
            &new_id("rs"),
            &w.text.reasoning,
            "completed",
        ));
    }
    if !w.text.content.trim().is_empty() || w.calls.is_empty() {
        let lp = w
            .logprobs
            .as_ref()
            .and_then(Part::value)
            .map(|l| &l["content"]);
        let part = text_part(&w.text.content, lp);
        output.push(message_item(&new_id("msg"), part, status));
    }
    for c in &w.calls {
        output.push(call_item(
            &new_id("fc"),
            &call_id(),
            &c.name,
            &c.arguments,
            "completed",
        ));
    }
    let end = End {
        reason,
        usage: &usage,
        reasoning_tokens: reasoning_tokens(&started.spec.lm, &w.text.reasoning),
    };
    Ok(errors::json_response(
        StatusCode::OK,
        &response_json(&meta, output, Some(end)),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_translate_to_chat() {
        let c = to_chat_body(json!({
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "instructions": "be brief", "max_output_tokens": 8, "store": true,
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "f"},
        }))
        .expect("translates");
        assert_eq!(
            c["messages"][0],
            json!({"role": "system", "content": "be brief"})
        );
        assert_eq!(c["messages"][1], json!({"role": "user", "content": "hi"}));
        assert_eq!(c["max_tokens"], json!(8));
        assert_eq!(c["tools"][0]["function"]["name"], json!("f"));
        assert_eq!(c["tool_choice"]["function"]["name"], json!("f"));
        let e = to_chat_body(json!({"input": "x", "previous_response_id": "resp_1"}))
            .expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("previous_response_id"));
        let e = to_chat_body(json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "x"}]}]}))
        .expect_err("refused");
        assert!(e.message.contains("input_image"), "{}", e.message);
        let e = to_chat_body(json!({"input": "x", "tools": [{"type": "web_search"}]}))
            .expect_err("refused");
        assert_eq!(e.param.as_deref(), Some("tools"));
        let e = renamed(ApiError::bad_param(
            "max_tokens",
            "max_tokens must be at least 1",
        ));
        assert_eq!(e.param.as_deref(), Some("max_output_tokens"));
        assert_eq!(e.message, "max_output_tokens must be at least 1");
    }
}

//! The `response` object of `/v1/responses` and its output items, as the whole answer and the
//! streamed events both write them: ids, items, usage, and errors of the chat path renamed to
//! the Responses body's own fields.

use serde_json::{Value, json};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::Usage;

use super::errors::ApiError;
use super::tools::random_hex;

/// A fresh id: `prefix` and 24 random hex digits.
pub fn new_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_hex())
}

/// Responses fields whose chat name differs, so an error of the chat parse names what the
/// client sent.
const RENAMED: [(&str, &str); 3] = [
    ("max_output_tokens", "max_tokens"),
    ("input", "messages"),
    ("text", "response_format"),
];

/// An error of the chat path, in the Responses body's own field names.
pub fn renamed(mut e: ApiError) -> ApiError {
    if let Some(p) = &e.param
        && let Some((ours, chat)) = RENAMED.iter().find(|(_, c)| c == p)
    {
        e.message = e.message.replace(chat, ours);
        e.param = Some((*ours).to_string());
    }
    e
}

/// What every form of one response shares.
#[derive(Debug, Clone)]
pub struct RespMeta {
    pub id: String,
    pub created_at: u64,
    pub model: String,
}

/// The tokens of an answer's reasoning: its text tokenized again (the model's own tokens, as
/// long as it wrote them as the tokenizer would).
pub fn reasoning_tokens(lm: &LoadedModel, reasoning: &str) -> usize {
    if reasoning.is_empty() {
        return 0;
    }
    lm.tokenizer
        .encode(reasoning, false)
        .map_or(0, |ids| ids.len())
}

pub fn usage_json(u: &Usage, reasoning_tokens: usize) -> Value {
    json!({
        "input_tokens": u.prompt_tokens,
        "output_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
    })
}

/// How a response ended.
#[derive(Clone, Copy)]
pub struct End<'a> {
    pub reason: FinishReason,
    pub usage: &'a Usage,
    pub reasoning_tokens: usize,
}

/// The `response` object; `usage` and its status once it is over.
pub fn response_json(m: &RespMeta, output: Vec<Value>, end: Option<End<'_>>) -> Value {
    let (status, incomplete, usage) = match end {
        None => ("in_progress", Value::Null, Value::Null),
        Some(e) if e.reason == FinishReason::Length => (
            "incomplete",
            json!({"reason": "max_output_tokens"}),
            usage_json(e.usage, e.reasoning_tokens),
        ),
        Some(e) => (
            "completed",
            Value::Null,
            usage_json(e.usage, e.reasoning_tokens),
        ),
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

/// A message's `output_text` part; its log-probabilities when they were asked for.
pub fn text_part(text: &str, logprobs: Option<&Value>) -> Value {
    let mut part = json!({"type": "output_text", "text": text, "annotations": []});
    if let Some(lp) = logprobs {
        part["logprobs"] = lp.clone();
    }
    part
}

/// A message output item.
pub fn message_item(id: &str, part: Value, status: &str) -> Value {
    json!({
        "type": "message",
        "id": id,
        "role": "assistant",
        "status": status,
        "content": [part],
    })
}

/// A reasoning output item: the model's reasoning as `reasoning_text` content.
pub fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": id,
        "status": status,
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
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

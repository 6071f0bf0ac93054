//! OpenAI's response shapes for `/v1/completions` and `/v1/chat/completions`: the whole
//! response ([`full_response`]), its stream chunks ([`chunk`], [`usage_chunk`]) and usage, each
//! choice as [`ChoiceOut`] under the request's [`Meta`].

use serde_json::{Value, json};
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::Usage;
use tpslab_engine::text::reasoning::Split;

use super::openai::Kind;

pub fn usage_json(u: &Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt_tokens,
        "completion_tokens": u.completion_tokens,
        "total_tokens": u.prompt_tokens + u.completion_tokens,
    })
}

/// What the response headers carry: id, creation time and model of one request.
#[derive(Debug, Clone)]
pub struct Meta {
    pub kind: Kind,
    pub id: String,
    pub created: u64,
    pub model: String,
}

/// One choice of a response or of a chunk: its text (a chat answer's reasoning apart), its
/// finish reason once it has one, its tokens' log-probabilities when they were asked for, and
/// its tool calls (whole, or a chunk's pieces of them).
pub struct ChoiceOut<'a> {
    pub index: usize,
    pub text: &'a Split,
    pub finish: Option<FinishReason>,
    pub logprobs: Option<Value>,
    pub tool_calls: Option<Value>,
    /// The choice made a call: it finishes with `"tool_calls"` (unless cut short by length).
    pub called: bool,
    /// vLLM's `prompt_logprobs` of a whole answer, when asked for.
    pub prompt_logprobs: Option<Value>,
}

impl ChoiceOut<'_> {
    fn finish_reason(&self) -> Option<&'static str> {
        self.finish.map(|f| match f {
            FinishReason::Stop if self.called => "tool_calls",
            f => f.as_str(),
        })
    }
}

/// The whole non-streamed response: a chat answer's reasoning, when it has any, as
/// `message.reasoning_content` (llama-server's and vLLM's field).
/// vLLM's `prompt_logprobs`, when asked for, lie beside the choices (chat) or in each
/// (completions).
pub fn full_response(m: &Meta, choices: Vec<ChoiceOut<'_>>, usage: &Usage) -> Value {
    let mut prompt_logprobs = None;
    let choices: Vec<Value> = choices
        .into_iter()
        .map(|mut c| {
            let reason = c.finish_reason();
            let logprobs = c.logprobs.unwrap_or(Value::Null);
            match m.kind {
                Kind::Chat => {
                    let mut message = json!({"role": "assistant", "content": c.text.content});
                    if !c.text.reasoning.is_empty() {
                        message["reasoning_content"] = json!(c.text.reasoning);
                    }
                    if let Some(calls) = c.tool_calls {
                        // OpenAI's shape: no text beside the calls is a null content.
                        if c.text.content.trim().is_empty() {
                            message["content"] = Value::Null;
                        }
                        message["tool_calls"] = calls;
                    }
                    if prompt_logprobs.is_none() {
                        prompt_logprobs = c.prompt_logprobs.take();
                    }
                    json!({
                        "index": c.index,
                        "message": message,
                        "logprobs": logprobs,
                        "finish_reason": reason,
                    })
                }
                Kind::Completion => {
                    let mut v = json!({
                        "index": c.index,
                        "text": c.text.content,
                        "logprobs": logprobs,
                        "finish_reason": reason,
                    });
                    if let Some(p) = c.prompt_logprobs.take() {
                        v["prompt_logprobs"] = p;
                    }
                    v
                }
            }
        })
        .collect();
    let mut v = json!({
        "id": m.id,
        "object": m.kind.object(),
        "created": m.created,
        "model": m.model,
        "choices": choices,
        "usage": usage_json(usage),
    });
    if let Some(p) = prompt_logprobs {
        v["prompt_logprobs"] = p;
    }
    v
}

/// One streamed chunk of one choice: `role` on a chat choice's first chunk, the text as a
/// delta (reasoning as `delta.reasoning_content`), the finish reason on its last. With
/// `include_usage` every chunk carries `"usage": null` (OpenAI's shape).
pub fn chunk(m: &Meta, first: bool, c: ChoiceOut<'_>, usage_null: bool) -> Value {
    let reason = c.finish_reason();
    let text = c.text;
    let logprobs = c.logprobs.unwrap_or(Value::Null);
    let (object, choice) = match m.kind {
        Kind::Chat => {
            let mut delta = json!({});
            if first {
                delta["role"] = json!("assistant");
            }
            // The first chunk names the role with an empty content unless it carries reasoning.
            if !text.content.is_empty() || (first && text.reasoning.is_empty()) {
                delta["content"] = json!(text.content);
            }
            if !text.reasoning.is_empty() {
                delta["reasoning_content"] = json!(text.reasoning);
            }
            if let Some(calls) = c.tool_calls {
                delta["tool_calls"] = calls;
            }
            (
                "chat.completion.chunk",
                json!({"index": c.index, "delta": delta, "logprobs": logprobs,
                       "finish_reason": reason}),
            )
        }
        Kind::Completion => (
            "text_completion",
            json!({"index": c.index, "text": text.content, "logprobs": logprobs,
                   "finish_reason": reason}),
        ),
    };
    let mut v = json!({
        "id": m.id,
        "object": object,
        "created": m.created,
        "model": m.model,
        "choices": [choice],
    });
    if usage_null {
        v["usage"] = Value::Null;
    }
    v
}

/// The last chunk under `stream_options.include_usage`: no choices, the usage.
pub fn usage_chunk(m: &Meta, usage: &Usage) -> Value {
    let object = match m.kind {
        Kind::Chat => "chat.completion.chunk",
        Kind::Completion => "text_completion",
    };
    json!({
        "id": m.id,
        "object": object,
        "created": m.created,
        "model": m.model,
        "choices": [],
        "usage": usage_json(usage),
    })
}

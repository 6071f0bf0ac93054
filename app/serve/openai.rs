//! OpenAI's request and response shapes for `/v1/completions` and `/v1/chat/completions`, and
//! their translation to an engine [`Request`] (prompt tokens, sampling, stop criteria).

use serde::Deserialize;
use serde_json::{Value, json};
use tpslab_engine::chat::ChatMessage;
use tpslab_engine::engine::{Request, Usage};
use tpslab_engine::generate::LoadedModel;
use tpslab_engine::sampler::SamplingParams;
use tpslab_engine::stop::FinishReason;

use super::errors::{ApiError, typed};

/// `stop`: one string or a list of them.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields both endpoints share: model, sampling, limits, streaming.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<u32>,
    pub max_completion_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// vLLM's extension; 0 or -1 = off.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub stop: Option<StopField>,
    pub seed: Option<u64>,
    pub n: Option<u32>,
    pub frequency_penalty: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// vLLM's extension: lower runs first under the priority policy.
    pub priority: Option<i32>,
}

/// A message's content: a string, or a list of parts of which the text ones are used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
}

#[derive(Debug, Clone, Deserialize)]
struct ChatBody {
    messages: Vec<Message>,
}

/// `prompt`: a string, a list holding one string, or token ids.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
}

#[derive(Debug, Clone, Deserialize)]
struct CompletionBody {
    prompt: PromptField,
}

/// Which endpoint a request came through (decides the prompt and the response shape).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Chat,
    Completion,
}

impl Kind {
    pub fn object(self) -> &'static str {
        match self {
            Kind::Chat => "chat.completion",
            Kind::Completion => "text_completion",
        }
    }

    pub fn id_prefix(self) -> &'static str {
        match self {
            Kind::Chat => "chatcmpl",
            Kind::Completion => "cmpl",
        }
    }
}

/// A request read and checked, not yet tokenized.
#[derive(Debug, Clone)]
pub struct Parsed {
    pub kind: Kind,
    pub common: Common,
    pub messages: Vec<ChatMessage>,
    pub prompt_text: Option<String>,
    pub prompt_tokens: Option<Vec<u32>>,
    pub sampling: SamplingParams,
}

impl Parsed {
    pub fn stream(&self) -> bool {
        self.common.stream.unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.common
            .stream_options
            .as_ref()
            .is_some_and(|o| o.include_usage)
    }

    pub fn max_tokens(&self) -> Option<u32> {
        self.common.max_completion_tokens.or(self.common.max_tokens)
    }
}

/// Reads a body of either endpoint: the types (422) and then the values (400).
pub fn parse(kind: Kind, body: &Value) -> Result<Parsed, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let common: Common = typed(body)?;
    let (mut messages, mut prompt_text, mut prompt_tokens) = (Vec::new(), None, None);
    match kind {
        Kind::Chat => {
            let b: ChatBody = typed(body)?;
            if b.messages.is_empty() {
                return Err(ApiError::bad_param(
                    "messages",
                    "messages must not be empty",
                ));
            }
            messages = b.messages.into_iter().map(to_chat).collect();
        }
        Kind::Completion => match typed::<CompletionBody>(body)?.prompt {
            PromptField::Text(t) => prompt_text = Some(t),
            PromptField::Texts(mut t) if t.len() == 1 => prompt_text = t.pop(),
            PromptField::Texts(_) => {
                return Err(ApiError::bad_param(
                    "prompt",
                    "only one prompt per request is supported",
                ));
            }
            PromptField::Tokens(t) => prompt_tokens = Some(t),
        },
    }
    let sampling = sampling(&common)?;
    check_limits(&common)?;
    Ok(Parsed {
        kind,
        common,
        messages,
        prompt_text,
        prompt_tokens,
        sampling,
    })
}

fn to_chat(m: Message) -> ChatMessage {
    let content = match m.content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => parts
            .into_iter()
            .filter(|p| p.kind == "text")
            .filter_map(|p| p.text)
            .collect::<Vec<_>>()
            .join("\n"),
    };
    ChatMessage::new(m.role, content)
}

fn check_limits(c: &Common) -> Result<(), ApiError> {
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::bad_param("n", "only n = 1 is supported"));
    }
    for (name, v) in [
        ("max_tokens", c.max_tokens),
        ("max_completion_tokens", c.max_completion_tokens),
    ] {
        if v == Some(0) {
            return Err(ApiError::bad_param(
                name,
                format!("{name} must be at least 1"),
            ));
        }
    }
    Ok(())
}

/// OpenAI's defaults where a field is absent (temperature 1), checked as the engine would.
fn sampling(c: &Common) -> Result<SamplingParams, ApiError> {
    let s = SamplingParams {
        temperature: c.temperature.unwrap_or(1.0),
        top_k: c
            .top_k
            .map_or(0, |k| u32::try_from(k.max(0)).unwrap_or(u32::MAX)),
        top_p: c.top_p.unwrap_or(1.0),
        min_p: c.min_p.unwrap_or(0.0),
        repetition_penalty: c.repetition_penalty.unwrap_or(1.0),
        frequency_penalty: c.frequency_penalty.unwrap_or(0.0),
        presence_penalty: c.presence_penalty.unwrap_or(0.0),
        seed: c.seed,
    };
    s.validate()
        .map_err(|e| ApiError::bad_param(e.name, e.to_string()))?;
    Ok(s)
}

/// Tokenizes the prompt and builds the engine request; a prompt that leaves no room for
/// `max_tokens` in the context is a 400 (`context_length_exceeded`), as in vLLM.
pub fn to_request(p: &Parsed, lm: &LoadedModel) -> Result<Request, ApiError> {
    let tokens = match (&p.prompt_tokens, &p.prompt_text) {
        (Some(t), _) => {
            let vocab = lm.model.cfg.vocab;
            if let Some(bad) = t.iter().find(|&&id| id as usize >= vocab) {
                return Err(ApiError::bad_param(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
            t.clone()
        }
        (None, Some(text)) => lm
            .raw_prompt(text)
            .map_err(|e| ApiError::bad_param("prompt", e.to_string()))?,
        (None, None) => lm
            .chat_prompt(&p.messages)
            .map_err(|e| ApiError::bad_param("messages", e.to_string()))?,
    };
    if tokens.is_empty() {
        return Err(ApiError::bad_param("prompt", "the prompt is empty"));
    }
    let ctx = lm.model.cfg.context_len;
    let max = p.max_tokens().map(|m| m as usize);
    let wanted = tokens.len() + max.unwrap_or(1);
    if tokens.len() >= ctx || wanted > ctx {
        return Err(ApiError::context_exceeded(format!(
            "This model's maximum context length is {ctx} tokens. However, you requested {wanted} \
             tokens ({} in the prompt, {} for the completion). Please reduce the length of the \
             prompt or max_tokens.",
            tokens.len(),
            max.unwrap_or(1)
        )));
    }
    let mut stop = lm.default_stop(max);
    stop.stop_strings = match &p.common.stop {
        None => Vec::new(),
        Some(StopField::One(s)) => vec![s.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    stop.ignore_eos = p.common.ignore_eos.unwrap_or(false);
    Ok(Request {
        prompt: tokens,
        sampling: p.sampling.clone(),
        stop,
        priority: p.common.priority.unwrap_or(0),
    })
}

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

/// The whole non-streamed response.
pub fn full_response(m: &Meta, text: &str, reason: FinishReason, usage: &Usage) -> Value {
    let choice = match m.kind {
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": reason.as_str(),
        }),
        Kind::Completion => json!({
            "index": 0,
            "text": text,
            "logprobs": null,
            "finish_reason": reason.as_str(),
        }),
    };
    json!({
        "id": m.id,
        "object": m.kind.object(),
        "created": m.created,
        "model": m.model,
        "choices": [choice],
        "usage": usage_json(usage),
    })
}

/// One streamed chunk: `role` on the first chat chunk, `text` as a delta, `finish` on the last.
/// With `include_usage` every chunk carries `"usage": null` (OpenAI's shape).
pub fn chunk(
    m: &Meta,
    first: bool,
    text: &str,
    finish: Option<FinishReason>,
    usage_null: bool,
) -> Value {
    let reason = finish.map(FinishReason::as_str);
    let (object, choice) = match m.kind {
        Kind::Chat => {
            let delta = match (first, finish.is_some() && text.is_empty()) {
                (true, _) => json!({"role": "assistant", "content": text}),
                (false, true) => json!({}),
                (false, false) => json!({"content": text}),
            };
            (
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason}),
            )
        }
        Kind::Completion => (
            "text_completion",
            json!({"index": 0, "text": text, "logprobs": null, "finish_reason": reason}),
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

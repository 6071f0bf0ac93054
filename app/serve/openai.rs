//! OpenAI's request and response shapes for `/v1/completions` and `/v1/chat/completions`, the
//! caps a request is held to ([`Limits`]), and the translation to an engine [`Request`] (prompt
//! tokens, sampling, stop criteria).

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::{Value, json};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::admission::Admission;
use tpslab_engine::serving::engine::{Request, Usage};
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::{ChatMessage, RenderOptions};
use tpslab_engine::text::reasoning::{ReasoningParser, Split};

use super::chat_input::{self, ChatBody};
use super::errors::{ApiError, typed};
use super::limits::Limits;
use super::structured::{self, Asked};
use super::tools::{self, ToolPlan};

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
    /// Token id (as a string) to a bias in [-100, 100].
    pub logit_bias: Option<HashMap<String, f64>>,
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
    /// How the chat template renders `messages` (tools, `enable_thinking`, the clock).
    pub options: RenderOptions,
    pub prompt_text: Option<String>,
    pub prompt_tokens: Option<Vec<u32>>,
    pub sampling: SamplingParams,
    /// Structured output (`response_format`, `guided_*`, `json_schema`, `grammar`).
    pub constraint: Option<Asked>,
    /// `tools` and `tool_choice` of a chat request (an enforced choice is in `constraint`).
    pub tools: Option<ToolPlan>,
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

/// What the request checks need to know of the model being served.
#[derive(Debug, Clone, Copy)]
pub struct ModelShape {
    pub context_len: usize,
    /// Rows of the embedding: the token ids the model can take.
    pub vocab: usize,
}

/// Reads a body of either endpoint: the types (422), then the values and the caps (400).
/// Nothing here tokenizes or renders: a request over a cap costs no more than its parse.
pub fn parse(
    kind: Kind,
    body: &Value,
    limits: &Limits,
    shape: ModelShape,
) -> Result<Parsed, ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the body must be a JSON object"));
    }
    let common: Common = typed(body)?;
    let (mut messages, mut prompt_text, mut prompt_tokens) = (Vec::new(), None, None);
    let mut options = chat_input::default_options();
    match kind {
        Kind::Chat => {
            let b: ChatBody = typed(body)?;
            let bytes = b.text_len();
            check_prompt_bytes("messages", bytes, limits)?;
            (messages, options) = b.into_chat()?;
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
    if let Some(t) = &prompt_text {
        check_prompt_bytes("prompt", t.len(), limits)?;
    }
    let sampling = sampling(&common)?;
    check_limits(&common, limits, shape)?;
    let mut constraint = structured::asked(body)?;
    let tools = match kind {
        Kind::Chat => tools::plan(body, constraint.as_ref())?,
        Kind::Completion => None,
    };
    if let Some(c) = tools.as_ref().and_then(ToolPlan::constraint) {
        constraint = Some(c);
    }
    Ok(Parsed {
        kind,
        common,
        messages,
        options,
        prompt_text,
        prompt_tokens,
        sampling,
        constraint,
        tools,
    })
}

pub(super) fn check_prompt_bytes(
    param: &str,
    bytes: usize,
    limits: &Limits,
) -> Result<(), ApiError> {
    if bytes > limits.max_prompt_bytes {
        return Err(ApiError::over_cap(
            param,
            format!(
                "the {param} text is {bytes} bytes; this server takes at most {} \
                 (--max-prompt-bytes)",
                limits.max_prompt_bytes
            ),
        ));
    }
    Ok(())
}

/// The stop strings of a request, as given.
fn stop_list(c: &Common) -> &[String] {
    match &c.stop {
        None => &[],
        Some(StopField::One(s)) => std::slice::from_ref(s),
        Some(StopField::Many(v)) => v,
    }
}

fn check_limits(c: &Common, l: &Limits, shape: ModelShape) -> Result<(), ApiError> {
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::over_cap(
            "n",
            format!("n = {n} is not supported: this server returns one choice (n = 1)"),
        ));
    }
    for (name, v) in [
        ("max_tokens", c.max_tokens),
        ("max_completion_tokens", c.max_completion_tokens),
    ] {
        match v {
            Some(0) => {
                return Err(ApiError::bad_param(
                    name,
                    format!("{name} must be at least 1"),
                ));
            }
            Some(m) if m as usize >= shape.context_len => {
                return Err(ApiError::over_cap(
                    name,
                    format!(
                        "{name} = {m} does not fit: the model's context holds {} tokens, \
                         prompt included",
                        shape.context_len
                    ),
                ));
            }
            _ => {}
        }
    }
    check_stop(stop_list(c), l)?;
    if let Some(bias) = &c.logit_bias {
        check_logit_bias(bias, l, shape)?;
    }
    if let Some(p) = c.priority
        && !(l.min_priority..=l.max_priority).contains(&p)
    {
        return Err(ApiError::over_cap(
            "priority",
            format!(
                "priority {p} is outside the range this server allows, {} to {} (lower runs \
                 first; the window's own chat runs at {})",
                l.min_priority,
                l.max_priority,
                super::limits::WINDOW_CHAT_PRIORITY
            ),
        ));
    }
    Ok(())
}

fn check_stop(stop: &[String], l: &Limits) -> Result<(), ApiError> {
    if stop.len() > l.max_stop {
        return Err(ApiError::over_cap(
            "stop",
            format!(
                "{} stop strings; this server takes at most {} (--max-stop)",
                stop.len(),
                l.max_stop
            ),
        ));
    }
    if let Some((i, s)) = stop
        .iter()
        .enumerate()
        .find(|(_, s)| s.len() > l.max_stop_bytes)
    {
        return Err(ApiError::over_cap(
            "stop",
            format!(
                "stop string {i} is {} bytes; this server takes at most {} (--max-stop-bytes)",
                s.len(),
                l.max_stop_bytes
            ),
        ));
    }
    Ok(())
}

/// Entries past the cap, ids the model lacks and values outside OpenAI's [-100, 100] are
/// refused. The sampler applies no per-token bias, so a non-zero bias is refused too rather
/// than silently ignored.
fn check_logit_bias(
    bias: &HashMap<String, f64>,
    l: &Limits,
    shape: ModelShape,
) -> Result<(), ApiError> {
    let bad = |m: String| Err(ApiError::over_cap("logit_bias", m));
    if bias.len() > l.max_logit_bias {
        return bad(format!(
            "{} logit_bias entries; this server takes at most {} (--max-logit-bias)",
            bias.len(),
            l.max_logit_bias
        ));
    }
    for (k, &v) in bias {
        if !k.parse::<u32>().is_ok_and(|id| (id as usize) < shape.vocab) {
            return bad(format!(
                "logit_bias key {k:.40?} is not a token id of this model (0 to {})",
                shape.vocab.saturating_sub(1)
            ));
        }
        if !(v.is_finite() && (-100.0..=100.0).contains(&v)) {
            return bad(format!("logit_bias[{k}] = {v} is outside [-100, 100]"));
        }
    }
    if bias.values().any(|&v| v != 0.0) {
        return Err(ApiError::bad_param(
            "logit_bias",
            "logit_bias is not supported by this server (send no entries, or zeros)",
        ));
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

/// Tokenizes the prompt and builds the engine request, with the splitter of a chat answer's
/// reasoning (started inside it when the prompt opened it). Blocking (the chat template and the
/// tokenizer): call it off the async runtime. The request is then put to the engine's own
/// admission against the model (an empty prompt, the context, the vocabulary: a prompt past
/// the context is a 400 `context_length_exceeded`, as in vLLM), so what cannot run is never
/// queued; the engine asks the same question at submit with its KV pool, and that refusal
/// maps the same way (`ApiError::refused`).
pub fn to_request(
    p: &Parsed,
    lm: &LoadedModel,
    limits: &Limits,
) -> Result<(Request, Option<ReasoningParser>), ApiError> {
    let (tokens, reasoning) = match (&p.prompt_tokens, &p.prompt_text) {
        (Some(t), _) => (t.clone(), None),
        (None, Some(text)) => (
            lm.raw_prompt(text)
                .map_err(|e| ApiError::bad_param("prompt", e.to_string()))?,
            None,
        ),
        // Any template error (a budget it ran past included) is the request's: 400 with the
        // engine's message.
        (None, None) => {
            let prompt = chat_input::chat_prompt(lm, &p.messages, &p.options)
                .map_err(|e| ApiError::bad_param("messages", e.to_string()))?;
            (prompt.tokens, Some(prompt.reasoning))
        }
    };
    let max = p.max_tokens().map(|m| m as usize);
    // Omitted: the engine gives as many as fit the context and the KV pool.
    let mut stop = lm.default_stop(max);
    stop.stop_strings = stop_list(&p.common).to_vec();
    stop.ignore_eos = p.common.ignore_eos.unwrap_or(false);
    let req = Request {
        prompt: tokens,
        sampling: p.sampling.clone(),
        stop,
        priority: p
            .common
            .priority
            .unwrap_or_else(|| limits.default_priority()),
        constraint: p
            .constraint
            .as_ref()
            .map(|a| structured::compile(lm, a))
            .transpose()?,
    };
    Admission::for_model(&lm.model.cfg)
        .check(&req)
        .map_err(|e| ApiError::refused(&e))?;
    Ok((req, reasoning))
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

/// The whole non-streamed response: a chat answer's reasoning, when it has any, as
/// `message.reasoning_content` (llama-server's and vLLM's field).
pub fn full_response(m: &Meta, text: &Split, reason: FinishReason, usage: &Usage) -> Value {
    let choice = match m.kind {
        Kind::Chat => {
            let mut message = json!({"role": "assistant", "content": text.content});
            if !text.reasoning.is_empty() {
                message["reasoning_content"] = json!(text.reasoning);
            }
            json!({
                "index": 0,
                "message": message,
                "logprobs": null,
                "finish_reason": reason.as_str(),
            })
        }
        Kind::Completion => json!({
            "index": 0,
            "text": text.content,
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

/// One streamed chunk: `role` on the first chat chunk, `text` as a delta (reasoning as
/// `delta.reasoning_content`), `finish` on the last. With `include_usage` every chunk carries
/// `"usage": null` (OpenAI's shape).
pub fn chunk(
    m: &Meta,
    first: bool,
    text: &Split,
    finish: Option<FinishReason>,
    usage_null: bool,
) -> Value {
    let reason = finish.map(FinishReason::as_str);
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
            (
                "chat.completion.chunk",
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason}),
            )
        }
        Kind::Completion => (
            "text_completion",
            json!({"index": 0, "text": text.content, "logprobs": null, "finish_reason": reason}),
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

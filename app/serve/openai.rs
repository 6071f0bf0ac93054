//! OpenAI's request shapes for `/v1/completions` and `/v1/chat/completions`, the caps a request
//! is held to ([`Limits`]), and the translation to an engine [`Request`] (prompt tokens,
//! sampling, stop criteria). The responses' shapes are `openai_out`'s.

use std::collections::HashMap;

use serde::Deserialize;
use serde_json::Value;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::loaded::LoadError;
use tpslab_engine::sched::ClientId;
use tpslab_engine::serving::admission::Admission;
use tpslab_engine::serving::engine::Request;
use tpslab_engine::serving::logprobs::MAX_TOP_LOGPROBS;
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::{ChatMessage, RenderOptions};
use tpslab_engine::text::reasoning::ReasoningParser;

use super::chat_input::{self, ChatBody};
use super::errors::{ApiError, typed};
use super::fim::{self, Infill};
use super::limits::{LOGPROB_JSON_BYTES, Limits};
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
    /// Chat: a boolean; completions: how many alternatives per token (0 to 20).
    pub logprobs: Option<Value>,
    /// Chat: alternatives per token (0 to 20), with `logprobs: true`.
    pub top_logprobs: Option<u32>,
    /// Completions: the prompt's text before the answer's.
    pub echo: Option<bool>,
    /// vLLM's extension: log-probabilities name tokens `token_id:<id>`.
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM's extension: score every prompt token with this many alternatives (0 to 20), in
    /// the response's own `prompt_logprobs`.
    pub prompt_logprobs: Option<i64>,
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

    /// The field that holds the prompt.
    pub fn prompt_field(self) -> &'static str {
        match self {
            Kind::Chat => "messages",
            Kind::Completion => "prompt",
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
    /// `Some(k)`: each token's log-probability with its `k` most likely alternatives.
    pub logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: `Some(k)` scores the prompt with `k` alternatives per
    /// position, answered as the response's `prompt_logprobs` (chat: beside `choices`;
    /// completions: in each choice). Completions' `echo` with `logprobs` scores the prompt too,
    /// into `logprobs` ([`Parsed::scored_prompt`]).
    pub prompt_logprobs: Option<usize>,
    /// Choices to generate (`n`), each its own sequence in the batch.
    pub n: usize,
    /// Completions' `echo`: the answer's text starts with the prompt's.
    pub echo: bool,
    /// `tools` and `tool_choice` of a chat request (an enforced choice is in `constraint`).
    pub tools: Option<ToolPlan>,
    /// Completions' fill-in-the-middle (`suffix`, `/infill`'s `input_*`).
    pub infill: Option<Infill>,
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

    /// The alternatives per prompt position the engine scores: for `prompt_logprobs`, and for
    /// completions' `echo` with `logprobs` (whose answer leads with the prompt's tokens).
    pub fn scored_prompt(&self) -> Option<usize> {
        let echoed = if self.echo { self.logprobs } else { None };
        echoed.max(self.prompt_logprobs)
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
            limits.check_prompt_bytes("messages", bytes)?;
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
        limits.check_prompt_bytes("prompt", t.len())?;
    }
    let infill = match kind {
        Kind::Completion => fim::asked(body, prompt_text.as_deref(), limits)?,
        Kind::Chat => None,
    };
    super::unhonoured::check(body)?;
    if kind == Kind::Chat {
        super::unhonoured::check_chat(body)?;
    }
    check_limits(&common, limits, shape)?;
    let sampling = sampling(&common)?;
    let mut constraint = structured::asked(body)?;
    let tools = match kind {
        Kind::Chat => tools::plan(body, constraint.as_ref())?,
        Kind::Completion => None,
    };
    if let Some(c) = tools.as_ref().and_then(ToolPlan::constraint) {
        constraint = Some(c);
    }
    let logprobs = logprobs(kind, &common)?;
    let echo = common.echo.unwrap_or(false);
    if echo && kind == Kind::Chat {
        return Err(ApiError::bad_param(
            "echo",
            "echo is a completions field; chat answers never repeat the conversation",
        ));
    }
    let prompt_logprobs = prompt_logprobs(&common)?;
    Ok(Parsed {
        logprobs,
        prompt_logprobs,
        n: common.n.unwrap_or(1) as usize,
        echo,
        kind,
        common,
        messages,
        options,
        prompt_text,
        prompt_tokens,
        sampling,
        constraint,
        tools,
        infill,
    })
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
        && !(1..=l.max_n).contains(&(n as usize))
    {
        return Err(ApiError::over_cap(
            "n",
            format!(
                "n = {n}: this server returns 1 to {} choices per request (--max-n)",
                l.max_n
            ),
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
/// refused.
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
    Ok(())
}

/// The bias as the sampler takes it (checked by [`check_logit_bias`] first), by token id.
fn logit_bias(c: &Common) -> Vec<(u32, f32)> {
    let mut v: Vec<(u32, f32)> = c
        .logit_bias
        .iter()
        .flatten()
        .filter_map(|(k, &b)| Some((k.parse().ok()?, b as f32)))
        .collect();
    v.sort_unstable_by_key(|&(id, _)| id);
    v
}

/// A JSON value's kind, for messages that must not echo the value itself.
fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "this number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// How many alternatives per token a request asks for, `None` for no log-probabilities:
/// chat's `logprobs: true` with `top_logprobs`, completions' integer `logprobs`.
fn logprobs(kind: Kind, c: &Common) -> Result<Option<usize>, ApiError> {
    let max = MAX_TOP_LOGPROBS as u64;
    match kind {
        Kind::Chat => {
            let on = match &c.logprobs {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(v) => {
                    return Err(ApiError::bad_param(
                        "logprobs",
                        format!(
                            "logprobs must be a boolean in chat requests, not {}",
                            kind_of(v)
                        ),
                    ));
                }
            };
            match c.top_logprobs {
                Some(k) if u64::from(k) > max => Err(ApiError::over_cap(
                    "top_logprobs",
                    format!("top_logprobs = {k}; at most {max}"),
                )),
                Some(k) if k > 0 && !on => Err(ApiError::bad_param(
                    "top_logprobs",
                    "top_logprobs needs logprobs: true",
                )),
                k => Ok(on.then(|| k.unwrap_or(0) as usize)),
            }
        }
        Kind::Completion => match &c.logprobs {
            None | Some(Value::Null) => Ok(None),
            Some(v) => match v.as_u64() {
                Some(k) if k <= max => Ok(Some(k as usize)),
                _ => Err(ApiError::over_cap(
                    "logprobs",
                    format!(
                        "logprobs must be an integer from 0 to {max}, not {}",
                        kind_of(v)
                    ),
                )),
            },
        },
    }
}

/// vLLM's `prompt_logprobs`: 0 to 20 alternatives per prompt position. Not on a stream (as in
/// vLLM: the answer carries them whole).
fn prompt_logprobs(c: &Common) -> Result<Option<usize>, ApiError> {
    let max = MAX_TOP_LOGPROBS as i64;
    match c.prompt_logprobs {
        None => Ok(None),
        Some(k) if !(0..=max).contains(&k) => Err(ApiError::over_cap(
            "prompt_logprobs",
            format!(
                "prompt_logprobs = {k}; this server returns 0 to {max} alternatives per \
                 prompt token"
            ),
        )),
        Some(_) if c.stream.unwrap_or(false) => Err(ApiError::bad_param(
            "prompt_logprobs",
            "prompt_logprobs is not available when stream is true",
        )),
        Some(k) => Ok(Some(k as usize)),
    }
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
        logit_bias: logit_bias(c),
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
    client: ClientId,
) -> Result<(Request, Option<ReasoningParser>), ApiError> {
    let (tokens, reasoning) = match (&p.prompt_tokens, &p.prompt_text) {
        (Some(t), _) => (t.clone(), None),
        (None, Some(_)) if let Some(inf) = &p.infill => {
            let max = p.max_tokens().map(|m| m as usize);
            (fim::prompt_tokens(lm, inf, limits, max)?, None)
        }
        (None, Some(text)) => (
            lm.raw_prompt(text)
                .map_err(|e| prompt_error("prompt", &e))?,
            None,
        ),
        // Any template error (a budget it ran past included) is the request's: 400 with the
        // engine's message.
        (None, None) => {
            let prompt = chat_input::chat_prompt(lm, &p.messages, &p.options)
                .map_err(|e| prompt_error("messages", &e))?;
            (prompt.tokens, Some(prompt.reasoning))
        }
    };
    check_prompt_logprobs(p, tokens.len(), limits)?;
    let asked = p.max_tokens().map(|m| m as usize);
    // `None`: the engine gives as many as fit the context and the KV pool.
    let max = limits
        .answer_tokens(tokens.len(), asked, lm.model.cfg.context_len)
        .map_err(|m| ApiError {
            param: Some(p.kind.prompt_field().into()),
            ..ApiError::context_exceeded(m)
        })?;
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
        client,
        constraint: p
            .constraint
            .as_ref()
            .map(|a| structured::compile(lm, a))
            .transpose()?,
        logprobs: p.logprobs,
        prompt_logprobs: p.scored_prompt(),
        embed: None,
    };
    Admission::for_api(&lm.model.cfg)
        .check(&req)
        .map_err(|e| ApiError::refused(&e))?;
    Ok((req, reasoning))
}

/// A prompt that could not be built: past the context is `context_length_exceeded`, as the
/// engine's own check says it; anything else a 400 on `field`.
fn prompt_error(field: &str, e: &LoadError) -> ApiError {
    match e {
        LoadError::PastContext { .. } => ApiError {
            param: Some(field.into()),
            ..ApiError::context_exceeded(e.to_string())
        },
        _ => ApiError::bad_param(field, e.to_string()),
    }
}

/// Prices prompt log-probabilities as the answer they make: every choice carries them (scored
/// once, shared), so a long prompt with many alternatives and many choices is refused before
/// it runs instead of building tens of megabytes.
fn check_prompt_logprobs(p: &Parsed, prompt: usize, limits: &Limits) -> Result<(), ApiError> {
    let Some(k) = p.scored_prompt() else {
        return Ok(());
    };
    let bytes = (p.n.max(1))
        .saturating_mul(prompt)
        .saturating_mul(k + 1)
        .saturating_mul(LOGPROB_JSON_BYTES);
    if bytes <= limits.max_prompt_logprob_bytes {
        return Ok(());
    }
    let field = if p.prompt_logprobs.is_some() {
        "prompt_logprobs"
    } else {
        "echo"
    };
    Err(ApiError::over_cap(
        field,
        format!(
            "{field} would answer about {} MB ({} choices x {prompt} prompt tokens x {} \
             alternatives), past this server's {} MB: ask for fewer alternatives or choices, or \
             a shorter prompt",
            bytes >> 20,
            p.n.max(1),
            k + 1,
            limits.max_prompt_logprob_bytes >> 20
        ),
    ))
}

//! A request's answer from its choices' events: each choice's text (a chat answer's reasoning
//! split off and its tool calls read out as it streams, [`TextPipe`]), finish reason and
//! log-probabilities, whole ([`collect`]) or as an SSE body ([`SseStream`]); usage counts the
//! prompt once and every choice's tokens.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Bytes;
use axum::response::Response;
use serde_json::Value;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{Event, Refusal, Usage};
use tpslab_engine::serving::logprobs::TokenLogprob;
use tpslab_engine::text::reasoning::{ReasoningParser, Split};
use tpslab_engine::text::tool_calls::{ToolCall, ToolDelta};

use super::bridge::Choices;
use super::errors::ApiError;
use super::json_body::{self, JsonBody, Pieces};
use super::logprobs_json::{self, CompletionPieces, Names, PromptPieces, Scored};
use super::openai::Kind;
use super::openai_out::{ChoiceOut, Meta, chunk, full_response, usage_chunk};
use super::tools::{ToolParse, calls_json, deltas_json};

/// What every choice of a request shares: the endpoint's shape and what the answer adds.
#[derive(Clone)]
pub struct AnswerSpec {
    pub meta: Meta,
    pub lm: Arc<LoadedModel>,
    /// The splitter of a chat answer's reasoning (each choice gets its own copy).
    pub reasoning: Option<ReasoningParser>,
    /// Completions' `echo`: the prompt's text, put before each choice's.
    pub echo: Option<String>,
    pub include_usage: bool,
    /// vLLM's `return_tokens_as_token_ids`: log-probabilities name tokens by id.
    pub token_ids: bool,
    /// The reader of a chat answer's tool calls (each choice gets its own copy).
    pub tools: Option<ToolParse>,
    /// The field that asked for the request's grammar (`response_format`, `guided_regex`,
    /// `tool_choice`, ...): what a grammar failing while decoding is a 400 about.
    pub grammar_field: Option<&'static str>,
    /// Alternatives per generated token when the request asked for log-probabilities.
    pub logprobs: Option<usize>,
    /// vLLM's `prompt_logprobs`: alternatives per prompt position in the whole answer's
    /// `prompt_logprobs`.
    pub prompt_logprobs: Option<usize>,
}

impl AnswerSpec {
    /// The error a choice's refusal is: as the engine's refusals map, but a grammar that
    /// failed while decoding names the field that asked for it.
    pub fn refused(&self, reason: &Refusal) -> ApiError {
        match (reason, self.grammar_field) {
            (Refusal::Grammar(_), Some(field)) => ApiError::bad_param(field, reason.to_string()),
            _ => ApiError::refused(reason),
        }
    }
}

/// A piece of a choice's answer: its text (reasoning apart) and pieces of its tool calls.
#[derive(Debug, Default)]
pub struct Piece {
    pub text: Split,
    pub calls: Vec<ToolDelta>,
}

impl Piece {
    pub fn is_empty(&self) -> bool {
        self.text.is_empty() && self.calls.is_empty()
    }
}

/// One choice's text on its way out: the reasoning split off, then the tool calls read out of
/// what is left.
#[derive(Clone)]
pub struct TextPipe {
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolParse>,
}

impl TextPipe {
    pub fn new(spec: &AnswerSpec) -> Self {
        Self {
            reasoning: spec.reasoning.clone(),
            tools: spec.tools.clone(),
        }
    }

    /// Content through the tool reader, if any.
    fn calls(&mut self, text: &mut Split, calls: &mut Vec<ToolDelta>) {
        if let Some(t) = &mut self.tools {
            let step = t.push(&text.content);
            text.content = step.content;
            calls.extend(step.calls);
        }
    }

    /// A piece of the answer as it streams.
    pub fn push(&mut self, text: &str) -> Piece {
        let mut split = match &mut self.reasoning {
            Some(p) => p.push(text),
            None => Split {
                reasoning: String::new(),
                content: text.to_string(),
            },
        };
        let mut calls = Vec::new();
        self.calls(&mut split, &mut calls);
        Piece { text: split, calls }
    }

    /// The answer's last text, and whatever the readers still held.
    pub fn finish(&mut self, tail: &str) -> Piece {
        let mut piece = self.push(tail);
        if let Some(p) = &mut self.reasoning {
            let mut last = p.finish();
            self.calls(&mut last, &mut piece.calls);
            piece.text.extend(last);
        }
        if let Some(t) = &mut self.tools {
            let step = t.finish();
            piece.text.content.push_str(&step.content);
            piece.calls.extend(step.calls);
        }
        piece
    }

    /// A whole answer's text and calls.
    pub fn whole(self, text: String) -> (Split, Vec<ToolCall>) {
        let mut split = match self.reasoning {
            Some(p) => p.split_all(&text),
            None => Split {
                reasoning: String::new(),
                content: text,
            },
        };
        let calls = match self.tools {
            Some(t) => {
                let (content, calls) = t.parse_all(&split.content);
                split.content = content;
                calls
            }
            None => Vec::new(),
        };
        (split, calls)
    }
}

/// One choice as its events arrive.
struct ChoiceState {
    pipe: TextPipe,
    /// No chunk has gone out for it yet.
    first: bool,
    finish: Option<FinishReason>,
    /// Whole answers: all of its text; streams: nothing (each piece goes out as it comes).
    text: String,
    /// Log-probabilities not yet sent (streams) or all of them (whole answers).
    scored: Vec<Scored>,
    /// Completions' `text_offset` of the next token.
    offset: usize,
    /// A streamed call has been sent: the choice finishes with `"tool_calls"`.
    called: bool,
    /// The prompt's ids and log-probabilities (completions' `echo` with `logprobs`, vLLM's
    /// `prompt_logprobs`), until they go out.
    prompt: Option<(Vec<u32>, Vec<TokenLogprob>)>,
}

impl ChoiceState {
    fn new(spec: &AnswerSpec) -> Self {
        let echo = spec.echo.clone().unwrap_or_default();
        Self {
            pipe: TextPipe::new(spec),
            first: true,
            finish: None,
            offset: echo.len(),
            text: echo,
            scored: Vec::new(),
            called: false,
            prompt: None,
        }
    }

    /// Keeps a token's log-probabilities (when the request asked for them) until they go out.
    fn score(&mut self, token: u32, logprob: Option<Box<TokenLogprob>>) {
        if let Some(lp) = logprob {
            self.scored.push((token, *lp));
        }
    }

    /// The log-probabilities gathered so far, in the endpoint's shape, and forgotten.
    fn take_logprobs(&mut self, spec: &AnswerSpec) -> Option<Value> {
        match spec.meta.kind {
            Kind::Chat => {
                spec.logprobs?;
                let items = std::mem::take(&mut self.scored);
                Some(logprobs_json::chat(names(spec), &items))
            }
            Kind::Completion => {
                let mut pieces = self.take_completion(spec)?;
                let v = serde_json::from_str(&json_body::write_all(&mut pieces))
                    .expect("the writer writes JSON");
                self.offset = pieces.offset();
                Some(v)
            }
        }
    }

    /// Completions' log-probabilities gathered so far, the echoed prompt's first, as their
    /// writer; forgotten here. The writer moves the text offset: [`ChoiceState::take_logprobs`]
    /// reads it back after writing.
    fn take_completion(&mut self, spec: &AnswerSpec) -> Option<CompletionPieces> {
        let k = spec.logprobs?;
        let generated = std::mem::take(&mut self.scored)
            .into_iter()
            .map(|(id, lp)| (id, Some(lp)));
        let items = match self.prompt.take() {
            // The echoed prompt's tokens lead, their offsets from the text's start.
            Some((ids, mut lps)) => {
                self.offset = 0;
                // The engine scored the prompt for `prompt_logprobs` too: its alternatives may
                // be more than `logprobs` asked for.
                for lp in &mut lps {
                    lp.top.truncate(k);
                }
                let first = ids.first().map(|&id| (id, None));
                let rest = ids.iter().skip(1).copied().zip(lps.into_iter().map(Some));
                first.into_iter().chain(rest).chain(generated).collect()
            }
            None => generated.collect(),
        };
        Some(CompletionPieces::new(names(spec), items, self.offset))
    }
}

/// How the request names tokens in its log-probabilities.
fn names(spec: &AnswerSpec) -> Names<'_> {
    Names {
        tok: &spec.lm.tokenizer,
        as_ids: spec.token_ids,
    }
}

impl ChoiceState {
    /// vLLM's `prompt_logprobs` of the choice's prompt, when the request asked for them. The
    /// prompt is taken, or copied where completions' `logprobs` (an echoed prompt's) read it
    /// too.
    fn prompt_logprobs(&mut self, spec: &AnswerSpec) -> Option<PromptPieces> {
        let k = spec.prompt_logprobs?;
        let echoed = spec.meta.kind == Kind::Completion && spec.logprobs.is_some();
        let (ids, lps) = if echoed {
            self.prompt.clone()?
        } else {
            self.prompt.take()?
        };
        Some(PromptPieces::new(&spec.lm.tokenizer, ids, lps, k))
    }
}

/// Usage over choices: the prompt once, every choice's completion tokens.
fn add_usage(total: &mut Option<Usage>, u: Usage) {
    match total {
        None => *total = Some(u),
        Some(t) => t.completion_tokens += u.completion_tokens,
    }
}

/// A part of a whole answer: a value, or one written as the body goes out ([`json_body`]).
pub enum Part {
    Value(Value),
    Pieces(Box<dyn Pieces>),
}

impl Part {
    /// The part's value, when it is one.
    pub fn value(&self) -> Option<&Value> {
        match self {
            Part::Value(v) => Some(v),
            Part::Pieces(_) => None,
        }
    }

    /// The part's value, or the placeholder `body` streams it in place of.
    fn place(self, body: &mut JsonBody) -> Value {
        match self {
            Part::Value(v) => v,
            Part::Pieces(p) => body.defer(p),
        }
    }
}

/// One choice's whole answer.
pub struct Whole {
    pub text: Split,
    pub calls: Vec<ToolCall>,
    /// Chat's log-probabilities as a value; completions' (the echoed prompt's with them) to
    /// be written as the body goes out.
    pub logprobs: Option<Part>,
    /// vLLM's `prompt_logprobs`, when asked for (written as the body goes out).
    pub prompt_logprobs: Option<Part>,
    pub finish: Option<FinishReason>,
}

/// The whole answer of a non-streamed request as the chat or completions response, its
/// prompt's log-probabilities written as the body goes out.
pub async fn collect(choices: &mut Choices, spec: &AnswerSpec) -> Result<Response, ApiError> {
    let (mut outs, usage) = gather(choices, spec).await?;
    let mut body = JsonBody::new();
    let parts: Vec<(Option<Value>, Option<Value>)> = outs
        .iter_mut()
        .map(|w| {
            let logprobs = w.logprobs.take().map(|p| p.place(&mut body));
            (
                logprobs,
                w.prompt_logprobs.take().map(|p| p.place(&mut body)),
            )
        })
        .collect();
    let choices = outs
        .iter()
        .zip(parts)
        .enumerate()
        .map(|(index, (w, (logprobs, prompt_logprobs)))| ChoiceOut {
            index,
            text: &w.text,
            finish: w.finish,
            logprobs,
            tool_calls: (!w.calls.is_empty()).then(|| calls_json(&w.calls)),
            called: !w.calls.is_empty(),
            prompt_logprobs,
        })
        .collect();
    Ok(body.into_response(&full_response(&spec.meta, choices, &usage)))
}

/// Every choice's whole answer and the request's usage: waits for every choice's end. A
/// choice that fails fails the request (its error status), as a whole response cannot hold an
/// error.
pub async fn gather(
    choices: &mut Choices,
    spec: &AnswerSpec,
) -> Result<(Vec<Whole>, Usage), ApiError> {
    let mut states: Vec<ChoiceState> = (0..choices.count())
        .map(|_| ChoiceState::new(spec))
        .collect();
    let mut usage = None;
    let mut open = states.len();
    while open > 0 {
        let Some((i, ev)) = choices.next().await else {
            return Err(ApiError::internal("the engine stopped"));
        };
        let Some(c) = states.get_mut(i) else { continue };
        match ev {
            Event::Started { .. } | Event::Embedding { .. } => {}
            Event::PromptLogprobs {
                prompt, logprobs, ..
            } => c.prompt = Some((prompt, logprobs)),
            Event::Token {
                text,
                token,
                logprob,
                ..
            } => {
                c.text.push_str(&text);
                c.score(token, logprob);
            }
            Event::Finished {
                reason,
                usage: u,
                text,
                ..
            } => {
                c.text.push_str(&text);
                c.finish = Some(reason);
                add_usage(&mut usage, u);
                open -= 1;
            }
            Event::Refused { reason, .. } => return Err(spec.refused(&reason)),
        }
    }
    let outs = states
        .into_iter()
        .map(|mut c| {
            let (text, calls) = c.pipe.clone().whole(std::mem::take(&mut c.text));
            // Offsets count from the start of the text, echo included.
            c.offset = spec.echo.as_ref().map_or(0, String::len);
            let prompt_logprobs = c.prompt_logprobs(spec).map(|p| Part::Pieces(Box::new(p)));
            let logprobs = match spec.meta.kind {
                Kind::Chat => c.take_logprobs(spec).map(Part::Value),
                Kind::Completion => c.take_completion(spec).map(|p| Part::Pieces(Box::new(p))),
            };
            Whole {
                text,
                calls,
                prompt_logprobs,
                logprobs,
                finish: c.finish,
            }
        })
        .collect();
    if spec.prompt_logprobs.is_some() || spec.echo.is_some() {
        // The scored prompt's events were the largest thing this request held: give their
        // pages back now rather than keep them resident.
        tpslab_engine::model::loaded::release_free_memory();
    }
    Ok((outs, usage.unwrap_or_default()))
}

/// The SSE body of a streamed request: `data: {chunk}` per piece of a choice's text, each
/// choice's last chunk with its `finish_reason`, then the usage chunk if asked for and
/// `data: [DONE]` once every choice has ended. Dropping it (the client went away) cancels
/// every choice still running.
pub struct SseStream {
    choices: Choices,
    spec: AnswerSpec,
    states: Vec<ChoiceState>,
    usage: Option<Usage>,
    open: usize,
    pending: VecDeque<Bytes>,
    ended: bool,
}

fn frame(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl SseStream {
    pub fn new(choices: Choices, spec: AnswerSpec) -> Self {
        let states: Vec<ChoiceState> = (0..choices.count())
            .map(|_| {
                let mut c = ChoiceState::new(&spec);
                c.text.clear(); // streams send the echo in the first chunk instead
                c
            })
            .collect();
        Self {
            open: states.len(),
            choices,
            spec,
            states,
            usage: None,
            pending: VecDeque::new(),
            ended: false,
        }
    }

    /// Sends a chunk of choice `i` with its log-probabilities so far.
    fn send(&mut self, i: usize, piece: Piece, finish: Option<FinishReason>) {
        let c = &mut self.states[i];
        let logprobs = c.take_logprobs(&self.spec);
        let first = std::mem::replace(&mut c.first, false);
        let mut text = piece.text;
        if first && let Some(echo) = &self.spec.echo {
            text.content.insert_str(0, echo);
        }
        c.called |= !piece.calls.is_empty();
        let out = ChoiceOut {
            index: i,
            text: &text,
            finish,
            logprobs,
            tool_calls: (!piece.calls.is_empty()).then(|| deltas_json(piece.calls)),
            called: c.called,
            prompt_logprobs: None,
        };
        let v = chunk(&self.spec.meta, first, out, self.spec.include_usage);
        self.pending.push_back(frame(&v));
    }

    fn finish(&mut self, i: usize, reason: FinishReason, usage: Usage, tail: &str) {
        let c = &mut self.states[i];
        let rest = c.pipe.finish(tail);
        c.finish = Some(reason);
        if !rest.is_empty() || !c.scored.is_empty() {
            self.send(i, rest, None);
        }
        self.send(i, Piece::default(), Some(reason));
        add_usage(&mut self.usage, usage);
        self.open -= 1;
        if self.open == 0 {
            if self.spec.include_usage {
                let u = self.usage.unwrap_or_default();
                self.pending
                    .push_back(frame(&usage_chunk(&self.spec.meta, &u)));
            }
            self.end();
        }
    }

    fn end(&mut self) {
        self.pending
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
        self.choices.all_done();
    }

    fn fail(&mut self, reason: &Refusal) {
        let err = self.spec.refused(reason);
        self.pending.push_back(frame(&err.body()));
        self.end();
    }

    fn on_event(&mut self, i: usize, ev: Event) {
        if i >= self.states.len() || self.states[i].finish.is_some() {
            return;
        }
        match ev {
            Event::Started { .. } | Event::Embedding { .. } => {}
            Event::PromptLogprobs {
                prompt, logprobs, ..
            } => self.states[i].prompt = Some((prompt, logprobs)),
            Event::Token {
                text,
                token,
                logprob,
                ..
            } => {
                let c = &mut self.states[i];
                c.score(token, logprob);
                let piece = c.pipe.push(&text);
                if !piece.is_empty() || c.first {
                    self.send(i, piece, None);
                }
            }
            Event::Finished {
                reason,
                usage,
                text,
                ..
            } => self.finish(i, reason, usage, &text),
            Event::Refused { reason, .. } => self.fail(&reason),
        }
    }
}

/// A response body made of a request's choices' events (the chat and completions SSE body, and
/// `/v1/responses`' events): its queue of bytes, whether it has ended, and what it does with
/// each event.
pub trait EventBody {
    fn parts(&mut self) -> (&mut VecDeque<Bytes>, bool, &mut Choices);
    fn on_event(&mut self, i: usize, ev: Event);
    fn fail(&mut self, reason: &Refusal);
}

/// The `poll_next` of every [`EventBody`]: the queued bytes first, then the next event.
pub fn poll_body<B: EventBody>(
    body: &mut B,
    cx: &mut Context<'_>,
) -> Poll<Option<Result<Bytes, Infallible>>> {
    loop {
        let (pending, ended, choices) = body.parts();
        if let Some(b) = pending.pop_front() {
            return Poll::Ready(Some(Ok(b)));
        }
        if ended {
            return Poll::Ready(None);
        }
        match choices.poll_next(cx) {
            Poll::Ready(Some((i, ev))) => body.on_event(i, ev),
            // The engine went away without a last event.
            Poll::Ready(None) => body.fail(&Refusal::Stopped),
            Poll::Pending => return Poll::Pending,
        }
    }
}

impl EventBody for SseStream {
    fn parts(&mut self) -> (&mut VecDeque<Bytes>, bool, &mut Choices) {
        (&mut self.pending, self.ended, &mut self.choices)
    }

    fn on_event(&mut self, i: usize, ev: Event) {
        SseStream::on_event(self, i, ev);
    }

    fn fail(&mut self, reason: &Refusal) {
        SseStream::fail(self, reason);
    }
}

impl futures_core::Stream for SseStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        poll_body(self.get_mut(), cx)
    }
}

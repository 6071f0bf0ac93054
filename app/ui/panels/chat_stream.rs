//! A chat answer being made: the prompt rendered and tokenized on a worker, the request
//! submitted (the chat's sampling and stop sequences), its events drained into the
//! conversation's last message every frame, with the figures shown under the answer (the
//! batches it ran in from the engine's usage).

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Instant;

use tpslab_engine::sched::stop::StopCriteria;
use tpslab_engine::sched::{ClientId, RequestId};
use tpslab_engine::serving::constraint::compiler_for;
use tpslab_engine::serving::engine::{DecodeBatch, EngineHandle, Event, Request};
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::ChatMessage;
use tpslab_engine::text::reasoning::ReasoningParser;

use super::chat_store::{AnswerStats, Conversation, Message, Role};
use crate::serve::chat_input::{chat_prompt, default_options};
use crate::ui::engine_link::EngineLink;

/// A generation in flight: its request, its event channel and the timing seen by the UI.
///
/// The prompt is rendered (the model's chat template, which may take up to its time limit) and
/// tokenized on a worker thread, which then submits the request; until it has, `id` is None.
pub struct Generation {
    pub chat: u64,
    id: Option<RequestId>,
    /// The worker's answer: the engine's id for the request and the splitter of its reasoning,
    /// or why it could not be sent.
    prep: Option<Receiver<Result<(RequestId, ReasoningParser), String>>>,
    /// Splits the streamed text into reasoning and answer (from the worker, with the id).
    reasoning: Option<ReasoningParser>,
    reasoning_tokens: usize,
    /// When the last thinking token came.
    reasoning_last: Option<Instant>,
    /// Stop was asked before the request reached the engine.
    stop_asked: bool,
    rx: Receiver<Event>,
    sent: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: usize,
    /// The settings it was asked with, shown beside it.
    sampling: SamplingParams,
    /// The engine's batches, once it has ended.
    batch: DecodeBatch,
}

impl Generation {
    /// Starts submitting the conversation (which must end with an empty assistant message):
    /// the template and tokenizer run on a worker, so a slow or runaway template never holds a
    /// frame.
    pub fn submit(link: &EngineLink, conv: &Conversation) -> Result<Self, String> {
        let mut messages = Vec::new();
        if !conv.system.trim().is_empty() {
            messages.push(ChatMessage::system(conv.system.clone()));
        }
        let history = conv.messages.split_last().map_or(&[][..], |(_, rest)| rest);
        for m in history {
            messages.push(match m.role {
                Role::User => ChatMessage::user(m.text.clone()),
                Role::Assistant => ChatMessage {
                    reasoning_content: (!m.reasoning.is_empty()).then(|| m.reasoning.clone()),
                    ..ChatMessage::assistant(m.text.clone())
                },
            });
        }
        conv.sampling.validate().map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel();
        let (prep_tx, prep) = mpsc::channel();
        let (lm, engine) = (Arc::clone(&link.lm), link.engine.clone());
        let (sampling, max_tokens) = (conv.sampling.clone(), conv.max_tokens.max(1));
        let stop_strings = conv.stop_strings();
        let grammar = conv.schema.grammar()?;
        std::thread::Builder::new()
            .name("chat-prompt".into())
            .spawn(move || {
                // The same prompt as the server builds (thinking on, as llama-server).
                // The schema compiles here too: a big one takes a while, never a frame.
                let constraint = grammar
                    .map(|g| compiler_for(&lm.tokenizer).and_then(|c| c.compile(&g)))
                    .transpose()
                    .map_err(|e| format!("JSON schema: {e}"));
                let sent = constraint.and_then(|constraint| {
                    let prompt = chat_prompt(&lm, &messages, &default_options())
                        .map_err(|e| e.to_string())?;
                    let req = Request {
                        prompt: prompt.tokens,
                        sampling,
                        stop: StopCriteria {
                            stop_strings,
                            ..lm.default_stop(Some(max_tokens))
                        },
                        priority: crate::serve::limits::WINDOW_CHAT_PRIORITY,
                        client: ClientId::LOCAL,
                        constraint,
                        logprobs: None,
                        prompt_logprobs: None,
                        embed: None,
                    };
                    Ok((engine.submit(req, tx), prompt.reasoning))
                });
                let _ = prep_tx.send(sent);
            })
            .map_err(|e| format!("cannot start the prompt worker: {e}"))?;
        Ok(Self {
            chat: conv.id,
            id: None,
            prep: Some(prep),
            reasoning: None,
            reasoning_tokens: 0,
            reasoning_last: None,
            stop_asked: false,
            rx,
            sent: Instant::now(),
            first: None,
            last: None,
            tokens: 0,
            sampling: conv.sampling.clone(),
            batch: DecodeBatch::default(),
        })
    }

    /// Stops the generation: at once if the engine has it, else as soon as it does.
    pub fn stop(&mut self, engine: &EngineHandle) {
        match self.id {
            Some(id) => engine.cancel(id),
            None => self.stop_asked = true,
        }
    }

    /// Takes the worker's answer when it has come: false (and the reason under the answer) when
    /// the prompt could not be made, e.g. a chat template over its budget.
    fn poll_prep(&mut self, msg: &mut Message, engine: Option<&EngineHandle>) -> bool {
        let Some(prep) = &self.prep else {
            return true;
        };
        match prep.try_recv() {
            Ok(Ok((id, reasoning))) => {
                self.id = Some(id);
                self.reasoning = Some(reasoning);
                self.prep = None;
                if self.stop_asked
                    && let Some(engine) = engine
                {
                    engine.cancel(id);
                }
                true
            }
            Ok(Err(e)) => {
                msg.stats = Some(self.stats(&format!("cannot send: {e}")));
                false
            }
            Err(TryRecvError::Empty) => {
                msg.stats = Some(self.stats("preparing the prompt"));
                true
            }
            Err(TryRecvError::Disconnected) => {
                msg.stats = Some(self.stats("cannot send: the prompt worker stopped"));
                false
            }
        }
    }

    /// Moves every event waiting on the channel into the conversation's last message (tokens are
    /// batched per frame). Returns true when the generation has ended.
    pub fn drain(&mut self, conv: &mut Conversation, engine: Option<&EngineHandle>) -> bool {
        let Some(msg) = conv.messages.last_mut() else {
            return true;
        };
        if !self.poll_prep(msg, engine) {
            return true;
        }
        if self.id.is_none() {
            return false;
        }
        loop {
            match self.rx.try_recv() {
                Ok(
                    Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. },
                ) => {}
                Ok(Event::Token { text, .. }) => {
                    let now = Instant::now();
                    self.first.get_or_insert(now);
                    self.last = Some(now);
                    self.tokens += 1;
                    self.take_text(msg, &text, Some(now));
                }
                Ok(Event::Finished {
                    reason,
                    text,
                    usage,
                    ..
                }) => {
                    self.batch = usage.batch;
                    self.take_text(msg, &text, None);
                    if let Some(p) = &mut self.reasoning {
                        let rest = p.finish();
                        msg.reasoning.push_str(&rest.reasoning);
                        msg.text.push_str(&rest.content);
                    }
                    msg.stats = Some(self.stats(reason.as_str()));
                    return true;
                }
                Ok(Event::Refused { reason, .. }) => {
                    msg.stats = Some(self.stats(&format!("refused: {reason}")));
                    return true;
                }
                Err(TryRecvError::Empty) => {
                    msg.stats = Some(self.stats("streaming"));
                    return false;
                }
                Err(TryRecvError::Disconnected) => {
                    msg.stats = Some(self.stats("engine stopped"));
                    return true;
                }
            }
        }
    }

    /// One token's text (`at` its arrival; None for the text that comes with the end), split
    /// into the answer's reasoning and its text; a token seen while thinking counts as thinking.
    fn take_text(&mut self, msg: &mut Message, text: &str, at: Option<Instant>) {
        let Some(p) = &mut self.reasoning else {
            msg.text.push_str(text);
            return;
        };
        let thinking = p.in_reasoning();
        let split = p.push(text);
        if let Some(at) = at
            && (thinking || p.in_reasoning())
        {
            self.reasoning_tokens += 1;
            self.reasoning_last = Some(at);
        }
        msg.reasoning.push_str(&split.reasoning);
        msg.text.push_str(&split.content);
    }

    fn stats(&self, finish: &str) -> AnswerStats {
        let ttft_ms = self.first.map(|f| (f - self.sent).as_secs_f64() * 1e3);
        let decode_tps = match (self.first, self.last) {
            (Some(f), Some(l)) if self.tokens >= 2 && l > f => {
                Some((self.tokens - 1) as f64 / (l - f).as_secs_f64())
            }
            _ => None,
        };
        let reasoning_ms = match (self.first, self.reasoning_last) {
            (Some(f), Some(l)) => Some((l - f).as_secs_f64() * 1e3),
            _ => None,
        };
        AnswerStats {
            tokens: self.tokens,
            ttft_ms,
            decode_tps,
            finish: finish.to_owned(),
            reasoning_tokens: self.reasoning_tokens,
            reasoning_ms,
            batch_mean: self.batch.mean(),
            batch_max: (self.batch.steps > 0).then_some(self.batch.max),
            sampling: Some(self.sampling.clone()),
        }
    }
}

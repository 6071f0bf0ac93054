//! The SSE body of a streamed `/v1/responses` answer: `event: <type>` and `data: {..}` per
//! event, each with its `sequence_number`: response.created, response.in_progress, then per
//! output item response.output_item.added, for reasoning response.reasoning_text.delta and
//! .done, for text response.content_part.added, response.output_text.delta (one per piece,
//! with the log-probabilities of the tokens since the last one), response.output_text.done and
//! response.content_part.done, for a call response.function_call_arguments.delta and .done,
//! response.output_item.done, and last response.completed (response.incomplete when
//! `max_output_tokens` cut it short). A grammar failing while decoding is an `error` event
//! naming the Responses field that asked for it. Dropping it (the client went away) cancels
//! the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use serde_json::{Value, json};
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{Event, Refusal, Usage};

use super::answer::{AnswerSpec, EventBody, Piece, TextPipe, poll_body};
use super::bridge::Choices;
use super::logprobs_json::{self, Names, Scored};
use super::responses_json::{
    End, RespMeta, call_item, message_item, new_id, reasoning_item, reasoning_tokens, renamed,
    response_json, text_part,
};
use super::tools::call_id;

/// The output item being written.
enum Open {
    None,
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
        /// Every log-probability sent with its deltas (when asked for).
        logprobs: Vec<Value>,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

pub struct ResponsesStream {
    choices: Choices,
    pipe: TextPipe,
    spec: AnswerSpec,
    meta: RespMeta,
    /// Tokens scored since the last text delta.
    scored: Vec<Scored>,
    /// All the reasoning written, for its token count.
    reasoning: String,
    seq: u64,
    open: Open,
    /// The output items done, in order.
    done: Vec<Value>,
    pending: VecDeque<Bytes>,
    ended: bool,
}

impl ResponsesStream {
    pub fn new(choices: Choices, spec: AnswerSpec, meta: RespMeta) -> Self {
        let mut s = Self {
            choices,
            pipe: TextPipe::new(&spec),
            spec,
            meta,
            scored: Vec::new(),
            reasoning: String::new(),
            seq: 0,
            open: Open::None,
            done: Vec::new(),
            pending: VecDeque::new(),
            ended: false,
        };
        let r = response_json(&s.meta, Vec::new(), None);
        s.event("response.created", json!({"response": r}));
        s.event("response.in_progress", json!({"response": r}));
        s
    }

    fn event(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.seq);
        self.seq += 1;
        self.pending
            .push_back(Bytes::from(format!("event: {kind}\ndata: {data}\n\n")));
    }

    /// The output index of the open item.
    fn index(&self) -> usize {
        self.done.len()
    }

    /// Closes the open item, with its `.done` events.
    fn close(&mut self) {
        let i = self.index();
        let item = match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Reasoning { id, text } => {
                self.event(
                    "response.reasoning_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
                );
                reasoning_item(&id, &text, "completed")
            }
            Open::Message { id, text, logprobs } => {
                let lp = Value::Array(logprobs);
                let part = text_part(&text, self.spec.logprobs.is_some().then_some(&lp));
                self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text,
                           "logprobs": lp}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
                );
                message_item(&id, part, "completed")
            }
            Open::Call {
                id,
                call_id,
                name,
                arguments,
            } => {
                self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": i, "arguments": arguments}),
                );
                call_item(&id, &call_id, &name, &arguments, "completed")
            }
        };
        self.event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
        self.done.push(item);
    }

    /// Opens a message item (closing what was open).
    fn open_message(&mut self) {
        self.close();
        let id = new_id("msg");
        let i = self.index();
        let mut item = message_item(&id, Value::Null, "in_progress");
        item["content"] = json!([]);
        self.event(
            "response.output_item.added",
            json!({"output_index": i, "item": item}),
        );
        self.event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": i, "content_index": 0,
                   "part": {"type": "output_text", "text": "", "annotations": []}}),
        );
        self.open = Open::Message {
            id,
            text: String::new(),
            logprobs: Vec::new(),
        };
    }

    /// The log-probabilities of the tokens scored since the last text delta, in chat's entry
    /// shape.
    fn take_scored(&mut self) -> Vec<Value> {
        let items = std::mem::take(&mut self.scored);
        if items.is_empty() {
            return Vec::new();
        }
        let names = Names {
            tok: &self.spec.lm.tokenizer,
            as_ids: self.spec.token_ids,
        };
        match logprobs_json::chat(names, &items)["content"].take() {
            Value::Array(v) => v,
            _ => Vec::new(),
        }
    }

    fn text(&mut self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if !matches!(self.open, Open::Message { .. }) {
            self.open_message();
        }
        self.text_delta(delta);
    }

    /// An `output_text.delta` of the open message, with the log-probabilities scored since the
    /// last one.
    fn text_delta(&mut self, delta: &str) {
        let i = self.index();
        let lp = self.take_scored();
        if let Open::Message { id, text, logprobs } = &mut self.open {
            text.push_str(delta);
            logprobs.extend(lp.iter().cloned());
            let data = json!({"item_id": id, "output_index": i, "content_index": 0,
                              "delta": delta, "logprobs": lp});
            self.event("response.output_text.delta", data);
        }
    }

    fn reasoning_text(&mut self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if !matches!(self.open, Open::Reasoning { .. }) {
            self.close();
            let id = new_id("rs");
            let mut item = reasoning_item(&id, "", "in_progress");
            item["content"] = json!([]);
            let i = self.index();
            self.event(
                "response.output_item.added",
                json!({"output_index": i, "item": item}),
            );
            self.open = Open::Reasoning {
                id,
                text: String::new(),
            };
        }
        self.reasoning.push_str(delta);
        let i = self.index();
        if let Open::Reasoning { id, text } = &mut self.open {
            text.push_str(delta);
            let data =
                json!({"item_id": id, "output_index": i, "content_index": 0, "delta": delta});
            self.event("response.reasoning_text.delta", data);
        }
    }

    /// A piece of the answer: its reasoning, its text, then its call pieces.
    fn piece(&mut self, p: Piece) {
        self.reasoning_text(&p.text.reasoning);
        self.text(&p.text.content);
        for d in p.calls {
            if let Some(name) = d.name {
                self.close();
                let (id, cid) = (new_id("fc"), call_id());
                let item = call_item(&id, &cid, &name, "", "in_progress");
                let i = self.index();
                self.event(
                    "response.output_item.added",
                    json!({"output_index": i, "item": item}),
                );
                self.open = Open::Call {
                    id,
                    call_id: cid,
                    name,
                    arguments: String::new(),
                };
            }
            let i = self.index();
            if let Open::Call { id, arguments, .. } = &mut self.open
                && !d.arguments.is_empty()
            {
                arguments.push_str(&d.arguments);
                let data = json!({"item_id": id, "output_index": i, "delta": d.arguments});
                self.event("response.function_call_arguments.delta", data);
            }
        }
    }

    fn finish(&mut self, reason: FinishReason, usage: &Usage, tail: &str) {
        let p = self.pipe.finish(tail);
        self.piece(p);
        if !self.scored.is_empty() && matches!(self.open, Open::Message { .. }) {
            // Tokens that wrote no text of their own still belong to the message.
            self.text_delta("");
        }
        let no_answer = self.done.iter().all(|item| item["type"] == "reasoning")
            && matches!(self.open, Open::None | Open::Reasoning { .. });
        if no_answer {
            // An empty answer is still one (empty) message.
            self.open_message();
        }
        self.close();
        let end = End {
            reason,
            usage,
            reasoning_tokens: reasoning_tokens(&self.spec.lm, &self.reasoning),
        };
        let r = response_json(&self.meta, self.done.clone(), Some(end));
        let kind = if reason == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(kind, json!({"response": r}));
        self.end();
    }

    fn end(&mut self) {
        self.ended = true;
        self.choices.all_done();
    }

    fn fail(&mut self, reason: &Refusal) {
        let e = renamed(self.spec.refused(reason));
        self.event(
            "error",
            json!({"code": e.code.unwrap_or(e.kind), "message": e.message, "param": e.param}),
        );
        self.end();
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
            Event::Token {
                text,
                token,
                logprob,
                ..
            } => {
                if let Some(lp) = logprob.filter(|_| self.spec.logprobs.is_some()) {
                    self.scored.push((token, *lp));
                }
                let p = self.pipe.push(&text);
                self.piece(p);
            }
            Event::Finished {
                reason,
                usage,
                text,
                ..
            } => self.finish(reason, &usage, &text),
            Event::Refused { reason, .. } => self.fail(&reason),
        }
    }
}

impl EventBody for ResponsesStream {
    fn parts(&mut self) -> (&mut VecDeque<Bytes>, bool, &mut Choices) {
        (&mut self.pending, self.ended, &mut self.choices)
    }

    /// One choice only: Responses has no `n`.
    fn on_event(&mut self, _: usize, ev: Event) {
        ResponsesStream::on_event(self, ev);
    }

    fn fail(&mut self, reason: &Refusal) {
        ResponsesStream::fail(self, reason);
    }
}

impl futures_core::Stream for ResponsesStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        poll_body(self.get_mut(), cx)
    }
}

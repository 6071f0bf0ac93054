//! The SSE body of a streamed `/v1/responses` answer: `event: <type>` and `data: {..}` per
//! event, each with its `sequence_number`: response.created, response.in_progress, then per
//! output item response.output_item.added, for text response.content_part.added,
//! response.output_text.delta (one per piece), response.output_text.done and
//! response.content_part.done, for a call response.function_call_arguments.delta and .done,
//! response.output_item.done, and last response.completed (response.incomplete when
//! `max_output_tokens` cut it short). Dropping it (the client went away) cancels the request.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Bytes;
use serde_json::{Value, json};
use tokio::sync::mpsc::UnboundedReceiver;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{Event, Refusal, Usage};
use tpslab_engine::text::reasoning::ReasoningParser;

use super::bridge::{CancelGuard, Submitted};
use super::errors::ApiError;
use super::responses::{RespMeta, call_item, message_item, new_id, response_json};
use super::tools::{ToolParse, ToolStream, call_id};

/// The output item being written.
enum Open {
    None,
    Message { id: String, text: String },
    Call { id: String, call_id: String, name: String, arguments: String },
}

pub struct ResponsesStream {
    events: UnboundedReceiver<Event>,
    guard: CancelGuard,
    meta: RespMeta,
    reasoning: Option<ReasoningParser>,
    tools: Option<ToolStream>,
    seq: u64,
    open: Open,
    /// The output items done, in order.
    done: Vec<Value>,
    pending: VecDeque<Bytes>,
    ended: bool,
}

impl ResponsesStream {
    pub fn new(
        sub: Submitted,
        meta: RespMeta,
        reasoning: Option<ReasoningParser>,
        tools: Option<ToolParse>,
    ) -> Self {
        let mut s = Self {
            events: sub.events,
            guard: sub.guard,
            meta,
            reasoning,
            tools: tools.map(ToolStream::new),
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

    fn index(&self) -> usize {
        self.done.len()
    }

    /// Closes the open item, with its `.done` events.
    fn close(&mut self) {
        let i = self.index();
        match std::mem::replace(&mut self.open, Open::None) {
            Open::None => return,
            Open::Message { id, text } => {
                let part = json!({"type": "output_text", "text": text, "annotations": []});
                self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text}),
                );
                self.event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "part": part}),
                );
                let item = message_item(&id, &text, "completed");
                self.event("response.output_item.done", json!({"output_index": i, "item": item}));
                self.done.push(item);
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
                let item = call_item(&id, &call_id, &name, &arguments, "completed");
                self.event("response.output_item.done", json!({"output_index": i, "item": item}));
                self.done.push(item);
            }
        }
    }

    fn text(&mut self, delta: &str) {
        if delta.is_empty() {
            return;
        }
        if !matches!(self.open, Open::Message { .. }) {
            self.close();
            let id = new_id("msg");
            let i = self.index();
            let mut item = message_item(&id, "", "in_progress");
            item["content"] = json!([]);
            self.event("response.output_item.added", json!({"output_index": i, "item": item}));
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": i, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            self.open = Open::Message {
                id,
                text: String::new(),
            };
        }
        let i = self.index();
        if let Open::Message { id, text } = &mut self.open {
            text.push_str(delta);
            let data = json!({"item_id": id, "output_index": i, "content_index": 0, "delta": delta});
            self.event("response.output_text.delta", data);
        }
    }

    fn calls(&mut self) {
        let Some(t) = &mut self.tools else {
            return;
        };
        for d in t.take() {
            if let Some(name) = d.name {
                self.close();
                let (id, cid) = (new_id("fc"), call_id());
                let item = call_item(&id, &cid, &name, "", "in_progress");
                let i = self.index();
                self.event("response.output_item.added", json!({"output_index": i, "item": item}));
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

    /// A piece of the answer: reasoning dropped (Responses would carry it as a reasoning
    /// item; not written here), content through the tool reader.
    fn piece(&mut self, text: &str, end: bool) {
        let mut content = match &mut self.reasoning {
            Some(p) => {
                let mut s = p.push(text);
                if end {
                    s.extend(p.finish());
                }
                s.content
            }
            None => text.to_string(),
        };
        if let Some(t) = &mut self.tools {
            content = t.push(&content);
            if end {
                content.push_str(&t.finish());
            }
        }
        self.text(&content);
        self.calls();
    }

    fn finish(&mut self, reason: FinishReason, usage: &Usage, tail: &str) {
        self.piece(tail, true);
        if self.done.is_empty() && matches!(self.open, Open::None) {
            // An empty answer is still one (empty) message.
            let id = new_id("msg");
            self.open = Open::Message {
                id: id.clone(),
                text: String::new(),
            };
            let mut item = message_item(&id, "", "in_progress");
            item["content"] = json!([]);
            self.event("response.output_item.added", json!({"output_index": 0, "item": item}));
            self.event(
                "response.content_part.added",
                json!({"item_id": id, "output_index": 0, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
        }
        self.close();
        let r = response_json(&self.meta, self.done.clone(), Some((reason, usage)));
        let kind = if reason == FinishReason::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        self.event(kind, json!({"response": r}));
        self.ended = true;
        self.guard.done();
    }

    fn fail(&mut self, reason: &Refusal) {
        let e = ApiError::refused(reason);
        self.event(
            "error",
            json!({"code": e.code, "message": e.message, "param": e.param}),
        );
        self.ended = true;
        self.guard.done();
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Started { .. } => {}
            Event::Token { text, .. } => self.piece(&text, false),
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

impl futures_core::Stream for ResponsesStream {
    type Item = Result<Bytes, Infallible>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            if let Some(b) = this.pending.pop_front() {
                return Poll::Ready(Some(Ok(b)));
            }
            if this.ended {
                return Poll::Ready(None);
            }
            match this.events.poll_recv(cx) {
                Poll::Ready(Some(ev)) => this.on_event(ev),
                Poll::Ready(None) => this.fail(&Refusal::Stopped),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

//! The bridge from the engine's per-request std channel to async handlers: a blocking-pool task
//! forwards each event to a tokio channel (and records the server's metrics), and a guard
//! cancels the request in the engine when its handler or response stream is dropped, which is
//! what happens when the client disconnects.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Bytes;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};
use tpslab_engine::sched::RequestId;
use tpslab_engine::sched::stop::FinishReason;
use tpslab_engine::serving::engine::{EngineHandle, Event, Request, Usage};
use tpslab_engine::text::reasoning::{ReasoningParser, Split};

use super::metrics::ServerMetrics;
use super::openai::{Meta, chunk, usage_chunk};
use super::tools::{ToolParse, ToolStream};

/// Cancels its request in the engine on drop unless the request already ended.
pub struct CancelGuard {
    engine: EngineHandle,
    id: RequestId,
    done: bool,
}

impl CancelGuard {
    pub fn id(&self) -> RequestId {
        self.id
    }

    pub fn done(&mut self) {
        self.done = true;
    }
}

impl Drop for CancelGuard {
    fn drop(&mut self) {
        if !self.done {
            self.engine.cancel(self.id);
        }
    }
}

/// A submitted request: its events, in order, and the guard that cancels it if dropped.
pub struct Submitted {
    pub events: UnboundedReceiver<Event>,
    pub guard: CancelGuard,
}

/// Submits a request; its events arrive on the returned receiver. Never blocks the caller: the
/// blocking `recv` runs on tokio's blocking pool and ends with the request's last event.
pub fn submit(engine: &EngineHandle, req: Request, metrics: Arc<ServerMetrics>) -> Submitted {
    let (tx, rx) = std::sync::mpsc::channel();
    let sent = Instant::now();
    let prompt_len = req.prompt.len();
    let id = engine.submit(req, tx);
    let (atx, arx) = unbounded_channel();
    tokio::task::spawn_blocking(move || {
        let mut timer = metrics.start(sent, prompt_len);
        while let Ok(ev) = rx.recv() {
            let last = matches!(ev, Event::Finished { .. } | Event::Refused { .. });
            timer.observe(&ev);
            // A closed receiver (client gone) is not a reason to stop: the cancel is on its way
            // and the `Finished` that follows keeps the counters whole.
            let _ = atx.send(ev);
            if last {
                break;
            }
        }
    });
    Submitted {
        events: arx,
        guard: CancelGuard {
            engine: engine.clone(),
            id,
            done: false,
        },
    }
}

/// The SSE body of a streamed response: `data: {chunk}` per piece of text (a chat answer's
/// reasoning as `delta.reasoning_content`, split as it streams), the final chunk with its
/// `finish_reason`, the usage chunk if asked for, then `data: [DONE]`. Dropping it (the client
/// went away) cancels the request.
pub struct SseStream {
    events: UnboundedReceiver<Event>,
    guard: CancelGuard,
    meta: Meta,
    include_usage: bool,
    reasoning: Option<ReasoningParser>,
    /// Tool calls read out of the answer's content (`tools` with `tool_choice` not `none`).
    tools: Option<ToolStream>,
    first: bool,
    pending: VecDeque<Bytes>,
    ended: bool,
}

fn frame(v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

impl SseStream {
    pub fn new(
        sub: Submitted,
        meta: Meta,
        include_usage: bool,
        reasoning: Option<ReasoningParser>,
    ) -> Self {
        Self {
            events: sub.events,
            guard: sub.guard,
            meta,
            include_usage,
            reasoning,
            tools: None,
            first: true,
            pending: VecDeque::new(),
            ended: false,
        }
    }

    /// Reads the answer's tool calls (sent as `delta.tool_calls`).
    pub fn with_tools(mut self, parse: Option<ToolParse>) -> Self {
        self.tools = parse.map(ToolStream::new);
        self
    }

    fn text(&mut self, text: &Split, finish: Option<FinishReason>) {
        let mut c = chunk(&self.meta, self.first, text, finish, self.include_usage);
        if let Some(t) = &mut self.tools {
            t.patch_chunk(&mut c);
        }
        self.first = false;
        self.pending.push_back(frame(&c));
    }

    /// A piece of the answer, through the reasoning splitter when there is one.
    fn split(&mut self, text: &str) -> Split {
        let mut split = match &mut self.reasoning {
            Some(p) => p.push(text),
            None => Split {
                reasoning: String::new(),
                content: text.to_string(),
            },
        };
        if let Some(t) = &mut self.tools {
            split.content = t.push(&split.content);
        }
        split
    }

    fn tools_pending(&self) -> bool {
        self.tools.as_ref().is_some_and(ToolStream::has_pending)
    }

    fn finish(&mut self, reason: FinishReason, usage: &Usage, tail: &str) {
        let mut rest = self.split(tail);
        if let Some(p) = &mut self.reasoning {
            let mut last = p.finish();
            if let Some(t) = &mut self.tools {
                last.content = t.push(&last.content);
            }
            rest.extend(last);
        }
        if let Some(t) = &mut self.tools {
            let held = t.finish();
            rest.content.push_str(&held);
        }
        if !rest.is_empty() || self.tools_pending() {
            self.text(&rest, None);
        }
        self.text(&Split::default(), Some(reason));
        if self.include_usage {
            self.pending
                .push_back(frame(&usage_chunk(&self.meta, usage)));
        }
        self.pending
            .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
        self.ended = true;
        self.guard.done();
    }

    fn on_event(&mut self, ev: Event) {
        match ev {
            Event::Started { .. } => {}
            Event::Token { text, .. } => {
                let split = self.split(&text);
                if !split.is_empty() || self.first || self.tools_pending() {
                    self.text(&split, None);
                }
            }
            Event::Finished {
                reason,
                usage,
                text,
                ..
            } => self.finish(reason, &usage, &text),
            Event::Refused { reason, .. } => {
                let err = super::errors::ApiError::refused(&reason);
                self.pending.push_back(frame(&err.body()));
                self.pending
                    .push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                self.ended = true;
                self.guard.done();
            }
        }
    }
}

impl futures_core::Stream for SseStream {
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
                Poll::Ready(None) => {
                    // The engine went away without a last event.
                    let err = super::errors::ApiError::refused(
                        &tpslab_engine::serving::engine::Refusal::Stopped,
                    );
                    this.pending.push_back(frame(&err.body()));
                    this.ended = true;
                    this.guard.done();
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

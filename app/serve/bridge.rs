//! The bridge from the engine's per-request std channels to async handlers. A request's
//! choices (`n`) are submitted as separate engine requests, each forwarded by a blocking-pool
//! task onto one tokio channel tagged with the choice's index (recording the server's metrics
//! on the way). A guard per choice cancels it in the engine when its handler or response
//! stream is dropped, which is what happens when the client disconnects.

use std::collections::VecDeque;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tpslab_engine::sched::RequestId;
use tpslab_engine::serving::engine::{EngineHandle, Event, Request};

use super::errors::ApiError;
use super::metrics::ServerMetrics;
use super::share::Held;

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

/// An event of one choice.
pub type Indexed = (usize, Event);

/// Submits one request as choice `index`; its events arrive on `tx`. Never blocks the caller:
/// the blocking `recv` runs on tokio's blocking pool and ends with the request's last event.
pub(super) fn submit_to(
    engine: &EngineHandle,
    req: Request,
    metrics: Arc<ServerMetrics>,
    index: usize,
    tx: UnboundedSender<Indexed>,
) -> CancelGuard {
    let (etx, erx) = std::sync::mpsc::channel();
    let sent = Instant::now();
    let prompt_len = req.prompt.len();
    let id = engine.submit(req, etx);
    tokio::task::spawn_blocking(move || {
        let mut timer = metrics.start(sent, prompt_len);
        while let Ok(ev) = erx.recv() {
            let last = matches!(ev, Event::Finished { .. } | Event::Refused { .. });
            timer.observe(&ev);
            // A closed receiver (client gone) is not a reason to stop: the cancel is on its way
            // and the `Finished` that follows keeps the counters whole.
            let _ = tx.send((index, ev));
            if last {
                break;
            }
        }
    });
    CancelGuard {
        engine: engine.clone(),
        id,
        done: false,
    }
}

/// The choices of one request, running: their events in arrival order, each tagged with its
/// index, and their guards (a choice's is disarmed by its last event).
pub struct Choices {
    events: UnboundedReceiver<Indexed>,
    guards: Vec<CancelGuard>,
    /// Events read while the choices were being started, handed out first.
    buffered: VecDeque<Indexed>,
    /// The client's share this request holds, given back with the choices.
    held: Option<Held>,
}

impl Choices {
    /// Submits `n` choices of `req` (choice `i` seeded `seed + i` when a seed is given) and
    /// waits until the engine has accepted all of them, so a refusal (queue full, no room) is
    /// a real error status and not an error inside a 200 stream. With `n > 1` the others are
    /// submitted once the first has produced its first token: its prompt's KV blocks are in
    /// the prefix cache by then, and the others reuse them instead of computing the prompt
    /// again; its prompt log-probabilities, when asked for, are given to every choice.
    pub async fn start(
        engine: &EngineHandle,
        metrics: &Arc<ServerMetrics>,
        req: Request,
        n: usize,
    ) -> Result<Choices, ApiError> {
        let (tx, events) = unbounded_channel();
        let mut c = Choices {
            events,
            guards: Vec::with_capacity(n),
            buffered: VecDeque::new(),
            held: None,
        };
        let seeded = |i: usize| {
            let mut r = req.clone();
            r.sampling.seed = req.sampling.seed.map(|s| s.wrapping_add(i as u64));
            r
        };
        c.guards.push(submit_to(
            engine,
            seeded(0),
            Arc::clone(metrics),
            0,
            tx.clone(),
        ));
        c.wait(|ev| matches!(ev, Event::Started { .. }), 1).await?;
        if n > 1 {
            // Choice 0's first token (or its end): its prompt has been computed.
            c.wait(
                |ev| matches!(ev, Event::Token { .. } | Event::Finished { .. }),
                1,
            )
            .await?;
            // The prompt's log-probabilities are the same for every choice: scored once, by
            // choice 0 (they came before its first token), and handed to the others.
            let scored = c
                .buffered
                .iter()
                .find(|(i, e)| *i == 0 && matches!(e, Event::PromptLogprobs { .. }))
                .map(|(_, e)| e.clone());
            for i in 1..n {
                let mut r = seeded(i);
                r.prompt_logprobs = None;
                let g = submit_to(engine, r, Arc::clone(metrics), i, tx.clone());
                c.guards.push(g);
                if let Some(ev) = &scored {
                    c.buffered.push_back((i, ev.clone()));
                }
            }
            c.wait(|ev| matches!(ev, Event::Started { .. }), n).await?;
        }
        Ok(c)
    }

    /// Reads events (kept for later) until `count` of them are `want` in all; a refusal of any
    /// choice, or the engine stopping, ends the whole request with that error (dropping `self`
    /// cancels the choices that started).
    async fn wait(&mut self, want: impl Fn(&Event) -> bool, count: usize) -> Result<(), ApiError> {
        let mut seen = self.buffered.iter().filter(|(_, e)| want(e)).count();
        while seen < count {
            match self.events.recv().await {
                Some((i, Event::Refused { reason, .. })) => {
                    self.disarm(i);
                    return Err(ApiError::refused(&reason));
                }
                Some(ev) => {
                    seen += usize::from(want(&ev.1));
                    if matches!(ev.1, Event::Finished { .. }) {
                        self.disarm(ev.0);
                    }
                    self.buffered.push_back(ev);
                }
                None => return Err(ApiError::internal("the engine stopped")),
            }
        }
        Ok(())
    }

    fn disarm(&mut self, i: usize) {
        if let Some(g) = self.guards.get_mut(i) {
            g.done();
        }
    }

    /// Keeps `held` (the client's share this request takes) until the choices are dropped.
    pub fn hold(&mut self, held: Held) {
        self.held = Some(held);
    }

    /// How many choices there are.
    pub fn count(&self) -> usize {
        self.guards.len()
    }

    /// The engine's id of the first choice (the response's id is made from it).
    pub fn first_id(&self) -> RequestId {
        self.guards
            .first()
            .map_or(RequestId::default(), CancelGuard::id)
    }

    /// The next event of any choice; `None` once every choice's channel has closed. A
    /// choice's last event (finished or refused) disarms its guard.
    pub fn poll_next(&mut self, cx: &mut Context<'_>) -> Poll<Option<Indexed>> {
        let ev = match self.buffered.pop_front() {
            Some(ev) => Some(ev),
            None => match self.events.poll_recv(cx) {
                Poll::Ready(ev) => ev,
                Poll::Pending => return Poll::Pending,
            },
        };
        if let Some((i, Event::Finished { .. } | Event::Refused { .. })) = &ev {
            self.disarm(*i);
        }
        Poll::Ready(ev)
    }

    /// As [`Self::poll_next`], awaited.
    pub async fn next(&mut self) -> Option<Indexed> {
        std::future::poll_fn(|cx| self.poll_next(cx)).await
    }

    /// Disarms every guard: the request ended for all of its choices.
    pub fn all_done(&mut self) {
        for g in &mut self.guards {
            g.done();
        }
    }
}

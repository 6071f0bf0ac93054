//! One replica of a fleet: its running and waiting requests, its KV use in tokens, and its steps
//! as the planner's step model prices them. The scheduler has vLLM v1's shape (as the engine's
//! own): running requests first, then waiting ones, under a token budget and a sequence cap; a
//! long prompt is chunked; when the KV runs out, the newest running request is preempted (its KV
//! dropped, recomputed later) and put back first in the queue.

use std::collections::VecDeque;

use super::stats::Recorder;
use crate::plan::roofline::StepModel;

/// A request on a replica. Its known tokens are its prompt and what it has generated; the KV
/// holds `computed` of them; when a step brings `computed` up to the known tokens, the step
/// samples the next one.
#[derive(Debug, Clone)]
pub struct Seq {
    pub arrival: f64,
    pub prompt: u32,
    pub output: u32,
    computed: u32,
    generated: u32,
    last_token: f64,
}

impl Seq {
    pub fn new(arrival: f64, prompt: u32, output: u32) -> Self {
        Self {
            arrival,
            prompt,
            output,
            computed: 0,
            generated: 0,
            last_token: arrival,
        }
    }

    fn known(&self) -> u32 {
        self.prompt + self.generated
    }
}

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Phase {
    /// Scaling up and loading its weights; takes requests from `ready_at`.
    Booting {
        ready_at: f64,
    },
    Ready,
    /// Takes no new request; stops once empty.
    Draining,
    Stopped,
}

/// The scheduler's knobs of a replica.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    pub max_seqs: usize,
    pub token_budget: u32,
}

/// One replica.
#[derive(Debug)]
pub struct Replica {
    pub phase: Phase,
    /// When its device started to be paid for.
    pub billed_from: f64,
    pub stopped_at: Option<f64>,
    /// A step is in flight (its end is in the event queue).
    pub busy: bool,
    pub preemptions: u64,
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
    kv_used: u64,
    kv_cap: u64,
    /// (index into `running`, tokens) of the step in flight.
    scheduled: Vec<(usize, u32)>,
}

impl Replica {
    pub fn new(phase: Phase, billed_from: f64, kv_cap: u64) -> Self {
        Self {
            phase,
            billed_from,
            stopped_at: None,
            busy: false,
            preemptions: 0,
            running: Vec::new(),
            waiting: VecDeque::new(),
            kv_used: 0,
            kv_cap,
            scheduled: Vec::new(),
        }
    }

    /// Requests running or waiting here (what the router balances).
    pub fn outstanding(&self) -> usize {
        self.running.len() + self.waiting.len()
    }

    pub fn queued(&self) -> usize {
        self.waiting.len()
    }

    /// Share of the KV capacity in use.
    pub fn kv_use(&self) -> f64 {
        self.kv_used as f64 / self.kv_cap.max(1) as f64
    }

    pub fn enqueue(&mut self, s: Seq) {
        self.waiting.push_back(s);
    }

    /// The newest running request back to the front of the queue, its KV dropped.
    fn preempt_newest(&mut self) {
        if let Some(mut s) = self.running.pop() {
            self.kv_used -= u64::from(s.computed);
            s.computed = 0;
            self.waiting.push_front(s);
            self.preemptions += 1;
        }
    }

    /// Schedules the next step and returns its length in seconds; `None` when there is nothing
    /// to do. Every sequence fits the KV alone (the router refuses longer ones), so the oldest
    /// running one always progresses and the loop below ends.
    pub fn start_step(&mut self, model: &StepModel, knobs: Knobs) -> Option<f64> {
        self.scheduled.clear();
        let mut budget = knobs.token_budget;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let s = &self.running[i];
            let n = (s.known() - s.computed).min(budget);
            while self.kv_cap - self.kv_used < u64::from(n) && i < self.running.len() {
                self.preempt_newest();
            }
            if i == self.running.len() {
                break;
            }
            self.scheduled.push((i, n));
            self.kv_used += u64::from(n);
            budget -= n;
            i += 1;
        }
        while budget > 0 && self.running.len() < knobs.max_seqs {
            let Some(s) = self.waiting.front() else { break };
            let n = (s.known() - s.computed).min(budget);
            if self.kv_cap - self.kv_used < u64::from(n) {
                break;
            }
            if let Some(s) = self.waiting.pop_front() {
                self.running.push(s);
            }
            self.scheduled.push((self.running.len() - 1, n));
            self.kv_used += u64::from(n);
            budget -= n;
        }
        if self.scheduled.is_empty() {
            return None;
        }
        let (mut decoding, mut ctx, mut prefill) = (0usize, 0.0, 0usize);
        for &(i, n) in &self.scheduled {
            let s = &self.running[i];
            if s.computed >= s.prompt {
                decoding += 1;
                ctx += f64::from(s.computed);
            } else {
                prefill += n as usize;
            }
        }
        let ctx = if decoding > 0 {
            ctx / decoding as f64
        } else {
            0.0
        };
        Some(model.step_s(decoding, ctx, prefill))
    }

    /// Ends the step in flight at `t`: its tokens are sampled and recorded, finished requests
    /// leave and free their KV. `overhead_s` is the calibration's fixed time before a first
    /// token, added to each request's TTFT and E2E latency.
    pub fn finish_step(&mut self, t: f64, overhead_s: f64, rec: &mut Recorder) {
        for &(i, n) in &self.scheduled {
            let s = &mut self.running[i];
            s.computed += n;
            if s.computed < s.known() {
                continue;
            }
            s.generated += 1;
            rec.token(t);
            if s.generated == 1 {
                rec.first_token(s.arrival, t + overhead_s - s.arrival);
            } else {
                rec.inter_token(t, t - s.last_token);
            }
            s.last_token = t;
            if s.generated == s.output {
                rec.finished(s.arrival, t + overhead_s - s.arrival);
            }
        }
        self.scheduled.clear();
        let mut freed = 0u64;
        self.running.retain(|s| {
            let done = s.generated == s.output;
            if done {
                freed += u64::from(s.computed);
            }
            !done
        });
        self.kv_used -= freed;
    }
}

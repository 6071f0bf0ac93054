//! The continuous-batching scheduler in the shape of vLLM v1: per step, which tokens of which
//! requests to compute, under a token budget and a sequence cap, over a paged KV pool.
//!
//! There is no prefill or decode phase. Each request has `all_tokens` (prompt + generated) and
//! `num_computed_tokens`; a step gives a request the next tokens it has not computed yet (a
//! whole prompt, a chunk of one, or the single newest token of a decode). Running requests are
//! served first, then waiting ones in policy order. When KV blocks run out, the newest running
//! request (lowest priority under [`Policy::Priority`]; of those, the busiest client's) is
//! preempted: its blocks are freed, its
//! generated tokens kept, and it goes back to the front of the queue to be recomputed later.
//! Under [`Policy::Priority`] a full batch also makes room, one request per step, for a waiting
//! request of a strictly better priority than its worst running one (as vLLM v0's priority
//! scheduling): the window's chats go ahead of its load generator's requests this way.
//!
//! Fair shares: each request belongs to a client ([`ClientId`]: the server's API key or
//! address). Among waiting requests of equal priority the one whose client runs the fewest
//! sequences starts first, and a full batch makes room, one request per step, for a client
//! running at least two fewer sequences than the client running the most (never for a better
//! priority's request): four requests of `n = 16` from one client cannot keep another's short
//! chat waiting for a slot. With one client this is the order above, unchanged.
//!
//! Protocol, once per step: `out = schedule()`, run the model on `out`, sample a token for each
//! [`ScheduledSeq`] with `sample` set, then `update(&out, &sampled)`. Alone, the scheduler ends
//! a request at its `max_tokens`; the engine instead passes its stop checker to
//! [`Scheduler::update_with`], which then decides every ending (stop token, stop string,
//! length) in one place. Everything here is plain data and deterministic; there are no threads
//! and no model.
//!
//! Chunked prefill off: a waiting request starts only if everything it has left to compute fits
//! the step's remaining budget. One that could never fit (more tokens left than
//! `max_num_batched_tokens`: a long prompt, or a long request recomputed after preemption)
//! starts when it is first in line and nothing else has been scheduled in the step, and then
//! proceeds in budget-sized chunks. Such requests are therefore accepted, never refused, and the
//! budget is never exceeded.

//!
//! Speculative decoding, as vLLM v1 schedules it: a proposer's tokens for a running request
//! ([`Scheduler::set_draft`]) are scheduled as extra tokens of that request in the same step,
//! within the token budget and the request's `max_tokens`; the model's logits at those
//! positions verify them, [`Scheduler::update_tokens`] appends the accepted ones plus the token
//! after them, and the KV slots of the rejected ones go back to the pool (only accepted tokens
//! ever enter the prefix cache). A preempted request drops its proposals.
//!
//! Modules:
//! - [`stop`]: stop tokens, stop strings and token limits; finish reasons (the one owner of when
//!   a sequence ends).
//! - `order`: which waiting request starts next and whom a full batch preempts for it (the
//!   policy, priorities, and each client's fair share of the batch).
//! - `update`: applying a step's results (appending tokens, prefix caching, rolling back
//!   rejected proposals) and taking proposals.
//! - `config`: the batching knobs ([`SchedulerConfig`], [`Policy`]) and their checks.
//! - [`adaptive`]: the adaptive token budget (a step-time model fitted online that sizes each
//!   step's prefill chunk so running decodes keep their inter-token latency under a target).

pub mod adaptive;
mod config;
mod order;
pub mod stop;
mod update;

use std::collections::{HashMap, VecDeque};

use serde::Serialize;
use thiserror::Error;

pub use self::config::{Policy, SchedulerConfig};
use self::config::{check_config, check_pool};
pub use self::order::ClientId;
pub use crate::kv::block_pool::RequestId;
use crate::kv::block_pool::{BlockId, KvManager};
use crate::kv::{KvNeverFits, KvPool};
use crate::sched::stop::FinishReason;

/// The most prompt positions whose logits rows one step computes for a request that scores its
/// prompt ([`SchedRequest::prompt_rows`]): each row is a whole vocabulary of floats (192 KiB
/// for a 49k vocabulary), so a 2,048-token chunk would take 400 MB; its prompt goes in chunks
/// of this many instead, other requests running beside it.
pub const PROMPT_ROWS_PER_STEP: usize = 128;

/// A request as the scheduler sees it: token ids only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedRequest {
    pub id: RequestId,
    pub prompt: Vec<u32>,
    /// The most tokens it generates: what its KV blocks are reserved for (admission and
    /// `rebuild_pool` check it fits), and where [`Scheduler::update`] ends it with
    /// [`FinishReason::Length`]. Under [`Scheduler::update_with`] the caller's stop checker,
    /// given the same admitted number, says when it ends.
    pub max_tokens: usize,
    /// Lower runs first under [`Policy::Priority`]; ignored under FCFS.
    pub priority: i32,
    /// Whose request it is, for fair shares of the batch.
    pub client: ClientId,
    /// Logits rows for every prompt position too (prompt log-probabilities): its prompt is
    /// computed whole, never taken from the prefix cache (as vLLM does for `prompt_logprobs`).
    pub prompt_rows: bool,
    /// Its prompt is computed whole, never taken from the prefix cache (embeddings pooled
    /// over every prompt token), without logits rows for it.
    pub whole_prompt: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SchedError {
    #[error("server busy: {max_waiting} requests already waiting")]
    QueueFull { max_waiting: usize },
    #[error("request id {0} is already queued or running")]
    DuplicateId(RequestId),
    #[error("the prompt is empty")]
    EmptyPrompt,
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    #[error("{}", KvNeverFits { tokens: *tokens, needed_blocks: *needed_blocks, num_blocks: *num_blocks })]
    TooLong {
        tokens: usize,
        needed_blocks: usize,
        num_blocks: usize,
    },
    #[error("invalid scheduler setting: {0}")]
    InvalidConfig(String),
}

impl From<KvNeverFits> for SchedError {
    fn from(e: KvNeverFits) -> Self {
        Self::TooLong {
            tokens: e.tokens,
            needed_blocks: e.needed_blocks,
            num_blocks: e.num_blocks,
        }
    }
}

/// A token just appended to a request in [`Scheduler::update_with`], for the caller's decision
/// whether the request ends with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub id: RequestId,
    pub token: u32,
    /// Generated tokens now, this one included.
    pub generated: usize,
    /// The request's `max_tokens`.
    pub max_tokens: usize,
}

/// Where a live request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestStatus {
    Waiting,
    Running,
}

/// One sequence's share of a step: compute `tokens` at positions `start_pos..`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledSeq {
    pub id: RequestId,
    pub start_pos: usize,
    pub tokens: Vec<u32>,
    /// Covers at least positions `0..start_pos + tokens.len()`.
    pub block_table: Vec<BlockId>,
    /// After this step every known token of the request is computed, so the last position's
    /// logits give its next token: sample one and pass it to [`Scheduler::update`].
    pub sample: bool,
    /// Proposed tokens (speculative decoding), the last `draft.len()` of `tokens`: the logits
    /// of the position before each verify it, and the last one's logits give the token after
    /// them all. Empty when nothing was proposed.
    pub draft: Vec<u32>,
    /// Logits rows for every position of `tokens` ([`SchedRequest::prompt_rows`]): the first
    /// [`Self::prompt_rows`] give the next prompt token's log-probability.
    pub all_rows: bool,
}

impl ScheduledSeq {
    /// Logits rows this sequence asks the forward pass for: one per proposed token plus the
    /// next token's, or none while a prompt chunk is still short of the end.
    pub fn num_logits(&self) -> usize {
        if self.all_rows {
            self.tokens.len()
        } else if self.sample {
            1 + self.draft.len()
        } else {
            0
        }
    }

    /// Of [`Self::num_logits`], the leading rows that score the prompt's next token (the rest
    /// are sampled from).
    pub fn prompt_rows(&self) -> usize {
        if self.all_rows {
            self.tokens.len() - if self.sample { 1 + self.draft.len() } else { 0 }
        } else {
            0
        }
    }

    /// The tokens of the request itself (prompt or generated), without the proposals.
    pub fn real_tokens(&self) -> &[u32] {
        &self.tokens[..self.tokens.len() - self.draft.len()]
    }
}

/// One step's plan, as plain data.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// Running requests first (oldest / most urgent first), then newly started ones.
    pub scheduled: Vec<ScheduledSeq>,
    /// Requests preempted in this step (back in the queue, to be recomputed).
    pub preempted: Vec<RequestId>,
    /// Total tokens in `scheduled`.
    pub num_batched_tokens: usize,
}

impl SchedulerOutput {
    pub fn is_empty(&self) -> bool {
        self.scheduled.is_empty()
    }
}

/// Counters for the dashboard, read after any step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct SchedulerStats {
    pub running: usize,
    pub waiting: usize,
    pub kv_used_blocks: usize,
    pub kv_total_blocks: usize,
    pub kv_block_size: usize,
    /// Blocks registered in the prefix cache (in use or free but still reusable).
    pub kv_cached_blocks: usize,
    pub preemptions_total: u64,
    /// Prefix cache: prompt tokens looked up, and of those found computed (vLLM's counters).
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Sequences and tokens in the last step.
    pub last_step_seqs: usize,
    pub last_step_tokens: usize,
}

#[derive(Debug, Clone)]
struct Request {
    all_tokens: Vec<u32>,
    num_prompt_tokens: usize,
    max_tokens: usize,
    priority: i32,
    client: ClientId,
    arrival: u64,
    num_computed_tokens: usize,
    status: RequestStatus,
    /// Proposed tokens to verify in the next step ([`Scheduler::set_draft`]); never part of
    /// `all_tokens` until the model accepts them.
    draft: Vec<u32>,
    prompt_rows: bool,
    whole_prompt: bool,
}

impl Request {
    fn num_generated(&self) -> usize {
        self.all_tokens.len() - self.num_prompt_tokens
    }

    /// Whether its steps give the prompt positions' rows: until its first token (a request
    /// preempted after that has had them).
    fn wants_prompt_rows(&self) -> bool {
        self.prompt_rows && self.num_generated() == 0
    }

    /// Whether its prompt must be computed, not found in the prefix cache.
    fn uncached(&self) -> bool {
        (self.prompt_rows || self.whole_prompt) && self.num_generated() == 0
    }

    /// The most tokens one step may compute for it: [`PROMPT_ROWS_PER_STEP`] while its prompt
    /// rows are scored (each is a whole logits row), else no limit of its own.
    fn step_cap(&self) -> usize {
        if self.wants_prompt_rows() {
            PROMPT_ROWS_PER_STEP
        } else {
            usize::MAX
        }
    }
}

/// The scheduler; see the module docs for the step protocol.
#[derive(Debug, Clone)]
pub struct Scheduler {
    config: SchedulerConfig,
    kv: KvManager,
    reqs: HashMap<RequestId, Request>,
    waiting: VecDeque<RequestId>,
    /// Kept sorted by preemption order at the start of each step (see `sort_running`).
    running: Vec<RequestId>,
    next_arrival: u64,
    preemptions_total: u64,
    last_step: (usize, usize),
    /// The model's sliding window when every layer has one: blocks that leave it are freed.
    window: Option<usize>,
    /// Step times as the engine reported them, for the adaptive budget.
    step_cost: adaptive::StepCost,
}

impl Scheduler {
    pub fn new(
        config: SchedulerConfig,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Self, SchedError> {
        check_config(&config)?;
        check_pool(num_blocks, block_size)?;
        Ok(Self {
            kv: KvManager::new(num_blocks, block_size, config.prefix_caching),
            config,
            reqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_arrival: 0,
            preemptions_total: 0,
            last_step: (0, 0),
            window: None,
            step_cost: adaptive::StepCost::default(),
        })
    }

    /// Frees each request's KV blocks as they leave `window` (a model whose every layer
    /// attends over a sliding window of that many positions; `None` keeps every block).
    pub fn set_window(&mut self, window: Option<usize>) {
        self.window = window;
    }

    pub fn config(&self) -> &SchedulerConfig {
        &self.config
    }

    /// New knobs, effective from the next [`Self::schedule`]. Requests already admitted are
    /// kept even if they exceed a lowered `max_num_seqs` (only that many are scheduled per
    /// step) or `max_waiting`.
    pub fn set_config(&mut self, config: SchedulerConfig) -> Result<(), SchedError> {
        check_config(&config)?;
        self.kv.set_prefix_caching(config.prefix_caching);
        self.config = config;
        Ok(())
    }

    /// The KV pool's bookkeeping (block tables, reference counts), read-only.
    pub fn kv(&self) -> &KvManager {
        &self.kv
    }

    /// Replaces the KV pool with `num_blocks` blocks of `block_size` tokens (the KV budget or
    /// block size changed; the caller rebuilds its `KvCache` to match). Every running request
    /// is preempted first (it keeps its tokens and is recomputed in the new pool) and the
    /// prefix cache starts empty. Waiting requests that can no longer fit at all are finished
    /// with [`FinishReason::Abort`] and returned. Call it between an `update` and the next
    /// `schedule`, never with a step in flight.
    pub fn rebuild_pool(
        &mut self,
        num_blocks: usize,
        block_size: usize,
    ) -> Result<Vec<RequestId>, SchedError> {
        check_pool(num_blocks, block_size)?;
        self.sort_running();
        while let Some(id) = self.running.pop() {
            self.requeue_front(id);
        }
        let stats = self.kv.prefix_cache_stats();
        self.kv = KvManager::new(num_blocks, block_size, self.config.prefix_caching);
        self.kv.restore_prefix_cache_stats(stats);
        let too_long: Vec<RequestId> = self
            .waiting
            .iter()
            .copied()
            .filter(|id| {
                self.reqs
                    .get(id)
                    .is_some_and(|r| self.fit_check(r.num_prompt_tokens, r.max_tokens).is_err())
            })
            .collect();
        self.finish(&too_long, FinishReason::Abort);
        Ok(too_long)
    }

    /// The KV pool's shape (what [`crate::serving::admission::Admission`] checks requests against).
    pub fn kv_pool(&self) -> KvPool {
        KvPool {
            num_blocks: self.kv.pool().num_blocks(),
            block_size: self.kv.block_size(),
        }
    }

    /// Refuses requests that could never complete in the pool (the rule is
    /// [`KvPool::fit`]'s, the one admission applies).
    fn fit_check(&self, prompt_len: usize, max_tokens: usize) -> Result<(), SchedError> {
        self.kv_pool().fit(prompt_len, max_tokens)?;
        Ok(())
    }

    /// Queues a request. Refused (and not queued) when the queue is at `max_waiting`, the id
    /// is live already, the prompt is empty, `max_tokens` is 0, or it could never fit the pool.
    /// The engine admits requests itself and queues them with [`Self::add_admitted`]; this is
    /// for callers that drive the scheduler alone.
    pub fn add_request(&mut self, req: SchedRequest) -> Result<(), SchedError> {
        self.check_queue(&req)?;
        if req.prompt.is_empty() {
            return Err(SchedError::EmptyPrompt);
        }
        if req.max_tokens == 0 {
            return Err(SchedError::ZeroMaxTokens);
        }
        self.fit_check(req.prompt.len(), req.max_tokens)?;
        self.insert(req);
        Ok(())
    }

    /// Queues a request already admitted ([`crate::serving::admission::Admission::check`] against this
    /// pool): only the queue's state can refuse it.
    pub fn add_admitted(&mut self, req: SchedRequest) -> Result<(), SchedError> {
        self.check_queue(&req)?;
        debug_assert!(
            !req.prompt.is_empty()
                && req.max_tokens > 0
                && self.fit_check(req.prompt.len(), req.max_tokens).is_ok(),
            "request {} was not admitted against this pool",
            req.id
        );
        self.insert(req);
        Ok(())
    }

    /// Load shedding and id reuse: what refuses a request however well-formed it is.
    fn check_queue(&self, req: &SchedRequest) -> Result<(), SchedError> {
        if let Some(max_waiting) = self.config.max_waiting
            && self.waiting.len() >= max_waiting
        {
            return Err(SchedError::QueueFull { max_waiting });
        }
        if self.reqs.contains_key(&req.id) {
            return Err(SchedError::DuplicateId(req.id));
        }
        Ok(())
    }

    fn insert(&mut self, req: SchedRequest) {
        let arrival = self.next_arrival;
        self.next_arrival += 1;
        self.reqs.insert(
            req.id,
            Request {
                num_prompt_tokens: req.prompt.len(),
                all_tokens: req.prompt,
                max_tokens: req.max_tokens,
                priority: req.priority,
                client: req.client,
                arrival,
                num_computed_tokens: 0,
                status: RequestStatus::Waiting,
                draft: Vec::new(),
                prompt_rows: req.prompt_rows,
                whole_prompt: req.whole_prompt,
            },
        );
        self.waiting.push_back(req.id);
    }

    /// Preemption order key: the greatest is preempted first, the least is served first.
    fn order_key(&self, id: RequestId) -> (i32, u64) {
        let r = self.reqs.get(&id);
        let arrival = r.map_or(u64::MAX, |r| r.arrival);
        match self.config.policy {
            Policy::Fcfs => (0, arrival),
            Policy::Priority => (r.map_or(i32::MAX, |r| r.priority), arrival),
        }
    }

    /// Keeps `running` in service order, so the preemption victim (the last) is never a
    /// request already scheduled earlier in the same step.
    fn sort_running(&mut self) {
        let mut running = std::mem::take(&mut self.running);
        running.sort_by_key(|&id| self.order_key(id));
        self.running = running;
    }

    /// Frees `id`'s blocks and queues it first for recompute; its tokens are kept.
    fn requeue_front(&mut self, id: RequestId) {
        self.kv.free(id);
        if let Some(r) = self.reqs.get_mut(&id) {
            r.num_computed_tokens = 0;
            r.status = RequestStatus::Waiting;
            r.draft.clear();
        }
        self.waiting.push_front(id);
    }

    /// Preempts `id` (already out of `running`) in this step: requeued, counted, reported.
    fn preempt(&mut self, id: RequestId, out: &mut SchedulerOutput) {
        self.requeue_front(id);
        self.preemptions_total += 1;
        out.preempted.push(id);
    }

    /// `n` real tokens from `start`, then `draft`'s proposals (only for a request whose real
    /// tokens then all are computed).
    fn scheduled_seq(
        &self,
        id: RequestId,
        start: usize,
        n: usize,
        draft: Vec<u32>,
    ) -> ScheduledSeq {
        let r = self.reqs.get(&id);
        let tokens = r.map_or(&[][..], |r| &r.all_tokens[start..start + n]);
        let all_rows = r.is_some_and(Request::wants_prompt_rows);
        let len = r.map_or(0, |r| r.all_tokens.len());
        let sample = start + n == len;
        debug_assert!(
            sample || draft.is_empty(),
            "proposals only follow the last token"
        );
        let mut all = tokens.to_vec();
        all.extend_from_slice(&draft);
        ScheduledSeq {
            id,
            start_pos: start,
            tokens: all,
            block_table: self.kv.block_table(id).to_vec(),
            sample,
            draft,
            all_rows,
        }
    }

    /// A step of `tokens` tokens took `step_ms` (the engine's wall time): feeds the adaptive
    /// budget's step-time model.
    pub fn record_step_time(&mut self, tokens: usize, step_ms: f64) {
        self.step_cost.observe(tokens, step_ms);
    }

    /// The token budget the next [`Self::schedule`] plans under: `max_num_batched_tokens`, or
    /// with the adaptive budget on and requests decoding, what keeps a step under
    /// `itl_target_ms` (never below one token per decode plus one block of prefill).
    pub fn step_budget(&self) -> usize {
        let max = self.config.max_num_batched_tokens;
        if !self.config.adaptive_budget {
            return max;
        }
        let decodes = (self.running.iter())
            .filter_map(|id| self.reqs.get(id))
            .filter(|r| r.num_computed_tokens >= r.num_prompt_tokens)
            .count();
        let floor = decodes + self.kv.block_size();
        let target = f64::from(self.config.itl_target_ms);
        adaptive::budget(&self.step_cost, target, decodes, floor, max)
    }

    /// Plans the next step: running requests first, then waiting ones. See the module docs.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        // This step's cap: `max_num_batched_tokens`, or less under the adaptive budget.
        let cap = self.step_budget();
        let mut budget = cap;
        self.sort_running();
        self.preempt_for_waiting(&mut out);
        let for_priority = out.preempted.len();
        self.schedule_running(&mut out, &mut budget);
        // As vLLM: a step that had to preempt for KV blocks admits nobody, or it would thrash.
        // A slot freed for a better priority or a client's share is taken in the same step.
        if out.preempted.len() == for_priority {
            self.schedule_waiting(&mut out, &mut budget, cap);
        }
        out.num_batched_tokens = out.scheduled.iter().map(|s| s.tokens.len()).sum();
        self.last_step = (out.scheduled.len(), out.num_batched_tokens);
        out
    }

    fn schedule_running(&mut self, out: &mut SchedulerOutput, budget: &mut usize) {
        let mut i = 0;
        while i < self.running.len()
            && *budget > 0
            && out.scheduled.len() < self.config.max_num_seqs
        {
            let id = self.running[i];
            let Some(r) = self.reqs.get(&id) else {
                self.running.remove(i);
                continue;
            };
            let start = r.num_computed_tokens;
            let n = (r.all_tokens.len() - start).min(*budget).min(r.step_cap());
            if n == 0 {
                i += 1;
                continue;
            }
            let draft = self.draft_for(id, start + n, *budget - n);
            // Free blocks by preempting requests not scheduled yet in this step (the least
            // urgent, the busiest client's newest: `kv_victim`) until this request fits, or by
            // preempting it when none is left.
            let scheduled = loop {
                if self
                    .kv
                    .allocate_slots(id, start + n + draft.len(), &[])
                    .is_some()
                {
                    break true;
                }
                let victim = self.running.remove(self.kv_victim(i).unwrap_or(i));
                self.preempt(victim, out);
                if victim == id {
                    break false;
                }
            };
            if !scheduled {
                break;
            }
            *budget -= n + draft.len();
            out.scheduled.push(self.scheduled_seq(id, start, n, draft));
            i += 1;
        }
    }

    fn schedule_waiting(&mut self, out: &mut SchedulerOutput, budget: &mut usize, cap: usize) {
        while *budget > 0
            && self.running.len() < self.config.max_num_seqs
            && out.scheduled.len() < self.config.max_num_seqs
        {
            let Some(idx) = self.next_waiting() else {
                break;
            };
            let id = self.waiting[idx];
            let Some(r) = self.reqs.get(&id) else {
                self.waiting.remove(idx);
                continue;
            };
            let (hit_blocks, hit_tokens) = if r.uncached() {
                (Vec::new(), 0)
            } else {
                self.kv.computed_blocks(&r.all_tokens)
            };
            let total = r.all_tokens.len();
            let left = total - hit_tokens;
            if !self.config.chunked_prefill && left > *budget {
                // Only a request that can never fit whole may go in chunks, and only as the
                // step's first entry (see the module docs).
                let untouched = *budget == cap;
                if !(left > cap && untouched) {
                    break;
                }
            }
            let n = left.min(*budget).min(r.step_cap());
            if self
                .kv
                .allocate_slots(id, hit_tokens + n, &hit_blocks)
                .is_none()
            {
                break;
            }
            self.kv.record_prefix_query(total, hit_tokens);
            self.waiting.remove(idx);
            if let Some(r) = self.reqs.get_mut(&id) {
                r.num_computed_tokens = hit_tokens;
                r.status = RequestStatus::Running;
            }
            self.running.push(id);
            out.scheduled
                .push(self.scheduled_seq(id, hit_tokens, n, Vec::new()));
            *budget -= n;
        }
    }

    /// Ends requests (stop, length, abort), freeing their blocks; unknown ids are ignored.
    /// Returns the ids that were live. The reason is the caller's to report; it does not change
    /// what is freed.
    pub fn finish(&mut self, ids: &[RequestId], _reason: FinishReason) -> Vec<RequestId> {
        let mut removed = Vec::new();
        for &id in ids {
            let Some(r) = self.reqs.remove(&id) else {
                continue;
            };
            match r.status {
                RequestStatus::Running => self.running.retain(|&x| x != id),
                RequestStatus::Waiting => self.waiting.retain(|&x| x != id),
            }
            self.kv.free(id);
            removed.push(id);
        }
        removed
    }

    pub fn status(&self, id: RequestId) -> Option<RequestStatus> {
        self.reqs.get(&id).map(|r| r.status)
    }

    /// Prompt plus generated tokens of a live request.
    pub fn tokens(&self, id: RequestId) -> Option<&[u32]> {
        self.reqs.get(&id).map(|r| &r.all_tokens[..])
    }

    /// Generated tokens of a live request.
    pub fn generated(&self, id: RequestId) -> Option<&[u32]> {
        self.reqs
            .get(&id)
            .map(|r| &r.all_tokens[r.num_prompt_tokens..])
    }

    pub fn num_computed_tokens(&self, id: RequestId) -> Option<usize> {
        self.reqs.get(&id).map(|r| r.num_computed_tokens)
    }

    /// Waiting requests, next to start first under FCFS (queue order).
    pub fn waiting_ids(&self) -> Vec<RequestId> {
        self.waiting.iter().copied().collect()
    }

    /// Requests running now (what `running_ids().len()` says, without the copy).
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    pub fn running_ids(&self) -> Vec<RequestId> {
        self.running.clone()
    }

    /// True while any request is waiting or running.
    pub fn has_unfinished(&self) -> bool {
        !self.reqs.is_empty()
    }

    pub fn stats(&self) -> SchedulerStats {
        let (used, total) = self.kv.usage();
        let pc = self.kv.prefix_cache_stats();
        SchedulerStats {
            running: self.running.len(),
            waiting: self.waiting.len(),
            kv_used_blocks: used,
            kv_total_blocks: total,
            kv_block_size: self.kv.block_size(),
            kv_cached_blocks: self.kv.pool().num_cached(),
            preemptions_total: self.preemptions_total,
            prefix_cache_queries: pc.queries,
            prefix_cache_hits: pc.hits,
            last_step_seqs: self.last_step.0,
            last_step_tokens: self.last_step.1,
        }
    }
}

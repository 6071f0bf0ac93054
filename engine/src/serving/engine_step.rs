//! One step of the engine thread: proposals (speculative decoding), `schedule()`, ONE batched
//! forward for every scheduled token, sampling and verification, `update_tokens` (the scheduler
//! appends each token and asks the request's stop checker whether it ends there), events and
//! step metrics; and the failure isolation of a forward pass that fails.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::spec_step::{Row, verify_seq};
use super::{EngineThread, Live, PUBLISH_EVERY};
use crate::device::{ExpertLoad, RowNeed, StepOutput};
use crate::kv::Batch;
use crate::sched::stop::FinishReason;
use crate::sched::{RequestId, Scheduler, SchedulerOutput};
use crate::serving::logprobs::token_logprob;
use crate::serving::metrics::StepStats;
use crate::serving::request::{Event, Refusal};
use crate::serving::spec_metrics::{SpecStep, micros};

impl EngineThread {
    /// A forward pass failed. With several sequences in it, each runs alone to find the ones at
    /// fault: only those fail, and the others run this step again next time (nothing of it was
    /// recorded: `update` never ran). When each one runs fine alone the batch itself is the bug
    /// and all of its requests fail with the reason; the app goes on either way.
    fn forward_failed(&mut self, out: &SchedulerOutput, needs: &[RowNeed], error: &str) {
        let mut at_fault = Vec::new();
        if out.scheduled.len() > 1 {
            let mut rows = needs.iter();
            for s in &out.scheduled {
                let need: Vec<RowNeed> = rows.by_ref().take(s.num_logits()).copied().collect();
                let mut alone = Batch::default();
                alone.push_seq_rows(
                    s.block_table.clone(),
                    s.start_pos,
                    &s.tokens,
                    s.num_logits(),
                );
                if let Err(e) = self.backend.forward(&alone, &need) {
                    at_fault.push((s.id, e.to_string()));
                }
            }
        }
        if at_fault.is_empty() || at_fault.len() == out.scheduled.len() {
            at_fault = out
                .scheduled
                .iter()
                .map(|s| (s.id, error.to_string()))
                .collect();
        }
        for (id, error) in at_fault {
            self.fail(id, Refusal::Failed(error));
        }
    }

    /// Ends one request with an error (its events say why); the others go on.
    fn fail(&mut self, id: RequestId, reason: Refusal) {
        if let Some(l) = self.live.get(&id) {
            let _ = l.events.send(Event::Refused { id, reason });
        }
        self.sched.finish(&[id], FinishReason::Abort);
        self.spec_forget(id);
        self.live.remove(&id);
    }

    pub(super) fn step(&mut self) {
        let t0 = Instant::now();
        let mut spec = self.propose();
        let out = self.sched.schedule();
        if out.scheduled.is_empty() {
            // Nothing fits (should not happen: add_request refuses what can never fit).
            std::thread::sleep(Duration::from_millis(1));
            return;
        }
        for s in &out.scheduled {
            if let Some(l) = self.live.get_mut(&s.id) {
                l.queue_time
                    .get_or_insert_with(|| t0.saturating_duration_since(l.accepted));
                if s.sample {
                    l.batch.record(out.scheduled.len());
                }
            }
        }
        let mut batch = batch_from(&out);
        batch.hidden_rows = hidden_rows(&self.live, &out);
        // One need per logits row; verifying a proposal under sampling reads the whole row.
        let needs: Vec<RowNeed> = out
            .scheduled
            .iter()
            .flat_map(|s| {
                let need = match self.live.get(&s.id) {
                    // An embedding's last step samples nothing anyone reads.
                    Some(l) if l.pooled.is_some() => RowNeed::Argmax,
                    // The grammar's mask and the log-probabilities read the whole row.
                    Some(l) if l.constraint.is_some() || l.logprobs.is_some() => RowNeed::Full,
                    Some(l) if !l.sampler.needs_logits() => RowNeed::Argmax,
                    Some(_) if !s.draft.is_empty() => RowNeed::Full,
                    Some(l) => l.sampler.top_k_only().map_or(RowNeed::Full, RowNeed::TopK),
                    None => RowNeed::Argmax,
                };
                // Prompt rows are scored whole.
                std::iter::repeat_n(RowNeed::Full, s.prompt_rows())
                    .chain(std::iter::repeat_n(need, s.num_logits() - s.prompt_rows()))
            })
            .collect();
        let t_forward = Instant::now();
        let step = match self.backend.forward(&batch, &needs) {
            Ok(l) => l,
            Err(e) => return self.forward_failed(&out, &needs, &e.to_string()),
        };
        pool_states(&mut self.live, &out, step.hidden, self.lm.model.cfg.hidden);
        let (sampled, failed) = sample_rows(
            &mut self.live,
            &self.sched,
            &out,
            &needs,
            &step,
            self.lm.model.cfg.vocab,
            &mut spec,
        );
        self.spec
            .gate
            .record(spec.draft_tokens, spec.accepted_tokens);
        (self.spec.overall).count(spec.accepted_tokens as usize, spec.rejections as usize);
        if spec.drafts > 0 {
            spec.verify_ms = t_forward.elapsed().as_secs_f64() * 1e3;
            let (propose, verify) = (micros(spec.propose_ms), micros(spec.verify_ms));
            for s in out.scheduled.iter().filter(|s| !s.draft.is_empty()) {
                if let Some(l) = self.live.get_mut(&s.id) {
                    l.spec.propose_us += propose;
                    l.spec.verify_us += verify;
                }
            }
        }
        for (id, error) in failed {
            self.fail(id, Refusal::Grammar(error));
        }
        let now = self.now();
        let (live, metrics, tokenizer) = (&mut self.live, &mut self.metrics, &self.lm.tokenizer);
        let overall = &mut self.spec.overall;
        // The scheduler appends each token and asks the request's stop checker whether it ends
        // there: one decision per token, made in one place.
        let ended = self.sched.update_tokens(&out, &sampled, |a| {
            let Some(l) = live.get_mut(&a.id) else {
                return Some(FinishReason::Abort);
            };
            if l.pooled.is_some() {
                // An embedding ends with its prompt; the token sampled after it is dropped.
                return Some(FinishReason::Stop);
            }
            let piece = l.detok.push(tokenizer, a.token).unwrap_or_default();
            let st = l.stop.push(a.token, &piece);
            // A grammar that is complete ends the request too (finish reason `stop`).
            let finish = st
                .finish
                .or_else(|| l.constraint.as_mut().and_then(|c| c.advance(a.token)));
            metrics.on_token(a.id, now);
            if let Some(kept) = l.accept.emitted(a.token) {
                overall.count(usize::from(kept), usize::from(!kept));
            }
            let logprob = l.pending_logprobs.pop_front().map(Box::new);
            let _ = l.events.send(Event::Token {
                id: a.id,
                token: a.token,
                text: st.text,
                logprob,
            });
            finish
        });
        for (id, reason) in ended {
            self.end(id, reason);
        }
        self.steps += 1;
        self.record_step(t0, now, &out, batch.len(), spec);
        // Percentiles and /proc reads cost ~0.1-1 ms: publish at most every PUBLISH_EVERY, and
        // always when the engine goes idle so the last state is never stale.
        if self.live.is_empty() || self.last_publish.elapsed() >= PUBLISH_EVERY {
            self.publish();
        }
        if let Some(n) = &self.notify {
            n();
        }
    }

    /// The step's figures into the live metrics.
    fn record_step(
        &mut self,
        t0: Instant,
        now: f64,
        out: &SchedulerOutput,
        batch_len: usize,
        spec: SpecStep,
    ) {
        let step_ms = t0.elapsed().as_secs_f64() * 1e3;
        // The adaptive token budget's step-time model learns from every step.
        self.sched.record_step_time(out.num_batched_tokens, step_ms);
        let st = self.sched.stats();
        let experts = self.backend.expert_load();
        let prefill: usize = out
            .scheduled
            .iter()
            .filter(|s| !s.sample || s.real_tokens().len() > 1)
            .map(|s| s.real_tokens().len())
            .sum();
        if prefill == 0 {
            // The pay-off policy's step times: decode steps only, proposing left out.
            self.spec.cost.observe(batch_len, step_ms - spec.propose_ms);
        }
        self.metrics.on_step(StepStats {
            t: now,
            batch_size: out.scheduled.len(),
            scheduled_tokens: batch_len,
            prefill_tokens: prefill,
            decode_tokens: batch_len - prefill,
            kv_used_blocks: st.kv_used_blocks,
            kv_total_blocks: st.kv_total_blocks,
            running: st.running,
            waiting: st.waiting,
            preemptions_total: st.preemptions_total,
            prefix_cache_queries: st.prefix_cache_queries
                - self.cache_seen.0.min(st.prefix_cache_queries),
            prefix_cache_hits: st.prefix_cache_hits - self.cache_seen.1.min(st.prefix_cache_hits),
            rss_bytes: self.rss,
            step_ms,
            spec,
            expert_share: experts.and_then(ExpertLoad::share),
        });
        if let Some(load) = experts {
            self.metrics.on_experts(load);
        }
        self.cache_seen = (st.prefix_cache_queries, st.prefix_cache_hits);
    }
}

/// Requests whose grammar failed this step, with why.
type Failed = Vec<(RequestId, String)>;

/// The tokens of each sampling entry of the step, in order, each row read as its sampler asked
/// the backend for it (see `StepOutput`): a greedy token, top-k candidates, or a whole logits
/// row (masked first by the request's grammar, if any). An entry with proposals has one row
/// per proposal plus one; they are verified in [`verify_seq`], and what was proposed and
/// accepted is added to `spec`. Second: the requests whose grammar failed.
fn sample_rows(
    live: &mut HashMap<RequestId, Live>,
    sched: &Scheduler,
    out: &SchedulerOutput,
    needs: &[RowNeed],
    step: &StepOutput<'_>,
    vocab: usize,
    spec: &mut SpecStep,
) -> (Vec<(RequestId, Vec<u32>)>, Failed) {
    let mut sampled = Vec::new();
    let mut failed = Vec::new();
    let mut scratch = Vec::with_capacity(vocab);
    let mut full = step.logits.chunks_exact(vocab);
    let kk = step.topk_k.max(1);
    let mut cands = step
        .topk_ids
        .chunks_exact(kk)
        .zip(step.topk_vals.chunks_exact(kk));
    let on_host = step.argmax.is_empty();
    let mut j = 0; // the step's logits row
    for s in out.scheduled.iter().filter(|s| s.num_logits() > 0) {
        let prompt_rows = s.prompt_rows();
        if prompt_rows > 0 {
            // The prompt rows lead the sequence's rows; taken whether or not it is still live.
            let scored: Vec<Option<&[f32]>> = (0..prompt_rows).map(|_| full.next()).collect();
            j += prompt_rows;
            if let Some(l) = live.get_mut(&s.id) {
                let history = sched.tokens(s.id).unwrap_or_default();
                score_prompt(s.id, l, history, s.start_pos, &scored);
            }
        }
        if !s.sample {
            continue;
        }
        let rows: Vec<Row<'_>> = (j..j + s.num_logits() - prompt_rows)
            .map(|r| match if on_host { RowNeed::Full } else { needs[r] } {
                RowNeed::Argmax => Row::Argmax(step.argmax.get(r).copied()),
                RowNeed::TopK(_) => Row::TopK(cands.next()),
                RowNeed::Full => Row::Full(full.next()),
            })
            .collect();
        j += s.num_logits() - prompt_rows;
        let Some(l) = live.get_mut(&s.id) else {
            continue;
        };
        let history = sched.tokens(s.id).unwrap_or_default();
        let toks = match verify_seq(l, history, &s.draft, rows, &mut scratch) {
            Ok(t) => t,
            Err(e) => {
                failed.push((s.id, e.to_string()));
                continue;
            }
        };
        if !s.draft.is_empty() && !toks.is_empty() {
            let kept = toks.len() - 1;
            spec.drafts += 1;
            spec.draft_tokens += s.draft.len() as u64;
            spec.accepted_tokens += kept as u64;
            if spec.accepted_per_pos.len() < s.draft.len() {
                spec.accepted_per_pos.resize(s.draft.len(), 0);
            }
            for p in &mut spec.accepted_per_pos[..kept] {
                *p += 1;
            }
            l.spec.drafts += 1;
            l.spec.draft_tokens += s.draft.len();
            l.spec.accepted_tokens += kept;
            spec.rejections += l.accept.verified(s.draft.len(), kept) as u64;
        }
        if !toks.is_empty() {
            sampled.push((s.id, toks));
        }
    }
    (sampled, failed)
}

/// Scores prompt tokens from the rows of positions `start..` (row `i` gives the token at
/// `start + i + 1`); positions scored before (a preempted prompt computed again) are skipped.
/// Once the whole prompt is scored, its log-probabilities go out in one event.
fn score_prompt(
    id: RequestId,
    l: &mut Live,
    history: &[u32],
    start: usize,
    rows: &[Option<&[f32]>],
) {
    let Some(top) = l.prompt_logprobs else {
        return;
    };
    for (pos, row) in (start..).zip(rows) {
        if pos != l.prompt_lp.len() {
            continue;
        }
        let (Some(row), Some(&next)) = (row, history.get(pos + 1)) else {
            return;
        };
        l.prompt_lp.push(token_logprob(row, next, top));
    }
    if l.prompt_lp.len() + 1 == l.prompt_len {
        let _ = l.events.send(Event::PromptLogprobs {
            id,
            prompt: history[..l.prompt_len].to_vec(),
            logprobs: std::mem::take(&mut l.prompt_lp),
        });
        l.prompt_logprobs = None;
    }
}

/// The batch rows whose states embedding requests pool (`Batch::hidden_rows`): per scheduled
/// entry, in order, the positions its rule takes among those it computes this step.
fn hidden_rows(live: &HashMap<RequestId, Live>, out: &SchedulerOutput) -> Vec<usize> {
    let mut rows = Vec::new();
    let mut base = 0;
    for s in &out.scheduled {
        if let Some(p) = live.get(&s.id).and_then(|l| l.pooled.as_ref()) {
            rows.extend(
                p.wanted(s.start_pos, s.tokens.len())
                    .map(|pos| base + pos - s.start_pos),
            );
        }
        base += s.tokens.len();
    }
    rows
}

/// The states of [`hidden_rows`] into each embedding request's vector, in the same order.
/// `width` floats a state.
fn pool_states(
    live: &mut HashMap<RequestId, Live>,
    out: &SchedulerOutput,
    hidden: &[f32],
    width: usize,
) {
    if hidden.is_empty() {
        return;
    }
    let mut states = hidden.chunks_exact(width);
    for s in &out.scheduled {
        let Some(p) = live.get_mut(&s.id).and_then(|l| l.pooled.as_mut()) else {
            continue;
        };
        let wanted: Vec<usize> = p.wanted(s.start_pos, s.tokens.len()).collect();
        for pos in wanted {
            if let Some(state) = states.next() {
                p.push(pos, state);
            }
        }
    }
}

/// The forward pass's input for one scheduler step.
pub fn batch_from(out: &SchedulerOutput) -> Batch {
    let mut b = Batch::default();
    for s in &out.scheduled {
        b.push_seq_rows(
            s.block_table.clone(),
            s.start_pos,
            &s.tokens,
            s.num_logits(),
        );
    }
    b
}

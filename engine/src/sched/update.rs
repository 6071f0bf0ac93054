//! Applying a step's results to the scheduler (appending sampled and accepted tokens, prefix
//! caching, freeing what a sliding window left behind, rolling back rejected proposals), and
//! taking a proposer's tokens for the next step.

use std::collections::HashMap;

use super::{Appended, RequestId, RequestStatus, Scheduler, SchedulerOutput};
use crate::sched::stop::FinishReason;

impl Scheduler {
    /// Applies a step's results: advances each scheduled request by what it computed,
    /// registers its newly full blocks in the prefix cache and appends its sampled token.
    /// Returns the requests that reached `max_tokens`, already finished with `Length`.
    ///
    /// Entries of requests finished (or preempted by `rebuild_pool`) since `schedule` are
    /// ignored, as are sampled tokens for requests that did not ask for one. A request that
    /// asked for a token but got none recomputes its last position next step.
    pub fn update(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(RequestId, u32)],
    ) -> Vec<(RequestId, FinishReason)> {
        self.update_with(out, sampled, |a| {
            (a.generated >= a.max_tokens).then_some(FinishReason::Length)
        })
    }

    /// As [`Self::update`], but whether a request ends with the token just appended, and why,
    /// is `ends`'s to say (the engine's stop checker: stop tokens, stop strings and
    /// `max_tokens` in one place); it is asked once per appended token, in step order. The
    /// requests it ends are finished here and returned with its reason. It must end each one by
    /// its `max_tokens`, the most the request was admitted to the pool for.
    pub fn update_with(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(RequestId, u32)],
        ends: impl FnMut(Appended) -> Option<FinishReason>,
    ) -> Vec<(RequestId, FinishReason)> {
        let tokens: Vec<(RequestId, Vec<u32>)> =
            sampled.iter().map(|&(id, t)| (id, vec![t])).collect();
        self.update_tokens(out, &tokens, ends)
    }

    /// As [`Self::update_with`] for a step that verified proposals: each request's tokens are
    /// its accepted proposals (a prefix of its `draft`) followed by one more token, the model's
    /// own where it rejected one or past the last. They are appended in order, each asked of
    /// `ends`; the rest are dropped once it ends the request. The KV of the accepted proposals
    /// is kept (computed in this step at their positions), the slots of the rejected ones are
    /// released. A token list that leaves the draft early ends there (its differing token is
    /// the correction).
    pub fn update_tokens(
        &mut self,
        out: &SchedulerOutput,
        sampled: &[(RequestId, Vec<u32>)],
        mut ends: impl FnMut(Appended) -> Option<FinishReason>,
    ) -> Vec<(RequestId, FinishReason)> {
        let sampled: HashMap<RequestId, &[u32]> =
            sampled.iter().map(|(id, t)| (*id, &t[..])).collect();
        let mut done = Vec::new();
        for s in &out.scheduled {
            let Some(r) = self.reqs.get_mut(&s.id) else {
                continue;
            };
            if r.status != RequestStatus::Running || r.num_computed_tokens != s.start_pos {
                continue;
            }
            r.num_computed_tokens = (s.start_pos + s.real_tokens().len()).min(r.all_tokens.len());
            let mut ended = None;
            if s.sample {
                match sampled.get(&s.id) {
                    Some(toks)
                        if r.num_computed_tokens == r.all_tokens.len() && !toks.is_empty() =>
                    {
                        for (j, &token) in toks.iter().enumerate().take(s.draft.len() + 1) {
                            if j > 0 {
                                // The previous token was the proposal computed at its
                                // position in this step: its KV stands.
                                r.num_computed_tokens += 1;
                            }
                            r.all_tokens.push(token);
                            let a = Appended {
                                id: s.id,
                                token,
                                generated: r.num_generated(),
                                max_tokens: r.max_tokens,
                            };
                            debug_assert!(
                                a.generated <= a.max_tokens,
                                "{a:?} runs past max_tokens"
                            );
                            if let Some(reason) = ends(a) {
                                ended = Some(reason);
                                break;
                            }
                            if s.draft.get(j) != Some(&token) {
                                break; // a correction: the proposals after it are void
                            }
                        }
                    }
                    // Without a token there are no logits for the next step to extend from.
                    _ => r.num_computed_tokens = r.num_computed_tokens.saturating_sub(1),
                }
            }
            let (computed, known) = (r.num_computed_tokens, r.all_tokens.len());
            self.kv.cache_blocks(s.id, &r.all_tokens, computed);
            if !s.draft.is_empty() {
                self.kv.truncate(s.id, known);
            }
            if let Some(w) = self.window {
                // The next position is at least `num_computed - 1` (one is recomputed when no
                // token comes back), its window starts `w - 1` before it, and attention reads
                // whole softmax blocks from there.
                let block = tpslab_kernels::attn::BLOCK;
                let first = computed.saturating_sub(w) / block * block;
                self.kv.drop_before(s.id, first);
            }
            if let Some(reason) = ended {
                done.push((s.id, reason));
            }
        }
        for &(id, reason) in &done {
            self.finish(&[id], reason);
        }
        done
    }

    /// Running requests whose next step computes only their newest token (they are decoding,
    /// not prefilling), each with how many proposed tokens it may take: one fewer than the
    /// tokens it has left to its `max_tokens`. What a proposer is asked for.
    pub fn decode_ready(&self) -> Vec<(RequestId, usize)> {
        self.running
            .iter()
            .filter_map(|&id| {
                let r = self.reqs.get(&id)?;
                let room = r.max_tokens.saturating_sub(r.num_generated() + 1);
                (r.num_computed_tokens + 1 == r.all_tokens.len() && room > 0).then_some((id, room))
            })
            .collect()
    }

    /// Proposed tokens for `id`'s next step, to be verified in it (replacing any earlier
    /// proposal). Ignored unless the request is running; trimmed at scheduling to the step's
    /// token budget and the request's `max_tokens`.
    pub fn set_draft(&mut self, id: RequestId, draft: Vec<u32>) {
        if let Some(r) = self.reqs.get_mut(&id)
            && r.status == RequestStatus::Running
        {
            r.draft = draft;
        }
    }

    /// Takes `id`'s proposal for a step whose real tokens end at `real_end`, trimmed to `budget`
    /// tokens and to the request's `max_tokens`; empty unless that step ends at the request's
    /// newest token (a proposal extends what is known, never a prompt chunk).
    pub(super) fn draft_for(&mut self, id: RequestId, real_end: usize, budget: usize) -> Vec<u32> {
        let Some(r) = self.reqs.get_mut(&id) else {
            return Vec::new();
        };
        let mut draft = std::mem::take(&mut r.draft);
        if real_end != r.all_tokens.len() {
            return Vec::new();
        }
        let room = r.max_tokens.saturating_sub(r.num_generated() + 1);
        draft.truncate(budget.min(room));
        draft
    }
}

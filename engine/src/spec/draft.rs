//! Proposals from a model forward: a small draft model that shares the target's tokenizer, or
//! the target's own first layers with its output head (self-speculative early exit, as
//! LayerSkip drafts). Either way the drafter is a [`Backend`] with its own KV pool, batched over
//! every request it proposes for, and greedy: each proposal is the drafter's argmax, so the
//! verifier treats it as a point mass.
//!
//! The drafter keeps, per request, the tokens whose K/V it holds. Before each proposal it
//! compares them with the request's tokens now: the common prefix stands (accepted proposals
//! were computed at the right positions), the rest is recomputed. This covers rejections,
//! preemption and a precision change alike, with nothing to roll back by hand.

use std::collections::HashMap;

use crate::device::{Backend, BackendError, RowNeed, argmax};
use crate::kv::Batch;
use crate::kv::block_pool::{KvManager, RequestId};

/// Most tokens one drafter forward takes (a long prompt is caught up in chunks of this).
pub const MAX_BATCH_TOKENS: usize = 2048;

/// A drafter: its backend, the bookkeeping of its KV pool, and what each request has fed it.
pub struct Drafter {
    backend: Box<dyn Backend>,
    kv: KvManager,
    fed: HashMap<RequestId, Vec<u32>>,
    vocab: usize,
    context_len: usize,
}

/// One request's ask: its tokens now, and at most how many to propose.
pub struct Ask<'a> {
    pub id: RequestId,
    pub tokens: &'a [u32],
    pub k: usize,
}

impl Drafter {
    /// A drafter over `backend` (whose KV pool it manages from now on); `vocab` and
    /// `context_len` are the drafter model's.
    pub fn new(backend: Box<dyn Backend>, vocab: usize, context_len: usize) -> Self {
        let kv = KvManager::new(backend.num_blocks(), backend.block_size(), false);
        Self {
            backend,
            kv,
            fed: HashMap::new(),
            vocab,
            context_len,
        }
    }

    /// The drafter's own memory (its KV pool; weights it shares with the target are not
    /// counted twice by the caller).
    pub fn memory(&self) -> crate::device::MemoryUse {
        self.backend.memory()
    }

    /// Forgets a request (finished or cancelled): its blocks go back to the pool.
    pub fn forget(&mut self, id: RequestId) {
        self.fed.remove(&id);
        self.kv.free(id);
    }

    /// Proposes up to `ask.k` tokens for each request, batched: one forward catches every
    /// request up to its tokens now and drafts its first token, then one forward per further
    /// token. A request the drafter cannot hold (pool full, past its context, a token outside
    /// its vocabulary) gets no proposal; it decodes as without speculation.
    pub fn propose(
        &mut self,
        asks: &[Ask<'_>],
    ) -> Result<Vec<(RequestId, Vec<u32>)>, BackendError> {
        let mut live: Vec<(usize, usize)> = Vec::new(); // (index in asks, start of catch-up)
        for (i, a) in asks.iter().enumerate() {
            if a.k == 0
                || a.tokens.is_empty()
                || a.tokens.len() + a.k > self.context_len
                || a.tokens.iter().any(|&t| t as usize >= self.vocab)
            {
                continue;
            }
            let fed = self.fed.entry(a.id).or_default();
            let common = fed
                .iter()
                .zip(a.tokens)
                .take_while(|(x, y)| x == y)
                .count()
                // The newest token is always fed: its logits draft the first proposal.
                .min(a.tokens.len() - 1);
            fed.truncate(common);
            self.kv.truncate(a.id, common);
            if self
                .kv
                .allocate_slots(a.id, a.tokens.len() + a.k - 1, &[])
                .is_none()
            {
                continue;
            }
            live.push((i, common));
        }
        let mut drafts: Vec<Vec<u32>> = vec![Vec::new(); asks.len()];
        // Catch-up: every request's unfed tokens, in chunks; the last chunk of each drafts.
        let mut batch = Batch::default();
        let mut owners: Vec<usize> = Vec::new();
        for &(i, start) in &live {
            let a = &asks[i];
            let table = self.kv.block_table(a.id).to_vec();
            let mut pos = start;
            while pos < a.tokens.len() {
                let room = MAX_BATCH_TOKENS - batch.len();
                let end = (pos + room).min(a.tokens.len());
                let last = end == a.tokens.len();
                batch.push_seq(table.clone(), pos, &a.tokens[pos..end], last);
                if last {
                    owners.push(i);
                }
                pos = end;
                if batch.len() == MAX_BATCH_TOKENS {
                    self.run(&batch, &owners, &mut drafts)?;
                    batch = Batch::default();
                    owners.clear();
                }
            }
        }
        if !batch.is_empty() {
            self.run(&batch, &owners, &mut drafts)?;
        }
        for &(i, common) in &live {
            if let Some(f) = self.fed.get_mut(&asks[i].id) {
                f.extend_from_slice(&asks[i].tokens[common..]);
            }
        }
        // One token per further forward, for every request that wants more.
        for step in 1.. {
            let mut batch = Batch::default();
            let mut owners = Vec::new();
            for &(i, _) in &live {
                let a = &asks[i];
                if drafts[i].len() != step || step >= a.k {
                    continue;
                }
                let tok = drafts[i][step - 1];
                let pos = a.tokens.len() + step - 1;
                batch.push_seq(self.kv.block_table(a.id).to_vec(), pos, &[tok], true);
                owners.push(i);
            }
            if batch.is_empty() {
                break;
            }
            self.run(&batch, &owners, &mut drafts)?;
            for &i in &owners {
                let d = &drafts[i];
                if let Some(f) = self.fed.get_mut(&asks[i].id) {
                    f.push(d[step - 1]);
                }
            }
        }
        Ok(live
            .iter()
            .map(|&(i, _)| (asks[i].id, std::mem::take(&mut drafts[i])))
            .filter(|(_, d)| !d.is_empty())
            .collect())
    }

    /// One forward; each logits row's argmax is appended to its owner's draft.
    fn run(
        &mut self,
        batch: &Batch,
        owners: &[usize],
        drafts: &mut [Vec<u32>],
    ) -> Result<(), BackendError> {
        let needs = vec![RowNeed::Argmax; batch.logit_rows.len()];
        let out = self.backend.forward(batch, &needs)?;
        let vocab = self.vocab;
        for (j, &i) in owners.iter().enumerate() {
            let tok = match out.argmax.get(j) {
                Some(&t) if !out.argmax.is_empty() => t,
                _ => out.logits.get(j * vocab..(j + 1) * vocab).map_or(0, argmax),
            };
            drafts[i].push(tok);
        }
        Ok(())
    }
}

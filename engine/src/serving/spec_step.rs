//! Speculative decoding in the engine thread: the proposer built from the knobs, proposals made
//! before a step (when the policy lets them run), and the verification of a sequence's proposals
//! against its logits rows with the request's own sampler.

use std::sync::Arc;
use std::time::Instant;

use super::{EngineThread, Live};
use crate::device::{BackendError, CpuBackend};
use crate::kv::KvTypes;
use crate::model::LoadedModel;
use crate::sched::RequestId;
use crate::serving::logprobs::token_logprob;
use crate::serving::spec_metrics::SpecStep;
use crate::spec::draft::{Ask, Drafter};
use crate::spec::payoff::{Acceptance, DecodeCost, PROBE_STEPS};
use crate::spec::{Gate, Proposer, SpecConfig, SpecMethod};

/// What the engine keeps for speculation.
#[derive(Default)]
pub(super) struct SpecState {
    pub proposer: Option<Proposer>,
    pub gate: Gate,
    /// Decode steps' times by their rows, for the pay-off policy.
    pub cost: DecodeCost,
    /// Every request's recent acceptance, a new request's starting point.
    pub overall: Acceptance,
    /// The draft model given at start (`--spec draft:MODEL`) or set since, if any.
    pub draft_lm: Option<Arc<LoadedModel>>,
}

/// Why a proposer could not be built.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("speculation: {0}")]
    Config(#[from] crate::spec::SpecConfigError),
    #[error(
        "speculation: no draft model is set (choose one in the dashboard, or start with --spec draft:MODEL)"
    )]
    NoDraftModel,
    #[error(
        "speculation: the draft model's vocabulary differs from the model's ({0}); a draft model must share the tokenizer"
    )]
    Vocabulary(String),
    #[error("speculation: the drafter could not be opened: {0}")]
    Backend(#[from] BackendError),
}

/// Refuses a draft model `d` whose vocabulary is not `lm`'s.
pub(super) fn vocab_check(lm: &LoadedModel, d: &LoadedModel) -> Result<(), SpecError> {
    vocab_difference(lm, d).map_or(Ok(()), |why| Err(SpecError::Vocabulary(why)))
}

/// Where two tokenizers first differ, if they do (sizes, then each token's bytes).
fn vocab_difference(a: &LoadedModel, b: &LoadedModel) -> Option<String> {
    let (ta, tb) = (&a.tokenizer, &b.tokenizer);
    if ta.vocab_size() != tb.vocab_size() || a.model.cfg.vocab != b.model.cfg.vocab {
        return Some(format!(
            "{} tokens against {}",
            tb.vocab_size(),
            ta.vocab_size()
        ));
    }
    (0..ta.vocab_size() as u32)
        .find(|&id| ta.token_bytes(id) != tb.token_bytes(id))
        .map(|id| format!("token {id} differs"))
}

/// The proposer `cfg` asks for over `lm` (and `draft` for [`SpecMethod::Draft`]), a drafter's
/// KV pool as large in blocks as the target's and of its element types.
pub(super) fn build(
    cfg: &SpecConfig,
    lm: &Arc<LoadedModel>,
    draft: Option<&Arc<LoadedModel>>,
    threads: usize,
    block_size: usize,
    num_blocks: usize,
    types: KvTypes,
) -> Result<Option<Proposer>, SpecError> {
    cfg.validate()?;
    let drafter = |backend: CpuBackend, m: &LoadedModel| {
        Proposer::Model(Box::new(Drafter::new(
            Box::new(backend),
            m.model.cfg.vocab,
            m.model.cfg.context_len,
        )))
    };
    Ok(match cfg.method {
        SpecMethod::Off => None,
        SpecMethod::Ngram => Some(Proposer::Ngram {
            min_n: cfg.ngram_min,
            max_n: cfg.ngram_max,
        }),
        SpecMethod::SelfDraft => {
            let layers = cfg.exit_layer(lm.model.cfg.n_layers);
            let b = CpuBackend::early_exit(
                Arc::clone(lm),
                layers,
                threads,
                block_size,
                num_blocks,
                types,
            )?;
            Some(drafter(b, lm))
        }
        SpecMethod::Draft => {
            let d = draft.ok_or(SpecError::NoDraftModel)?;
            vocab_check(lm, d)?;
            let b =
                CpuBackend::with_kv_types(Arc::clone(d), threads, block_size, num_blocks, types)?;
            Some(drafter(b, d))
        }
    })
}

impl EngineThread {
    /// Builds the proposer of the current knobs (after a knob change or a new KV pool). On an
    /// error speculation is off and the error is returned for the snapshot.
    pub(super) fn rebuild_proposer(&mut self) -> Result<(), SpecError> {
        self.spec.proposer = None;
        self.spec.proposer = build(
            &self.knobs.spec,
            &self.lm,
            self.spec.draft_lm.as_ref(),
            self.threads,
            self.backend.block_size(),
            self.backend.num_blocks(),
            self.backend.kv_types(),
        )?;
        Ok(())
    }

    /// Proposals for the running requests that are decoding, set on the scheduler for the next
    /// step, unless the policy holds them back: the knobs' gate for every request, and the
    /// pay-off policy for each ([`crate::spec::payoff`]): a proposal that would not pay is
    /// held back and checked against what the request emits (a lookup's), or not made (a
    /// drafter's, probed every [`PROBE_STEPS`] steps). Returns what the step records of it.
    pub(super) fn propose(&mut self) -> SpecStep {
        let mut st = SpecStep::default();
        let running = self.sched.num_running();
        let pause = self.spec.gate.check(&self.knobs.spec, running);
        let Some(proposer) = self.spec.proposer.as_mut() else {
            return st;
        };
        if pause.is_some() {
            return st;
        }
        let t = Instant::now();
        let k = self.knobs.spec.num_tokens;
        let payoff = self.knobs.spec.payoff;
        let (live, sched) = (&mut self.live, &self.sched);
        // The step's expected times, looked up once for every request.
        let times = self.spec.cost.for_step(running, k);
        let model = proposer.is_model();
        let ready = sched.decode_ready();
        // Per request: how many tokens to verify (None: hold back), and how many to ask for.
        let mut verify: Vec<(RequestId, Option<usize>)> = Vec::new();
        let mut asks: Vec<Ask<'_>> = Vec::new();
        for &(id, room) in &ready {
            let Some(l) = live.get_mut(&id).filter(|l| l.speculate) else {
                continue;
            };
            let most = room.min(k);
            let len = if payoff {
                Some(times.best_len(&l.accept, most).0).filter(|&d| d > 0)
            } else {
                Some(most)
            };
            let ask = match (len, model) {
                (Some(d), _) => d,
                // A lookup costs nothing: made to be checked against what comes.
                (None, false) if !l.accept.checking() => most,
                (None, false) => 0,
                (None, true) => {
                    l.accept.idle_steps = l.accept.idle_steps.saturating_add(1);
                    if l.accept.idle_steps < PROBE_STEPS {
                        0
                    } else {
                        l.accept.idle_steps = 0;
                        verify.push((id, Some(most)));
                        most
                    }
                }
            };
            if ask == 0 {
                continue;
            }
            if len.is_some() {
                verify.push((id, len));
            } else if !model {
                verify.push((id, None));
            }
            let Some(tokens) = sched.tokens(id) else {
                continue;
            };
            asks.push(Ask { id, tokens, k: ask });
        }
        let asked = !asks.is_empty();
        let drafts = proposer.propose(&asks);
        drop(asks);
        match drafts {
            Ok(drafts) => {
                for (id, d) in drafts {
                    match verify.iter().find(|(v, _)| *v == id).and_then(|(_, n)| *n) {
                        Some(n) => self.sched.set_draft(id, d.into_iter().take(n).collect()),
                        None => {
                            if let Some(l) = self.live.get_mut(&id) {
                                l.accept.hold(d);
                            }
                        }
                    }
                }
            }
            Err(e) => {
                // A drafter that fails stops proposing; requests decode on without it.
                self.last_error = Some(format!("speculation off: the drafter failed: {e}"));
                self.spec.proposer = None;
            }
        }
        st.active = true;
        st.propose_ms = t.elapsed().as_secs_f64() * 1e3;
        if asked {
            self.spec.cost.observe_propose(st.propose_ms);
        }
        st
    }

    /// A request left: the proposer releases what it holds for it.
    pub(super) fn spec_forget(&mut self, id: RequestId) {
        if let Some(p) = self.spec.proposer.as_mut() {
            p.forget(id);
        }
    }
}

/// One logits row of a sequence, as the backend returned it for the row's need.
pub(super) enum Row<'a> {
    Argmax(Option<u32>),
    TopK(Option<(&'a [u32], &'a [f32])>),
    Full(Option<&'a [f32]>),
}

/// The tokens a sequence emits from its rows: each proposal verified in turn by the request's
/// sampler (rejection sampling; greedy: kept iff it is the argmax), up to the first one
/// rejected, whose replacement ends the list; when all are kept, the last row's own token
/// follows them. Without proposals, one sampled token. Empty when a row is missing. A request
/// with a grammar (never given proposals) has its row masked first; the grammar's error is
/// returned.
pub(super) fn verify_seq(
    l: &mut Live,
    history: &[u32],
    draft: &[u32],
    rows: Vec<Row<'_>>,
    scratch: &mut Vec<f32>,
) -> Result<Vec<u32>, String> {
    let mut out = Vec::with_capacity(draft.len() + 1);
    // Left over from a step whose tokens were dropped (a stop inside the accepted proposals).
    l.pending_logprobs.clear();
    // The history each row's penalties see: the request's tokens plus what was kept before it,
    // copied only for a sampler with penalties (the others never read it).
    let extend = !draft.is_empty() && l.sampler.reads_history();
    let mut ext: Vec<u32> = if extend { history.to_vec() } else { Vec::new() };
    for (i, row) in rows.into_iter().enumerate() {
        let proposed = draft.get(i).copied();
        let h: &[u32] = if extend { &ext } else { history };
        let tok = match row {
            Row::Argmax(Some(t)) => t,
            Row::TopK(Some((ids, vals))) => l.sampler.sample_candidates(ids, vals),
            Row::Full(Some(r)) => {
                scratch.clear();
                scratch.extend_from_slice(r);
                if let Some(c) = l.constraint.as_mut() {
                    c.apply(scratch).map_err(|e| e.to_string())?;
                }
                let tok = match proposed {
                    Some(p) => l.sampler.verify(scratch, h, l.prompt_len, p),
                    None => l.sampler.sample_with_prompt(scratch, h, l.prompt_len),
                };
                if let Some(n) = l.logprobs {
                    // The raw row, before the mask, the bias and the penalties.
                    l.pending_logprobs.push_back(token_logprob(r, tok, n));
                }
                tok
            }
            _ => break,
        };
        out.push(tok);
        if proposed != Some(tok) {
            break;
        }
        if extend {
            ext.push(tok);
        }
    }
    Ok(out)
}

//! What goes into the engine and what comes back: a [`Request`], and the [`Event`]s on its own
//! channel (with [`Usage`] at the end, or a [`Refusal`]). Re-exported by [`crate::serving::engine`],
//! where they are used.

use crate::serving::spec_metrics::SpecUsage;
use std::time::Duration;

use serde::Serialize;

use crate::model::pooling::Pooling;
use crate::sched::stop::{FinishReason, StopCriteria};
use crate::sched::{ClientId, RequestId};
use crate::serving::constraint::Constraint;
use crate::serving::logprobs::TokenLogprob;
pub use crate::serving::refusal::{Refusal, RefusalKind};
use crate::serving::sampler::SamplingParams;

/// What a request needs besides its prompt.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopCriteria,
    pub priority: i32,
    /// Whose request it is: the batch is shared fairly between clients
    /// ([`ClientId::LOCAL`] for the machine's own user).
    pub client: ClientId,
    /// Structured output: the grammar every generated token must keep to (compiled by the
    /// front end with the model's [`crate::serving::constraint::compiler_for`]).
    pub constraint: Option<Constraint>,
    /// OpenAI's `logprobs`: `Some(n)` sends each generated token's log-probability with the `n`
    /// most likely alternatives (at most [`crate::serving::logprobs::MAX_TOP_LOGPROBS`]) in its [`Event::Token`].
    pub logprobs: Option<usize>,
    /// Prompt log-probabilities (completions' `echo` with `logprobs`, vLLM's
    /// `prompt_logprobs`): `Some(n)` sends, before the first token, an
    /// [`Event::PromptLogprobs`] scoring every prompt token after the first with `n`
    /// alternatives. Its prompt is then computed whole, not taken from the prefix cache.
    pub prompt_logprobs: Option<usize>,
    /// An embedding instead of an answer: the prompt's output-normed states pooled by this
    /// rule into one unit-length vector, sent as [`Event::Embedding`] before `Finished`; no
    /// token is generated (`stop.max_tokens` is taken as 1, the slot the prompt's last step
    /// needs).
    pub embed: Option<Pooling>,
}

/// Token counts of a finished request (OpenAI's `usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
    /// Speculative decoding's proposals for the request (zeros without speculation).
    pub spec: SpecUsage,
    /// The batches its tokens were sampled in.
    pub batch: DecodeBatch,
}

/// The batches a request's tokens were sampled in: how many sequences shared each forward pass
/// that sampled one of its tokens (the prompt's chunks before its end are left out).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DecodeBatch {
    /// Forward passes that sampled a token of the request.
    pub steps: usize,
    /// The sequences in those passes, summed.
    pub seqs: usize,
    /// The most sequences in one of them.
    pub max: usize,
}

impl DecodeBatch {
    /// One forward pass of `seqs` sequences sampled a token of the request.
    pub fn record(&mut self, seqs: usize) {
        self.steps += 1;
        self.seqs += seqs;
        self.max = self.max.max(seqs);
    }

    /// The mean number of sequences per pass; `None` before the first.
    pub fn mean(&self) -> Option<f64> {
        (self.steps > 0).then(|| self.seqs as f64 / self.steps as f64)
    }
}

/// What a request's channel receives, in this order: `Started`, any number of `Token`s (or,
/// for an embedding, one `Embedding`), then exactly one of `Finished` or `Refused`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The engine accepted the request.
    Started { id: RequestId },
    /// The prompt's log-probabilities, when asked for: `logprobs[i]` scores `prompt[i + 1]`
    /// given the tokens before it (the first token has none). Sent once, before the first
    /// `Token`.
    PromptLogprobs {
        id: RequestId,
        prompt: Vec<u32>,
        logprobs: Vec<TokenLogprob>,
    },
    /// One generated token and the text that became final with it (may be empty).
    Token {
        id: RequestId,
        token: u32,
        text: String,
        /// Its log-probability, when the request asked for them.
        logprob: Option<Box<TokenLogprob>>,
    },
    /// The embedding of a request that asked for one ([`Request::embed`]).
    Embedding { id: RequestId, vector: Vec<f32> },
    /// The request ended: `text` is any held-back tail.
    Finished {
        id: RequestId,
        reason: FinishReason,
        usage: Usage,
        text: String,
        /// Time from acceptance to the first step that scheduled the request (vLLM's queue
        /// time); the whole wait for a request that ended before it was ever scheduled.
        queue_time: Duration,
    },
    /// The request was not accepted (queue full, prompt too long, bad parameters), or failed:
    /// `reason.kind()` says which for callers that map it (the server: 429, 400, 503).
    Refused { id: RequestId, reason: Refusal },
}

impl Event {
    pub fn id(&self) -> RequestId {
        match self {
            Event::Started { id }
            | Event::PromptLogprobs { id, .. }
            | Event::Token { id, .. }
            | Event::Embedding { id, .. }
            | Event::Finished { id, .. }
            | Event::Refused { id, .. } => *id,
        }
    }
}

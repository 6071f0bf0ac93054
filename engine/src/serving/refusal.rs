//! Why a request is not (or no longer) run: the typed [`Refusal`] every front end shows (the
//! window, the CLI, the server's 4xx/5xx) and its [`RefusalKind`]. Admission
//! ([`crate::serving::admission`]) decides most of them; the engine the rest.

use serde::Serialize;

use crate::kv::KvNeverFits;
use crate::sched::SchedError;
use crate::serving::sampler::SamplingError;

/// Why a request was refused, for callers that map it (the server: 429, 400, 503).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum RefusalKind {
    /// The waiting queue is at its limit (load shedding): try again later.
    Busy,
    /// The prompt (plus at least one output token) cannot fit the context or the KV pool.
    TooLong,
    /// Bad parameters or an empty prompt.
    Invalid,
    /// The engine has stopped or failed on the step that carried the request.
    Unavailable,
}

/// Why a request is not (or no longer) run. Its message is what the user reads, in the window,
/// on the command line and in the server's error body alike.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum Refusal {
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// vLLM's wording, which OpenAI clients recognise.
    #[error(
        "This model's maximum context length is {context} tokens. However, you requested {} \
         tokens ({prompt} in the prompt, {max_tokens} for the completion). Please reduce the \
         length of the prompt or max_tokens.", prompt.saturating_add(*max_tokens)
    )]
    PastContext {
        prompt: usize,
        max_tokens: usize,
        context: usize,
    },
    #[error("max_tokens must be at least 1")]
    ZeroMaxTokens,
    /// A tokenizer may know more ids than the model embeds; such an id would fail the whole
    /// batch step it lands in.
    #[error("prompt token {index} has id {id}, outside the model's vocabulary of {vocab} tokens")]
    OutOfVocab { index: usize, id: u32, vocab: usize },
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    #[error(transparent)]
    KvNeverFits(#[from] KvNeverFits),
    /// The scheduler's queue state refused it (load shedding).
    #[error(transparent)]
    Scheduler(#[from] SchedError),
    #[error("the engine has stopped")]
    Stopped,
    /// An embedding asked of a device that does not return hidden states.
    #[error("embeddings are computed on the CPU; {device} does not return them yet")]
    NoEmbeddings { device: String },
    /// The forward pass carrying the request failed.
    #[error("engine error: {0}")]
    Failed(String),
    /// The request's grammar failed while decoding (a budget ran out, or it reached a state no
    /// token can leave): the request's own fault, not the engine's.
    #[error("structured output: {0}")]
    Grammar(String),
    /// Another server's refusal, as its answer said (a remote load-test target).
    #[error("{message}")]
    Remote { kind: RefusalKind, message: String },
}

impl Refusal {
    pub fn kind(&self) -> RefusalKind {
        match self {
            Self::EmptyPrompt
            | Self::ZeroMaxTokens
            | Self::OutOfVocab { .. }
            | Self::Sampling(_)
            | Self::Grammar(_)
            | Self::NoEmbeddings { .. } => RefusalKind::Invalid,
            Self::PastContext { .. } | Self::KvNeverFits(_) => RefusalKind::TooLong,
            Self::Scheduler(e) => match e {
                SchedError::QueueFull { .. } => RefusalKind::Busy,
                SchedError::TooLong { .. } => RefusalKind::TooLong,
                _ => RefusalKind::Invalid,
            },
            Self::Stopped | Self::Failed(_) => RefusalKind::Unavailable,
            Self::Remote { kind, .. } => *kind,
        }
    }
}

//! What goes into the engine and what comes back: a [`Request`], and the [`Event`]s on its own
//! channel (with [`Usage`] at the end, or a [`RefusalKind`] and reason). Re-exported by
//! [`crate::engine`], where they are used.

use std::time::Duration;

use serde::Serialize;

use crate::sampler::SamplingParams;
use crate::scheduler::{RequestId, SchedError};
use crate::stop::{FinishReason, StopCriteria};

/// What a request needs besides its prompt.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub prompt: Vec<u32>,
    pub sampling: SamplingParams,
    pub stop: StopCriteria,
    pub priority: i32,
}

/// Token counts of a finished request (OpenAI's `usage`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Usage {
    pub prompt_tokens: usize,
    pub completion_tokens: usize,
}

/// What a request's channel receives, in this order: `Started`, any number of `Token`s, then
/// exactly one of `Finished` or `Refused`.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// The engine accepted the request.
    Started { id: RequestId },
    /// One generated token and the text that became final with it (may be empty).
    Token {
        id: RequestId,
        token: u32,
        text: String,
    },
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
    /// The request was not accepted (queue full, prompt too long, bad parameters), or failed.
    Refused {
        id: RequestId,
        reason: String,
        kind: RefusalKind,
    },
}

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

impl RefusalKind {
    pub(crate) fn of(e: &SchedError) -> Self {
        match e {
            SchedError::QueueFull { .. } => Self::Busy,
            SchedError::TooLong { .. } => Self::TooLong,
            _ => Self::Invalid,
        }
    }
}

/// Why `prompt` cannot run on a model whose embedding has `vocab` rows: its first token id
/// outside them (a tokenizer may know more ids than the model embeds). `None` when all fit.
pub fn out_of_vocab(prompt: &[u32], vocab: usize) -> Option<String> {
    let (i, bad) = prompt
        .iter()
        .enumerate()
        .find(|&(_, &t)| t as usize >= vocab)?;
    Some(format!(
        "prompt token {i} has id {bad}, outside the model's vocabulary of {vocab} tokens"
    ))
}

impl Event {
    pub fn id(&self) -> RequestId {
        match self {
            Event::Started { id }
            | Event::Token { id, .. }
            | Event::Finished { id, .. }
            | Event::Refused { id, .. } => *id,
        }
    }
}

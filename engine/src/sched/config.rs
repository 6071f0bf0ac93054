//! The batching knobs ([`SchedulerConfig`], [`Policy`]) and the checks a configuration and a KV
//! pool pass before the scheduler takes them.

use serde::{Deserialize, Serialize};

use super::SchedError;

/// The order waiting requests start in, and which running request is preempted first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Policy {
    /// First come, first served; the newest arrival is preempted first.
    #[default]
    Fcfs,
    /// Lower `priority` value first, then arrival; the highest value (newest among equals) is
    /// preempted first.
    Priority,
}

/// Batching knobs; all of them may change while the engine runs ([`Scheduler::set_config`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct SchedulerConfig {
    /// Most requests running at once (the batch size).
    pub max_num_seqs: usize,
    /// Most tokens computed in one step, over all requests.
    pub max_num_batched_tokens: usize,
    /// Split long prompts across steps so decodes keep flowing beside them.
    pub chunked_prefill: bool,
    /// Reuse computed KV blocks of identical prompt prefixes.
    pub prefix_caching: bool,
    pub policy: Policy,
    /// Load shedding: refuse new requests while this many wait. `None` = unbounded.
    pub max_waiting: Option<usize>,
    /// Adaptive token budget: while requests decode, each step's budget is what the fitted
    /// step-time model says runs in `itl_target_ms` (see [`adaptive`]), at most
    /// `max_num_batched_tokens`; a long prompt then goes in smaller chunks.
    pub adaptive_budget: bool,
    /// The inter-token latency the adaptive budget keeps decodes under, in milliseconds.
    pub itl_target_ms: u32,
}

impl Default for SchedulerConfig {
    /// vLLM-like defaults sized for a desktop machine.
    fn default() -> Self {
        Self {
            max_num_seqs: 64,
            max_num_batched_tokens: 2048,
            chunked_prefill: true,
            prefix_caching: true,
            policy: Policy::Fcfs,
            max_waiting: None,
            adaptive_budget: false,
            itl_target_ms: 50,
        }
    }
}

pub(super) fn check_config(c: &SchedulerConfig) -> Result<(), SchedError> {
    if c.max_num_seqs == 0 {
        return Err(SchedError::InvalidConfig(
            "max_num_seqs must be at least 1".into(),
        ));
    }
    if c.max_num_batched_tokens == 0 {
        return Err(SchedError::InvalidConfig(
            "max_num_batched_tokens must be at least 1".into(),
        ));
    }
    if c.adaptive_budget && c.itl_target_ms == 0 {
        return Err(SchedError::InvalidConfig(
            "itl_target_ms must be at least 1 with the adaptive budget on".into(),
        ));
    }
    Ok(())
}

pub(super) fn check_pool(num_blocks: usize, block_size: usize) -> Result<(), SchedError> {
    if num_blocks == 0 || block_size == 0 {
        return Err(SchedError::InvalidConfig(format!(
            "KV pool needs at least one block of at least one token (got {num_blocks} x {block_size})"
        )));
    }
    if num_blocks >= u32::MAX as usize {
        return Err(SchedError::InvalidConfig(format!(
            "{num_blocks} KV blocks is too many"
        )));
    }
    Ok(())
}

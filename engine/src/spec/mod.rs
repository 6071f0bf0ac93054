//! Speculative decoding's proposers and the knobs that choose them. A proposer guesses a few
//! tokens per running request; the scheduler runs them as extra tokens of that request in the
//! next step (`crate::sched`), and the engine verifies them against the model's logits with
//! rejection sampling (`crate::serving::sampler::Sampler::verify`), so outputs keep the model's
//! distribution exactly (greedy: the same tokens).
//!
//! Modules:
//! - [`ngram`]: prompt-lookup proposals from the request's own tokens (no weights).
//! - [`draft`]: proposals from a model forward: a draft model sharing the tokenizer, or the
//!   target's first layers with its output head (self-speculative early exit).
//! - [`payoff`]: whether a request's proposal pays for the longer step that verifies it (the
//!   measured step times, the request's own acceptance), so speculation never costs.

pub mod draft;
pub mod ngram;
pub mod payoff;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::device::BackendError;
use crate::kv::block_pool::RequestId;
use draft::{Ask, Drafter};

/// Who proposes tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecMethod {
    /// No speculation.
    #[default]
    Off,
    /// Prompt lookup: n-grams of the request's own tokens.
    Ngram,
    /// The model's first layers and its output head (early exit).
    #[serde(rename = "self")]
    SelfDraft,
    /// A draft model from the library that shares the tokenizer (given at engine start).
    Draft,
}

impl SpecMethod {
    pub const ALL: [SpecMethod; 4] = [Self::Off, Self::Ngram, Self::SelfDraft, Self::Draft];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Ngram => "ngram",
            Self::SelfDraft => "self",
            Self::Draft => "draft",
        }
    }
}

impl fmt::Display for SpecMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A speculation method name that is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown speculation method '{0}' (expected off, ngram, self or draft)")]
pub struct UnknownMethod(pub String);

impl FromStr for SpecMethod {
    type Err = UnknownMethod;
    fn from_str(s: &str) -> Result<Self, UnknownMethod> {
        Self::ALL
            .into_iter()
            .find(|m| m.as_str() == s.trim().to_ascii_lowercase())
            .ok_or_else(|| UnknownMethod(s.to_string()))
    }
}

/// Speculation knobs; all may change while the engine runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SpecConfig {
    pub method: SpecMethod,
    /// Most tokens proposed per request per step (vLLM's `num_speculative_tokens`).
    pub num_tokens: usize,
    /// N-gram sizes looked up, longest first (vLLM's `prompt_lookup_min` / `prompt_lookup_max`).
    pub ngram_min: usize,
    pub ngram_max: usize,
    /// Layers the self-drafter runs before its exit; 0 = half the model's.
    pub self_layers: usize,
    /// Policy: no proposals while more than this many requests run (a full batch needs its
    /// compute for real tokens). `None` = no limit.
    pub max_batch: Option<usize>,
    /// Policy: proposals pause when the recent acceptance rate falls below this, and are tried
    /// again after [`PAUSE_STEPS`] steps. `None` = never pause.
    pub min_acceptance: Option<f64>,
    /// Policy: a request's proposal is verified only when its expected kept tokens pay for
    /// the longer step ([`payoff`]); off, every proposal is verified.
    pub payoff: bool,
}

impl Default for SpecConfig {
    fn default() -> Self {
        Self {
            method: SpecMethod::Off,
            num_tokens: 4,
            ngram_min: 1,
            ngram_max: 4,
            self_layers: 0,
            max_batch: None,
            min_acceptance: None,
            payoff: true,
        }
    }
}

/// Most proposed tokens per request per step a setting may ask for.
pub const MAX_SPEC_TOKENS: usize = 16;

/// Steps the acceptance-rate policy pauses proposals for before trying again.
pub const PAUSE_STEPS: u32 = 64;

/// Proposed tokens the acceptance-rate policy judges over (the most recent ones).
pub const ACCEPTANCE_WINDOW: u64 = 128;

/// Speculation settings that make no sense, and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct SpecConfigError(pub String);

impl SpecConfig {
    /// Refuses settings that make no sense (k of 0 with a method on, n-gram sizes reversed).
    pub fn validate(&self) -> Result<(), SpecConfigError> {
        if self.method != SpecMethod::Off && !(1..=MAX_SPEC_TOKENS).contains(&self.num_tokens) {
            return Err(SpecConfigError(format!(
                "speculative tokens must be 1..={MAX_SPEC_TOKENS} (got {})",
                self.num_tokens
            )));
        }
        if self.ngram_min == 0 || self.ngram_min > self.ngram_max || self.ngram_max > 64 {
            return Err(SpecConfigError(format!(
                "n-gram sizes must satisfy 1 <= min <= max <= 64 (got {}..{})",
                self.ngram_min, self.ngram_max
            )));
        }
        if let Some(a) = self.min_acceptance
            && !(0.0..=1.0).contains(&a)
        {
            return Err(SpecConfigError(format!(
                "minimum acceptance rate must be in [0, 1] (got {a})"
            )));
        }
        Ok(())
    }

    /// The layers a self-drafter of a model of `n_layers` runs.
    pub fn exit_layer(&self, n_layers: usize) -> usize {
        let l = if self.self_layers == 0 {
            n_layers / 2
        } else {
            self.self_layers
        };
        l.clamp(1, n_layers.max(1))
    }
}

/// A proposer, built from [`SpecConfig`] by the engine.
pub enum Proposer {
    Ngram { min_n: usize, max_n: usize },
    Model(Box<Drafter>),
}

impl Proposer {
    /// Whether proposals cost a forward pass (a drafter), not a lookup.
    pub fn is_model(&self) -> bool {
        matches!(self, Self::Model(_))
    }

    /// Proposals for the requests asked (each at most its `k`); requests not in the answer get
    /// none this step.
    pub fn propose(
        &mut self,
        asks: &[Ask<'_>],
    ) -> Result<Vec<(RequestId, Vec<u32>)>, BackendError> {
        match self {
            Self::Ngram { min_n, max_n } => Ok(asks
                .iter()
                .map(|a| (a.id, ngram::propose(a.tokens, *min_n, *max_n, a.k)))
                .filter(|(_, d)| !d.is_empty())
                .collect()),
            Self::Model(d) => d.propose(asks),
        }
    }

    /// A request ended: whatever the proposer holds for it is released.
    pub fn forget(&mut self, id: RequestId) {
        if let Self::Model(d) = self {
            d.forget(id);
        }
    }

    /// KV memory the proposer holds (a drafter's pool), in bytes.
    pub fn kv_bytes(&self) -> usize {
        match self {
            Self::Ngram { .. } => 0,
            Self::Model(d) => d.memory().kv,
        }
    }
}

/// Why proposals are off right now, for the dashboard.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum SpecPause {
    /// The method is off (or no proposer could be built).
    Off,
    /// More requests run than the policy's `max_batch`.
    BatchFull { running: usize, max_batch: usize },
    /// The recent acceptance rate fell below the policy's minimum.
    LowAcceptance { rate: f64, min: f64 },
}

impl fmt::Display for SpecPause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Off => f.write_str("off"),
            Self::BatchFull { running, max_batch } => {
                write!(f, "paused: {running} running > {max_batch}")
            }
            Self::LowAcceptance { rate, min } => write!(
                f,
                "paused: acceptance {:.0}% < {:.0}%",
                rate * 100.0,
                min * 100.0
            ),
        }
    }
}

/// The policy's state: whether to propose this step, from the batch size and the recent
/// acceptance rate.
#[derive(Debug, Clone, Default)]
pub struct Gate {
    /// (proposed, accepted) over recent steps with proposals, oldest first, bounded by
    /// [`ACCEPTANCE_WINDOW`] proposed tokens.
    recent: std::collections::VecDeque<(u64, u64)>,
    /// Steps left in an acceptance pause.
    paused_for: u32,
    pause: Option<SpecPause>,
    /// Times proposals turned on or off by the policy.
    pub switches: u64,
}

impl Gate {
    /// Whether to propose in the next step (`None`) or why not.
    pub fn check(&mut self, cfg: &SpecConfig, running: usize) -> Option<SpecPause> {
        let pause = if cfg.method == SpecMethod::Off {
            Some(SpecPause::Off)
        } else if let Some(max_batch) = cfg.max_batch
            && running > max_batch
        {
            Some(SpecPause::BatchFull { running, max_batch })
        } else if self.paused_for > 0 {
            self.paused_for -= 1;
            if self.paused_for == 0 {
                self.recent.clear(); // try again with a fresh judgement
            }
            self.pause.clone().filter(|_| self.paused_for > 0)
        } else {
            match (cfg.min_acceptance, self.rate()) {
                (Some(min), Some(rate)) if rate < min && self.proposed() >= ACCEPTANCE_WINDOW => {
                    self.paused_for = PAUSE_STEPS;
                    Some(SpecPause::LowAcceptance { rate, min })
                }
                _ => None,
            }
        };
        let was_on = self.pause.is_none();
        if was_on != pause.is_none() && cfg.method != SpecMethod::Off {
            self.switches += 1;
        }
        self.pause = pause.clone();
        pause
    }

    /// A step verified `proposed` tokens and kept `accepted` of them.
    pub fn record(&mut self, proposed: u64, accepted: u64) {
        if proposed == 0 {
            return;
        }
        self.recent.push_back((proposed, accepted));
        // Keep the fewest recent steps that still cover the window.
        while self.recent.len() > 1
            && self.proposed() - self.recent.front().map_or(0, |r| r.0) >= ACCEPTANCE_WINDOW
        {
            self.recent.pop_front();
        }
    }

    fn proposed(&self) -> u64 {
        self.recent.iter().map(|r| r.0).sum()
    }

    /// Accepted / proposed over the recent window.
    pub fn rate(&self) -> Option<f64> {
        let p = self.proposed();
        (p > 0).then(|| self.recent.iter().map(|r| r.1).sum::<u64>() as f64 / p as f64)
    }

    /// Why proposals are off now, if they are.
    pub fn pause(&self) -> Option<&SpecPause> {
        self.pause.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn method_names_round_trip() {
        for m in SpecMethod::ALL {
            assert_eq!(m.as_str().parse::<SpecMethod>(), Ok(m));
        }
        assert!("eagle".parse::<SpecMethod>().is_err());
    }

    #[test]
    fn policy_pauses_on_batch_and_acceptance() {
        let cfg = SpecConfig {
            method: SpecMethod::Ngram,
            max_batch: Some(4),
            min_acceptance: Some(0.5),
            ..SpecConfig::default()
        };
        let mut g = Gate::default();
        assert_eq!(g.check(&cfg, 3), None);
        assert!(matches!(
            g.check(&cfg, 5),
            Some(SpecPause::BatchFull { .. })
        ));
        assert_eq!(g.switches, 1);
        assert_eq!(g.check(&cfg, 2), None);
        // Low acceptance over a full window pauses for PAUSE_STEPS steps, then tries again.
        for _ in 0..40 {
            g.record(4, 1);
        }
        assert!(matches!(
            g.check(&cfg, 1),
            Some(SpecPause::LowAcceptance { .. })
        ));
        for _ in 1..PAUSE_STEPS {
            assert!(g.check(&cfg, 1).is_some());
        }
        assert_eq!(g.check(&cfg, 1), None);
        assert!(g.rate().is_none(), "a fresh judgement after the pause");
    }
}

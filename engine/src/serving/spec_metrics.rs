//! Speculative decoding's figures under vLLM's metric names (`vllm:spec_decode_num_drafts`,
//! `..._num_draft_tokens`, `..._num_accepted_tokens`, `..._num_accepted_tokens_per_pos`): what
//! one step proposed and kept, the totals, and the rates derived from them. Acceptance rate =
//! accepted / proposed tokens; mean acceptance length = 1 + accepted / drafts (the tokens a
//! request gains per verified step, the bonus token included), both as vLLM defines them.

use serde::{Deserialize, Serialize};

/// One request's speculation, reported with its usage.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecUsage {
    /// Steps that verified proposals for it.
    pub drafts: usize,
    /// Proposed tokens verified, and of those accepted.
    pub draft_tokens: usize,
    pub accepted_tokens: usize,
    /// Time of the proposals made for it, and of the steps that verified them (each step's
    /// whole proposal or verification time, which its batch mates shared), in microseconds.
    #[serde(default)]
    pub propose_us: u64,
    #[serde(default)]
    pub verify_us: u64,
}

impl SpecUsage {
    pub fn add(&mut self, o: &SpecUsage) {
        self.drafts += o.drafts;
        self.draft_tokens += o.draft_tokens;
        self.accepted_tokens += o.accepted_tokens;
        self.propose_us += o.propose_us;
        self.verify_us += o.verify_us;
    }

    /// Mean proposal time of a verified step (ms).
    pub fn propose_ms_per_draft(&self) -> Option<f64> {
        rate(self.propose_us, self.drafts as u64).map(|us| us / 1e3)
    }

    /// Mean time of a step that verified proposals (ms): its forward and the verification.
    pub fn verify_ms_per_draft(&self) -> Option<f64> {
        rate(self.verify_us, self.drafts as u64).map(|us| us / 1e3)
    }

    /// Accepted / proposed tokens.
    pub fn acceptance_rate(&self) -> Option<f64> {
        rate(self.accepted_tokens as u64, self.draft_tokens as u64)
    }

    /// 1 + accepted / drafts.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        rate(self.accepted_tokens as u64, self.drafts as u64).map(|r| 1.0 + r)
    }
}

/// One step's speculation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecStep {
    /// Requests that had proposals verified in the step.
    pub drafts: u64,
    /// Proposed tokens verified.
    pub draft_tokens: u64,
    /// Of those, accepted.
    pub accepted_tokens: u64,
    /// Accepted tokens by their position in the proposal (index 0 = first proposed token).
    pub accepted_per_pos: Vec<u64>,
    /// Time spent proposing before the step (n-gram lookup or drafter forwards).
    pub propose_ms: f64,
    /// Time of the step's forward and sampling when it verified proposals (0 without).
    #[serde(default)]
    pub verify_ms: f64,
    /// Whether the policy let proposals run this step.
    pub active: bool,
    /// Verified proposals cut short by a rejected token (the pay-off policy's record).
    #[serde(skip)]
    pub rejections: u64,
}

/// Totals since the metrics were created or reset.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecCounters {
    pub num_drafts: u64,
    pub num_draft_tokens: u64,
    pub num_accepted_tokens: u64,
    pub num_accepted_tokens_per_pos: Vec<u64>,
    /// Time spent proposing, and in steps that verified proposals (microseconds).
    #[serde(default)]
    pub propose_us: u64,
    #[serde(default)]
    pub verify_us: u64,
}

impl SpecCounters {
    pub fn add(&mut self, s: &SpecStep) {
        self.propose_us += micros(s.propose_ms);
        self.verify_us += micros(s.verify_ms);
        self.num_drafts += s.drafts;
        self.num_draft_tokens += s.draft_tokens;
        self.num_accepted_tokens += s.accepted_tokens;
        let per_pos = &mut self.num_accepted_tokens_per_pos;
        if per_pos.len() < s.accepted_per_pos.len() {
            per_pos.resize(s.accepted_per_pos.len(), 0);
        }
        for (t, a) in per_pos.iter_mut().zip(&s.accepted_per_pos) {
            *t += a;
        }
    }

    /// Accepted / proposed tokens.
    pub fn acceptance_rate(&self) -> Option<f64> {
        rate(self.num_accepted_tokens, self.num_draft_tokens)
    }

    /// 1 + accepted / drafts.
    pub fn mean_acceptance_length(&self) -> Option<f64> {
        rate(self.num_accepted_tokens, self.num_drafts).map(|r| 1.0 + r)
    }
}

/// Milliseconds as whole microseconds.
pub fn micros(ms: f64) -> u64 {
    (ms * 1e3).round().max(0.0) as u64
}

fn rate(num: u64, den: u64) -> Option<f64> {
    (den > 0).then(|| num as f64 / den as f64)
}

/// Speculation over a window of steps, for the live view.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SpecWindow {
    pub acceptance_rate: Option<f64>,
    pub mean_acceptance_length: Option<f64>,
    /// Mean proposal time per step with proposals (ms).
    pub propose_ms: Option<f64>,
    /// Mean time of a step that verified proposals (ms).
    #[serde(default)]
    pub verify_ms: Option<f64>,
    /// Share of the window's steps in which proposals ran.
    pub active_share: Option<f64>,
}

impl SpecWindow {
    pub fn of<'a>(steps: impl Iterator<Item = &'a SpecStep>) -> Self {
        let mut c = SpecCounters::default();
        let (mut n, mut active, mut ms) = (0u64, 0u64, 0.0);
        let (mut verified, mut verify_ms) = (0u64, 0.0);
        for s in steps {
            n += 1;
            if s.active {
                active += 1;
                ms += s.propose_ms;
            }
            if s.drafts > 0 {
                verified += 1;
                verify_ms += s.verify_ms;
            }
            c.add(s);
        }
        Self {
            acceptance_rate: c.acceptance_rate(),
            mean_acceptance_length: c.mean_acceptance_length(),
            propose_ms: (active > 0).then(|| ms / active as f64),
            verify_ms: (verified > 0).then(|| verify_ms / verified as f64),
            active_share: rate(active, n),
        }
    }
}

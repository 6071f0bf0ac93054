//! What the CUDA path runs: the one table of weight types and model operations with their
//! state ([`Support`]: missing, untried, tried), and the one error that refuses a model for a
//! row of it ([`Unsupported`]). The engine's CUDA device maps each operation a recipe records to
//! a [`Feature`] and asks this table; the backend asks it for each weight type it uploads.
//! Moving a row from untried to tried, once `tests/gpu/gpu-check.sh` has run its kernel on a GPU,
//! is a one-line change here.

use std::fmt;

use crate::WType;

/// How far the CUDA path has a feature.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Support {
    /// No kernel: models that need it run on the CPU.
    Missing,
    /// A kernel is written and checked on the CPU simulator (`kernels/tests/cuda_sim.rs`) but
    /// has not run on a GPU. Untried operations run when the device is opened with `untried`
    /// (`TPSLAB_CUDA_TRIAL=1`); untried weight types are refused until they are tried.
    Untried,
    /// Its kernel has run on a GPU and matched the CPU.
    Tried,
}

/// A weight type or an operation of a model's recipe, as the CUDA path sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    /// Weights of this type.
    Type(WType),
    /// Attention with per-head sink logits (gpt-oss).
    AttentionSinks,
    /// Mixture-of-experts layers, routed on the host.
    Experts,
    /// Scaling a row by a constant (embeddings, residuals, logits).
    ConstScale,
    /// Soft-capping of the output logits.
    LogitSoftcap,
    /// RMS norms of the queries and keys per head.
    QkNorm,
    /// An RMS norm written over its input.
    InPlaceRmsNorm,
    /// A layer with no rotary embedding (NoPE).
    NoRope,
    /// RoPE with per-frequency factors (Llama 3.1).
    RopeFactors,
    /// RoPE scaled (linear, YaRN, an attention factor).
    RopeScaling,
    /// Attention over a sliding window.
    SlidingWindow,
    /// Soft-capping of the attention scores.
    AttentionSoftcap,
    /// A query scale other than 1/sqrt(head size).
    QueryScale,
    /// GELU (tanh) gating.
    GeluGate,
    /// OpenAI's clamped SwiGLU.
    SwigluOai,
    /// A layer whose experts are split between host and device memory.
    SplitExperts,
    /// A dense matrix kept in host memory.
    HostMatrix,
    /// A KV cache stored as another type than f16 (`--cache-type-k/-v` bf16, q8_0, q4_0).
    QuantizedKv,
}

impl Feature {
    /// The operations of the table, for listing it.
    pub const OPS: [Feature; 17] = [
        Feature::AttentionSinks,
        Feature::Experts,
        Feature::ConstScale,
        Feature::LogitSoftcap,
        Feature::QkNorm,
        Feature::InPlaceRmsNorm,
        Feature::NoRope,
        Feature::RopeFactors,
        Feature::RopeScaling,
        Feature::SlidingWindow,
        Feature::AttentionSoftcap,
        Feature::QueryScale,
        Feature::GeluGate,
        Feature::SwigluOai,
        Feature::SplitExperts,
        Feature::HostMatrix,
        Feature::QuantizedKv,
    ];

    /// The table: how far the CUDA path has this feature.
    pub fn support(self) -> Support {
        use Support::{Missing, Tried, Untried};
        match self {
            // matvec.cu's types, run on an H200 (2026-11-30).
            Feature::Type(
                WType::F32
                | WType::F16
                | WType::BF16
                | WType::Q4_0
                | WType::Q4_1
                | WType::Q8_0
                | WType::Q4K
                | WType::Q6K,
            ) => Tried,
            // blocks.cuh's decode and mmvq.cu's rows, checked on the simulator only.
            Feature::Type(
                WType::Q5K
                | WType::Q5_0
                | WType::Q5_1
                | WType::Q2K
                | WType::Q3K
                | WType::IQ4NL
                | WType::IQ4XS
                | WType::MXFP4,
            ) => Untried,
            Feature::AttentionSinks
            | Feature::Experts
            | Feature::ConstScale
            | Feature::LogitSoftcap
            | Feature::QkNorm
            | Feature::InPlaceRmsNorm
            | Feature::NoRope
            | Feature::RopeFactors
            | Feature::RopeScaling
            | Feature::SlidingWindow
            | Feature::AttentionSoftcap
            | Feature::QueryScale
            | Feature::GeluGate
            | Feature::SwigluOai => Untried,
            Feature::SplitExperts | Feature::HostMatrix | Feature::QuantizedKv => Missing,
        }
    }

    /// Whether the CUDA path takes this feature: tried, or untried and `untried` allowed (weight
    /// types only when tried).
    pub fn runs(self, untried: bool) -> bool {
        match self.support() {
            Support::Tried => true,
            Support::Untried => untried && !matches!(self, Feature::Type(_)),
            Support::Missing => false,
        }
    }

    /// `Ok` when the CUDA path takes this feature (see [`Feature::runs`]), else the refusal.
    pub fn check(self, untried: bool) -> Result<(), Unsupported> {
        if self.runs(untried) {
            Ok(())
        } else {
            Err(Unsupported(self))
        }
    }
}

impl fmt::Display for Feature {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Feature::Type(ty) => return write!(f, "{ty}"),
            Feature::AttentionSinks => "attention sinks",
            Feature::Experts => "mixture-of-experts layers",
            Feature::ConstScale => "scaling by a constant (embeddings, residuals, logits)",
            Feature::LogitSoftcap => "logit soft-capping",
            Feature::QkNorm => "QK-norm",
            Feature::InPlaceRmsNorm => "an in-place RMS norm",
            Feature::NoRope => "a layer without RoPE",
            Feature::RopeFactors => "RoPE frequency factors",
            Feature::RopeScaling => "RoPE scaling",
            Feature::SlidingWindow => "sliding-window attention",
            Feature::AttentionSoftcap => "attention soft-capping",
            Feature::QueryScale => "a query scale other than 1/sqrt(head size)",
            Feature::GeluGate => "GELU gating",
            Feature::SwigluOai => "OpenAI's clamped SwiGLU",
            Feature::SplitExperts => "a layer with experts on both sides",
            Feature::HostMatrix => "a matrix kept in host memory",
            Feature::QuantizedKv => "a KV cache of another type than f16 (--cache-type-k/-v)",
        };
        f.write_str(name)
    }
}

/// A model needs a feature the CUDA path does not take: the one refusal, worded by the
/// feature's row of the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported(pub Feature);

impl fmt::Display for Unsupported {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let feature = self.0;
        match (feature.support(), feature) {
            (Support::Missing, _) => write!(f, "{feature} has no CUDA kernel yet"),
            (_, Feature::Type(_)) => write!(
                f,
                "{feature} has a CUDA kernel that has not run on a GPU yet (tests/gpu/gpu-check.sh runs it)"
            ),
            _ => write!(
                f,
                "{feature} has a CUDA kernel that has not run on a GPU yet: TPSLAB_CUDA_TRIAL=1 runs it"
            ),
        }?;
        f.write_str("; run this model on the CPU (--device cpu)")
    }
}

impl std::error::Error for Unsupported {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_type_has_a_row_and_untried_types_stay_refused() {
        for ty in WType::ALL {
            let f = Feature::Type(ty);
            match f.support() {
                Support::Tried => assert!(f.runs(false) && f.check(false).is_ok()),
                _ => {
                    assert!(!f.runs(true), "{ty} is taken before it has run on a GPU");
                    let msg = f.check(true).expect_err("refused").to_string();
                    assert!(msg.starts_with(&format!("{ty} has")), "{msg}");
                    assert!(msg.ends_with("(--device cpu)"), "{msg}");
                }
            }
        }
    }

    #[test]
    fn untried_operations_run_only_when_asked_and_missing_ones_never() {
        for op in Feature::OPS {
            match op.support() {
                Support::Untried => {
                    assert!(!op.runs(false) && op.runs(true), "{op}");
                    assert!(
                        op.check(false)
                            .expect_err("untried without trial")
                            .to_string()
                            .contains("TPSLAB_CUDA_TRIAL=1")
                    );
                }
                Support::Missing => {
                    assert!(!op.runs(true), "{op}");
                    assert!(
                        op.check(true)
                            .expect_err("missing")
                            .to_string()
                            .contains("no CUDA kernel yet")
                    );
                }
                Support::Tried => assert!(op.runs(false), "{op}"),
            }
        }
    }
}

//! The fleet simulator: from one machine to many. A discrete-event replay of a workload against
//! N replicas of one planned configuration (a device, a precision, the scheduler's knobs), each
//! replica stepping as the planner's step model ([`super::roofline::StepModel`]) says: continuous
//! batching under a token budget and a sequence cap, KV capacity in tokens, the newest running
//! request preempted (recompute) when the KV runs out. A router sends each request to the ready
//! replica with the fewest outstanding requests; an autoscaler adds replicas towards a target
//! queue depth or KV use, each new one paying a scale-up delay and a cold start (its weights
//! over the disk's and the host link's bandwidth, or a measured figure); a replica whose queue
//! is at the shedding limit refuses the request. What comes out: P50/P99 TTFT, ITL and E2E
//! latency per time window, requests shed, replicas over time, GPU-hours and $ per million
//! output tokens, several configurations side by side and the cheapest one that meets an SLO.
//! The replay is deterministic (arrivals from a seed) and bounded (events, windows, simulated
//! time, requests).
//!
//! Modules:
//! - [`arrivals`]: the requests replayed: a tuner preset at a rate, a recorded trace (rescaled
//!   to a target rate), or a generated trace with a burst or a daily curve.
//! - [`replica`]: one replica's scheduler state and step, over the planner's step model.
//! - [`stats`]: latency histograms, time windows, and the summary of a window or a replay.
//! - [`sim`]: a configuration, the event loop (routing, autoscaling, shedding, billing), and
//!   configurations compared against an SLO.

pub mod arrivals;
pub mod replica;
pub mod sim;
pub mod stats;

#[cfg(test)]
mod tests;

pub use arrivals::{Arrival, Generated, RateShape, from_trace, generate, to_trace_lines};
pub use sim::{
    Autoscale, ColdStart, Comparison, FleetConfig, FleetReport, Limits, ReplicaSpec, ScaleMetric,
    Slo, compare, simulate,
};
pub use stats::{Latency, Summary, WindowStats};

/// Why a replay cannot be made. Each names the field or line at fault.
#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    /// A number of the configuration or the workload that cannot make a replay.
    #[error("{field}: {why}")]
    Invalid { field: String, why: String },
    /// A recorded trace that cannot be replayed (which line, and why).
    #[error(transparent)]
    Trace(#[from] crate::tune::workload::WorkloadError),
    /// The device table, the model shape or the device.
    #[error(transparent)]
    Plan(#[from] super::PlanError),
    /// The weights of the configuration leave no room for the KV cache on its device.
    #[error(
        "{config}: the weights ({weights_gib:.1} GiB) leave no memory for the KV cache on {device}"
    )]
    DoesNotFit {
        config: String,
        device: String,
        weights_gib: f64,
    },
    /// The replay would pass one of its bounds.
    #[error("the replay would pass its bound on {what} ({limit}); {hint}")]
    Bound {
        what: &'static str,
        limit: String,
        hint: &'static str,
    },
}

impl FleetError {
    /// An [`FleetError::Invalid`] for `field`.
    pub(crate) fn invalid(field: impl Into<String>, why: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.into(),
            why: why.into(),
        }
    }
}

/// `v` is a finite number of at least `min` (and, when given, at most `max`), or an error naming
/// `field`.
pub(crate) fn check_num(field: &str, v: f64, min: f64, max: Option<f64>) -> Result<(), FleetError> {
    if !v.is_finite() {
        return Err(FleetError::invalid(
            field,
            format!("must be a number, not {v}"),
        ));
    }
    if v < min {
        return Err(FleetError::invalid(
            field,
            format!("must be at least {min}, not {v}"),
        ));
    }
    if let Some(max) = max.filter(|&m| v > m) {
        return Err(FleetError::invalid(
            field,
            format!("must be at most {max}, not {v}"),
        ));
    }
    Ok(())
}

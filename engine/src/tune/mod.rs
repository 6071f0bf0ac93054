//! The SLO tuner: given objectives and a workload, it searches the engine's knobs with short
//! measured runs (successive halving: many candidates on short runs, the better half on longer
//! ones) and reports goodput against settings, the Pareto frontier, and fresh runs of the
//! winner and of the defaults.
//!
//! Modules:
//! - [`halving`]: successive halving and the Pareto frontier, on plain data.
//! - [`space`]: a candidate's knobs, the space they are drawn from, the objectives, a run's
//!   figures and score.
//! - [`run`]: the loop over a live engine through the load generator.
//! - [`workload`]: what the runs load the engine with: lengths fixed, from a preset or from a
//!   recorded trace of a server's requests, and the arrivals.

pub mod halving;
pub mod run;
pub mod space;
pub mod workload;

pub use halving::{Plan, pareto_front, successive_halving};
pub use run::{
    CandidateRun, ClientKnobs, Knob, Tunable, TuneConfig, TuneEvent, TuneReport, tune, tune_client,
};
pub use space::{Candidate, Measured, Space, TuneSlo};
pub use workload::{Trace, TraceEntry, Workload};

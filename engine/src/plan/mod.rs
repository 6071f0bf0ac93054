//! The capacity planner: what a model would do on a machine one does not have. A roofline model
//! of this engine's steps (decode: weight and KV bytes over bandwidth against FLOPs over FLOP/s;
//! prefill: compute-bound; KV memory -> the concurrency that fits), calibrated with the
//! efficiency this engine measured on each backend, predicts per-request and aggregate TPS,
//! TTFT, the largest concurrency and the cost per million output tokens on a table of devices.
//!
//! Modules:
//! - [`devices`]: the device table (bandwidth, FLOP/s per precision, memory, $/hour, the link
//!   to the other GPUs, each with its source), the engines' calibrations, the measured rows they
//!   are checked against and the published multi-GPU runs of other engines; the bundled table
//!   is `assets/devices.json`.
//! - [`roofline`]: the model's shape and the prediction for one device, precision and workload,
//!   and its error against measured rows.
//! - [`split`]: how a model is split over GPUs ([`Parallel`]), as the predictions carry it.
//! - [`parallel`]: multi-GPU serving: tensor, pipeline and expert parallelism (the weights and
//!   KV split per GPU, all-reduces, all-to-alls and stage sends priced from the link, the
//!   pipeline's bubble), and the published runs held against its predictions.
//! - [`calibrate`]: a device row refitted to runs measured on the machine the planner runs on.
//! - [`fleet`]: from one machine to a fleet: a discrete-event replay of a workload against
//!   replicas of a planned configuration (routing, autoscaling, cold starts, shedding, cost).

pub mod calibrate;
pub mod devices;
pub mod fleet;
pub mod parallel;
pub mod roofline;
pub mod split;

pub use calibrate::calibrate_device;
pub use devices::{Calibration, DeviceSpec, DeviceTable, Link, MeasuredRow, PublishedRow, Sourced};
pub use parallel::{
    Parallel, PlanGrid, PublishedCheck, check_published, pipeline_bubble, plan_grid,
    predict_parallel,
};
pub use roofline::{
    ErrorSummary, ModelShape, Prediction, Source, StepModel, Workload, check, predict, source,
};

/// Why a plan cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error("device table: {0}")]
    Table(String),
    #[error("unknown device '{name}' (known: {known})")]
    UnknownDevice { name: String, known: String },
    #[error("device '{device}' names backend '{backend}', which has no calibration in the table")]
    NoCalibration { device: String, backend: String },
    #[error("bad workload: {0}")]
    Workload(String),
    #[error("bad model shape: {0}")]
    Shape(String),
    #[error("cannot split {0}")]
    Parallel(String),
}

//! The capacity planner: one test binary for its modules.
//!
//! Modules:
//! - `measured`: predictions against the measured rows (the H200's and this CPU's), the
//!   roofline's parts, mixtures of experts, hostile tables and workloads
//! - `parallel`: multi-GPU plans (tensor, pipeline and expert parallelism) and the published
//!   multi-GPU runs of vLLM and SGLang
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod measured;
mod parallel;

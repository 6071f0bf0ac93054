//! TPS Lab app: the command line front end over the engine (the window joins it later).
//!
//! Modules:
//! - [`cli`]: argument parsing and the subcommands (`generate`, `bench`).
//! - [`bench`]: single-stream prompt-processing and decode benchmarks (llama-bench style).
//! - [`mem`]: process memory readings (RSS, peak RSS).

pub mod bench;
pub mod cli;
pub mod mem;

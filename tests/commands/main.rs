//! The command line run as a user runs it: one test binary (one link of the app) for the modules
//! below, which share the support code declared here once.
//!
//! Modules:
//! - `cli`: The `tpslab` command line end to end, on the real default model
//! - `fleet`: `tpslab fleet` through the real binary
//! - `tune`: The decision commands end to end on the real default model
//! - `perplexity_kl`: `tpslab perplexity MODEL --kl-base BASE` on the real default model

#[path = "../support/cli_bin.rs"]
mod cli_bin;
#[path = "../support/http_client.rs"]
mod http_client;
#[path = "../support/llamacpp.rs"]
mod llamacpp;
#[path = "../support/runaway.rs"]
mod runaway;
#[path = "../../engine/tests/support/temp_dir.rs"]
mod temp_dir;

mod cli;
mod fleet;
mod perplexity_kl;
mod tune;

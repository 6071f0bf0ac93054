//! TPS Lab app: the desktop window and the command line front end over the engine.
//!
//! Modules (each imports only those listed after it, or none of these):
//! - [`cli`]: the clap definitions and the subcommands (`generate`, `bench`, `quantize`,
//!   `perplexity`, `export`, `models`, `pull`), dispatched from one `main`.
//! - [`ui`]: the eframe window: chat, tuning dashboard, load generator, sweep, model library.
//! - [`serve`]: `tpslab serve`, the OpenAI-compatible HTTP server and its Prometheus metrics.
//! - [`model_args`]: where a command's model comes from and what runs it (`--model`,
//!   `--synthetic`, `--device`, `--threads`), shared by `cli` and `serve`.
//! - [`kv_args`]: the KV pool's size and block size (`--kv-budget-mb`, `--gpu-kv-fraction`,
//!   `--block-size`), shared by `cli` and `serve`.
//! - [`spec_args`]: `--spec` (speculative decoding: method, proposed tokens, policy), shared by
//!   `cli` and `serve`.
//! - [`remote`]: a remote OpenAI-compatible server as the load generator's target.
//! - [`hub`]: Hugging Face Hub client (hf-hub): list, search, and `pull` into the library.
//! - [`mem`]: process memory readings (RSS, peak RSS).

pub mod cli;
pub mod hub;
pub mod kv_args;
pub mod mem;
pub mod model_args;
pub mod remote;
pub mod serve;
pub mod spec_args;
pub mod ui;

//! TPS Lab app: the desktop window and the command line front end over the engine.
//!
//! Modules:
//! - [`cli`]: argument parsing and the subcommands (`generate`, `bench`, `quantize`,
//!   `perplexity`).
//! - [`bench`]: `tpslab bench` arguments and the single-stream mode (llama-bench style).
//! - [`serve_bench`]: the serving benchmark over the engine or a remote server (vLLM's figures
//!   per concurrency).
//! - [`remote`]: a remote OpenAI-compatible server as the load generator's target.
//! - [`model_cmds`]: `tpslab quantize` (re-quantize a GGUF, predicted size, progress bar) and
//!   `tpslab perplexity`.
//! - [`hub`]: Hugging Face Hub client (hf-hub): list, search, and `pull` into the library.
//! - [`library_cmds`]: `tpslab models` (list, import, rm, search) and `tpslab pull`.
//! - [`mem`]: process memory readings (RSS, peak RSS).
//! - [`serve`]: `tpslab serve`, the OpenAI-compatible HTTP server and its Prometheus metrics.
//! - [`ui`]: the eframe window: chat, tuning dashboard, load generator, sweep.

pub mod bench;
pub mod cli;
pub mod hub;
pub mod library_cmds;
pub mod mem;
pub mod model_cmds;
pub mod remote;
pub mod serve;
pub mod serve_bench;
pub mod ui;

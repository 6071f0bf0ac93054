//! The serving core: the engine thread that batches requests continuously over a device, the
//! requests and events that pass between it and its clients, and what measures it.
//!
//! Modules:
//! - [`engine`]: the engine thread (continuous batching) and its message-passing handle (its
//!   step in `engine_step`).
//! - [`request`]: a request and the events it gets back (re-exported by [`engine`]).
//! - [`refusal`]: why a request is not run, typed, as every front end shows it.
//! - [`admission`]: the one check a request passes at submit, its typed refusal, its `max_tokens`.
//! - [`logprobs`]: log-probabilities of the generated tokens and their top alternatives.
//! - [`sampler`]: logit bias, penalties and greedy / top-k / top-p / min-p / temperature sampling.
//! - [`constraint`]: structured output (JSON schema, regex, Lark, GBNF through llguidance): the
//!   per-model grammar compiler and the per-request token masks (GBNF conversion in `gbnf`).
//! - [`generate`]: a loaded model bundle and the single-request generation loop.
//! - [`requant`]: precision as a live knob: the loaded weights re-quantized in memory.
//! - [`metrics`]: vLLM-compatible benchmark summary, live sliding-window TPS and TTFT, cost, RSS.
//! - [`spec_metrics`]: speculative decoding's counters and rates (vLLM's names).
//! - `spec_step` (in [`engine`]): proposing before a step and verifying in it.
//! - [`ring`]: the fixed-capacity ring buffer the live metrics keep their series in.
//! - [`rss`]: this process's resident memory from `/proc`.
//! - [`loadgen`]: load generator (fixed concurrency or Poisson arrivals) timing tokens client-side.
//! - [`perplexity`]: llama.cpp-style perplexity over a text (the bundled one is public domain).
//! - [`kl`]: KL divergence of a model from its base over the perplexity windows (llama.cpp's
//!   `--kl-divergence`), top-1 agreement and Δ perplexity.

pub mod admission;
pub mod constraint;
pub mod engine;
pub mod gbnf;
pub mod generate;
pub mod kl;
pub mod loadgen;
pub mod logprobs;
pub mod metrics;
pub mod perplexity;
pub mod refusal;
pub mod requant;
pub mod request;
pub mod ring;
pub mod rss;
pub mod sampler;
pub mod spec_metrics;

//! The engine serving requests: scheduling, batching, the KV cache, sampling, speculation, metrics:
//! one test binary (one link) for the modules below, which share the support code declared here
//! once.
//!
//! Modules:
//! - `adaptive_budget`: The adaptive token budget's decisions through the scheduler's API: under
//!   a long prompt beside many decodes, with the policy on, the prefill chunk a step ...
//! - `batching`: Continuous batching on the real model: greedy outputs are bit-identical whether
//!   a request runs alone or inside any batch mix, under knob settings that force chunked ...
//! - `block_pool`: Block pool and KV manager: eviction order, prefix-cache hits, all-or-nothing
//!   allocation, and a property test that checks every prefix-cache hit hands back blocks ...
//! - `embeddings`: Embedding requests: the same vector alone, batched beside generating
//!   requests, in chunks and preempted; each pooling rule; a cancelled one sends none
//! - `kv_types`: KV cache element types (f16, bf16, q8_0, q4_0, llama.cpp's `--cache-type-k/-v`):
//!   the tokens a budget holds in each, rows read back exactly as ggml's reference ...
//! - `metrics`: Metrics: vLLM-compatible benchmark figures checked against numpy, edge cases, the
//!   ring buffer, the live sliding-window figures, cost and process memory
//! - `moe`: Mixtures of experts on the CPU device, end to end through the model forward: the tiny
//!   random `qwen3moe`, `mixtral` and `gpt-oss` files of `model::tiny` load, and a ...
//! - `parity`: Numerical parity with llama.cpp on the real default model, teacher-forced: at
//!   every step of the reference greedy continuations the reference token must be our top ...
//! - `perplexity`: Perplexity of the real default model on the bundled text, and of its Q8_0
//!   quantization
//! - `sampler`: Sampler properties: seeded runs repeat, truncations (top-k, top-p, min-p) never
//!   pick outside their sets, greedy is argmax, penalties move choices the expected way, ...
//! - `scheduler`: Scheduler and KV block bookkeeping: unit tests of the policies, and a property
//!   test that drives random workloads through a simulated model whose "KV cache" is a ...
//! - `sliding_window`: Sliding-window attention in the paged KV cache (a model whose every layer
//!   slides, as Mistral's files set it): blocks that have left the window are freed as the ...
//! - `speculative`: Speculative decoding on the real model

#[path = "../support/default_model.rs"]
mod default_model;
#[path = "../../../tests/support/llamacpp.rs"]
mod llamacpp;
#[path = "../support/temp_dir.rs"]
mod temp_dir;

mod adaptive_budget;
mod batching;
mod block_pool;
mod embeddings;
mod kv_types;
mod metrics;
mod moe;
mod parity;
mod perplexity;
mod sampler;
mod scheduler;
mod sliding_window;
mod speculative;

//! TPS Lab engine: everything that runs a model, with no UI.
//!
//! Modules:
//! - [`gguf`]: validating GGUF reader (metadata, tensor table, tensor bytes).
//! - [`gguf_split`]: split GGUF models (`NAME-00001-of-0000N.gguf`) opened as one.
//! - [`gguf_write`]: GGUF writer (every metadata type; tensors streamed at aligned offsets).
//! - [`safetensors`]: validating safetensors reader and streaming writer (F32/F16/BF16).
//! - [`hf`]: Hugging Face folders (config.json, tokenizer.json, safetensors) opened as a GGUF view.
//! - [`hf_tokenizer`]: tokenizer.json + tokenizer_config.json mapped to the GGUF tokenizer keys.
//! - [`hf_export`]: exporting a model to a Hugging Face safetensors folder (`tpslab export`).
//! - [`library`]: the model library folder and fetching the default model.
//! - [`library_index`]: the library's models with source, shape facts and sha256; import, install, remove.
//! - [`library_st`]: a model described from its headers (GGUF, safetensors folder) for the index.
//! - [`kv`]: paged KV storage and the [`kv::Batch`] the forward pass reads it through.
//! - [`model`]: configuration, weights, the backend-ops seam and each architecture's recipe.
//! - [`device`]: the devices that run a recipe (CPU, CUDA) behind the engine's `Backend` seam.
//! - [`generate`]: a loaded model bundle and the single-request generation loop.
//! - [`tokenizer`]: the model's byte-level BPE tokenizer built from GGUF metadata.
//! - [`chat`]: chat templates rendered with minijinja as Hugging Face transformers renders them.
//! - [`chat_budget`]: the budgets of a template render (fuel, output, time, memory) and the
//!   isolated render that enforces them.
//! - [`detok`]: incremental detokenizer that emits only complete UTF-8 text.
//! - [`sampler`]: penalties and greedy / top-k / top-p / min-p / temperature sampling.
//! - [`stop`]: stop tokens, stop strings and token limits; finish reasons.
//! - [`block_pool`]: KV block pool (free list, ref counts, prefix-cache hashes) and per-request block tables.
//! - [`scheduler`]: vLLM-v1-style continuous-batching scheduler (token budget, chunking, preemption).
//! - [`metrics`]: vLLM-compatible benchmark summary, live sliding-window TPS and TTFT, cost, RSS.
//! - [`request`]: a request and the events it gets back (re-exported by [`engine`]).
//! - [`admission`]: the one check a request passes at submit, its typed refusal, its `max_tokens`.
//! - [`engine`]: the engine thread (continuous batching) and its message-passing handle.
//! - [`loadgen`]: load generator (fixed concurrency or Poisson arrivals) timing tokens client-side.
//! - [`perplexity`]: llama.cpp-style perplexity over a text (the bundled one is public domain).
//! - [`quantize`]: re-quantizing a GGUF to another weight type (llama.cpp's per-tensor rules).
//! - [`precision`]: a model's weight precision, typed (its matrices' type and any fallback).
//! - [`requant`]: precision as a live knob: the loaded weights re-quantized in memory.
//! - [`synthetic`]: models of known shapes with seeded random weights (vLLM's "dummy" format).
pub mod admission;
pub mod block_pool;
pub mod chat;
pub mod chat_budget;
pub mod detok;
pub mod device;
pub mod engine;
pub mod generate;
pub mod gguf;
pub mod gguf_split;
pub mod gguf_write;
pub mod hf;
pub mod hf_export;
pub mod hf_tokenizer;
pub mod kv;
pub mod library;
pub mod library_index;
pub mod library_st;
pub mod loadgen;
pub mod metrics;
pub mod model;
pub mod perplexity;
pub mod precision;
pub mod quantize;
pub mod requant;
pub mod request;
pub mod safetensors;
pub mod sampler;
pub mod scheduler;
pub mod stop;
pub mod synthetic;
pub mod tokenizer;

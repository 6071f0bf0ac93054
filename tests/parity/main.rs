//! Held against llama.cpp's and transformers' recorded outputs: one test binary (one link of the
//! app) for the modules below, which share the support code declared here once.
//!
//! Modules:
//! - `arch_reference`: Each architecture held against llama.cpp
//! - `chat_templates`: The real chat templates of the families TPS Lab runs (llama.cpp's
//!   models/templates/
//! - `tokenizer_vocab`: Every tokenizer vocabulary of llama.cpp's test fixtures (`models/ggml-
//!   vocab-*.gguf`) held against llama.cpp
//! - `hf_families`: Hugging Face folders of every family the engine runs (Llama with Llama 3 RoPE
//!   scaling, Mistral, Qwen2 with YaRN, Qwen3, Gemma 2, Gemma 3, Phi-3 with LongRoPE, ...

#[path = "../support/llamacpp.rs"]
mod llamacpp;

mod arch_reference;
mod chat_templates;
mod hf_families;
mod tokenizer_vocab;

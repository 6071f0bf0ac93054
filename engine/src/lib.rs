//! TPS Lab engine: everything that runs a model, with no UI.
//!
//! Modules:
//! - [`gguf`]: validating GGUF reader (metadata, tensor table, tensor bytes).
//! - [`library`]: the model library folder and fetching the default model.
//! - [`tokenizer`]: the model's byte-level BPE tokenizer built from GGUF metadata.
//! - [`chat`]: chat templates rendered with minijinja as Hugging Face transformers renders them.
//! - [`detok`]: incremental detokenizer that emits only complete UTF-8 text.
//! - [`stop`]: stop tokens, stop strings and token limits; finish reasons.
//! - [`sampler`]: penalties and greedy / top-k / top-p / min-p / temperature sampling.
pub mod gguf;
pub mod library;
pub mod tokenizer;
pub mod chat;
pub mod detok;
pub mod stop;
pub mod sampler;

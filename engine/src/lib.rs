//! TPS Lab engine: everything that runs a model, with no UI.
//!
//! Modules:
//! - [`gguf`]: validating GGUF reader (metadata, tensor table, tensor bytes).
//! - [`library`]: the model library folder and fetching the default model.
//! - [`tokenizer`]: the model's byte-level BPE tokenizer built from GGUF metadata.
pub mod gguf;
pub mod library;
pub mod tokenizer;

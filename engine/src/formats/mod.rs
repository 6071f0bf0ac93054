//! Model file formats: everything that reads or writes a model's bytes, each validated before
//! anything is sized from it. A GGUF file, a split GGUF set and a Hugging Face folder all open as
//! one [`gguf::GgufFile`] view (`GgufFile::open`).
//!
//! Modules:
//! - [`gguf`]: validating GGUF reader (metadata, tensor table, tensor bytes).
//! - [`gguf_split`]: split GGUF models (`NAME-00001-of-0000N.gguf`) opened as one.
//! - [`gguf_write`]: GGUF writer (every metadata type; tensors streamed at aligned offsets).
//! - [`safetensors`]: validating safetensors reader and streaming writer (F32/F16/BF16).
//! - [`hf`]: Hugging Face folders (config.json, tokenizer.json, safetensors) opened as a GGUF view.
//! - [`hf_tokenizer`]: tokenizer.json + tokenizer_config.json mapped to the GGUF tokenizer keys.
//! - [`pretokenizer`]: the pre-tokenizers by `tokenizer.ggml.pre` name (GGUF and HF share it).

pub mod gguf;
pub mod gguf_split;
pub mod gguf_write;
pub mod hf;
pub mod hf_tokenizer;
pub mod pretokenizer;
pub mod safetensors;

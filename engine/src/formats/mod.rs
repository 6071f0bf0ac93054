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
//! - [`hf_arch`]: the families of Hugging Face configs (Llama, Mistral, Qwen2/3, Gemma 2/3,
//!   Phi-3, SmolLM3) mapped to GGUF metadata and tensors as convert_hf_to_gguf maps them.
//! - [`hf_config`]: the `config.json` fields every family reads.
//! - [`hf_tokenizer`]: tokenizer.json + tokenizer_config.json mapped to the GGUF tokenizer keys.
//! - [`pretokenizer`]: the pre-tokenizers by `tokenizer.ggml.pre` name (GGUF and HF share it).
//! - (this file) the one `open` and tensor read for every format.

pub mod gguf;
pub mod gguf_split;
pub mod gguf_write;
pub mod hf;
pub mod hf_arch;
pub mod hf_config;
pub mod hf_tokenizer;
pub mod pretokenizer;
pub mod safetensors;

use std::path::Path;

use gguf::{GgufError, GgufFile, TensorInfo, TensorSource};

/// The one `open` for every format, and the one tensor read for every source: each format's
/// reader builds on the GGUF types, and only here are they put together.
impl GgufFile {
    /// Parses and validates the header of `path`. Tensor data is not read. A folder is opened
    /// as a Hugging Face model ([`hf::open_folder`]); the first part of a split model
    /// (`NAME-00001-of-0000N.gguf`) opens every part ([`gguf_split::join`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        if path.is_dir() {
            return hf::open_folder(path, hf_tokenizer::metadata)
                .map_err(|e| GgufError::Hf(Box::new(e)));
        }
        gguf_split::join(Self::open_single(path)?)
    }

    /// Reads the bytes of one tensor. The size was validated against
    /// the file in `open`.
    pub fn read_tensor(&self, info: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        if let TensorSource::Safetensors { path, start, edit } = &info.source {
            return hf::read_tensor(info, path, *start, edit)
                .map_err(|e| GgufError::Hf(Box::new(e)));
        }
        self.read_gguf_tensor(info)
    }
}

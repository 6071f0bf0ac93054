//! Model file formats: everything that reads or writes a model's bytes, each validated before
//! anything is sized from it. A GGUF file, a split GGUF set and a Hugging Face folder all open as
//! one [`gguf::GgufFile`] view (`GgufFile::open`).
//!
//! Modules:
//! - [`gguf`]: validating GGUF reader (metadata, tensor table, tensor bytes).
//! - [`gguf_split`]: split GGUF models (`NAME-00001-of-0000N.gguf`) opened as one.
//! - [`gguf_write`]: GGUF writer (every metadata type; tensors streamed at aligned offsets).
//! - [`safetensors`]: validating safetensors reader and streaming writer (F32/F16/BF16).
//! - [`hf`]: Hugging Face folders' files (config.json, tokenizer.json, safetensors shards) and
//!   their tensors' bytes; the mapping into a GGUF view is `model::hf_folder`'s, by family.
//! - [`hf_map`]: the pieces of convert_hf_to_gguf every family's mapping is built from.
//! - [`hf_config`]: the `config.json` fields every family reads.
//! - [`hf_tokenizer`]: tokenizer.json + tokenizer_config.json mapped to the GGUF tokenizer keys.
//! - [`pretokenizer`]: the pre-tokenizers by `tokenizer.ggml.pre` name (GGUF and HF share it).
//! - (this file) the one tensor read for every format, and the GGUF-only open.

pub mod gguf;
pub mod gguf_split;
pub mod gguf_write;
pub mod hf;
pub mod hf_config;
pub mod hf_map;
pub mod hf_tokenizer;
pub mod pretokenizer;
pub mod safetensors;

use std::path::Path;

use gguf::{GgufError, GgufFile, TensorInfo, TensorSource};

/// The one tensor read for every source: each format's reader builds on the GGUF types, and
/// only here are they put together. (The one `open`, `GgufFile::open`, is
/// `model::hf_folder`'s: a Hugging Face folder is mapped by its family.)
impl GgufFile {
    /// A GGUF file (not a folder), the parts of a split one joined.
    pub fn open_gguf(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        gguf_split::join(Self::open_single(path.as_ref())?)
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

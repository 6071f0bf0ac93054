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
//! - (this file) the one `open` and tensor read for every format, and [`weight_buffer`]: the
//!   zeroed buffers tensors are read into, asking Linux for transparent huge pages.

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

    /// Reads the bytes of one tensor (into a [`weight_buffer`]). The size was validated against
    /// the file in `open`.
    pub fn read_tensor(&self, info: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        if let TensorSource::Safetensors { path, start, edit } = &info.source {
            return hf::read_tensor(info, path, *start, edit)
                .map_err(|e| GgufError::Hf(Box::new(e)));
        }
        self.read_gguf_tensor(info)
    }
}

/// Huge pages are this size on x86-64 and most aarch64 kernels.
const HUGE_PAGE: usize = 2 << 20;

/// A zeroed buffer of `size` bytes for weights. On Linux the whole 2 MiB pages inside it are
/// marked `MADV_HUGEPAGE` before anything touches them (a large zeroed allocation is fresh,
/// untouched memory), so a kernel whose transparent huge pages are "madvise" (the common default)
/// backs them with 2 MiB pages: decode streams every weight once per token, and with 4 KiB pages
/// the hardware prefetchers stop at every page boundary and each page costs a TLB walk
/// (BENCHMARKS.md: about 10% of single-stream decode on the default model). A hint: where it is
/// refused, nothing changes.
pub fn weight_buffer(size: usize) -> Vec<u8> {
    let v = vec![0u8; size];
    #[cfg(target_os = "linux")]
    if size >= HUGE_PAGE {
        let start = v.as_ptr() as usize;
        let lo = start.next_multiple_of(HUGE_PAGE);
        let hi = (start + size) / HUGE_PAGE * HUGE_PAGE;
        if hi > lo {
            // SAFETY: [lo, hi) lies inside `v`'s allocation; MADV_HUGEPAGE only changes how the
            // kernel backs those pages, never their contents.
            let _ = unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
        }
    }
    v
}

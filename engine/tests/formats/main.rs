//! Model files and what reads, writes and quantizes them: one test binary (one link) for the
//! modules below, which share the support code declared here once.
//!
//! Modules:
//! - `gguf`: The GGUF reader against broken and hostile files: each is refused with an error that
//!   names the problem, without panicking and without allocating what the file merely claims
//! - `gguf_split`: Split GGUF models: the default model written as three parts the way
//!   llama.cpp's `gguf-split` lays them out (metadata in part 1
//! - `gguf_write`: The GGUF writer against our reader: every metadata value type, alignment, and
//!   the default model's own metadata and tensors read back unchanged
//! - `safetensors`: Hugging Face safetensors folders: malformed files refused with clear errors
//! - `recipe`: Every registered architecture's recipe on the recording device: the ops it issues
//!   are the family's graph as llama.cpp builds it (written out here from the ...
//! - `recipe_files`: Every architecture's recipe on a tiny file laid out as that family's real
//!   GGUF files are (`model::tiny`): the ops it issues are the family's graph as llama.cpp's ...
//! - `hf_cache`: The Hugging Face cache read in place: a cache laid out as `huggingface_hub` lays
//!   it out (refs/main, snapshots of links into blobs) is found by repo and quant, listed ...
//! - `library_index`: The library index on real folders: importing the default GGUF and a
//!   safetensors folder, refusing broken files (and a folder whose tensors are not its model) ...
//! - `quantize`: `quantize` on the real default model: the per-tensor types of every preset
//!   against what llama.cpp's `llama-quantize` picks (a committed reference, ...
//! - `precision`: Precision as a live knob on the real model: the engine re-quantizes its weights
//!   in memory while a request is in flight (which still ends with every token), the new ...
//! - `synthetic`: Synthetic weights: the known shapes, seeded determinism (whatever the thread
//!   count), every precision through one forward pass to finite logits, and clear errors for ...

#[path = "../support/split.rs"]
mod split;
#[path = "../support/temp_dir.rs"]
mod temp_dir;
#[allow(dead_code)] // each module uses part of it
#[path = "../support/tiny_model.rs"]
mod tiny_model;

mod gguf;
mod gguf_split;
mod gguf_write;
mod hf_cache;
mod library_index;
mod precision;
mod quantize;
mod recipe;
mod recipe_files;
mod safetensors;
mod synthetic;

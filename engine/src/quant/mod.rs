//! Converting a model's weights to another form on disk.
//!
//! Modules:
//! - [`quantize`]: re-quantizing a GGUF to another weight type (llama.cpp's per-tensor rules).
//! - [`hf_export`]: exporting a model to a Hugging Face safetensors folder (`tpslab export`).

pub mod hf_export;
pub mod quantize;

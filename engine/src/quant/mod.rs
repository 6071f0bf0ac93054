//! Converting a model's weights to another form on disk.
//!
//! Modules:
//! - [`preset`]: the presets (Q4_K_M, IQ4_XS, ...) and llama.cpp's per-tensor type rules.
//! - [`quantize`]: re-quantizing a GGUF to a preset: the plan, its size, the conversion.
//! - [`hf_export`]: exporting a model to a Hugging Face safetensors folder (`tpslab export`).

pub mod hf_export;
pub mod preset;
pub mod quantize;

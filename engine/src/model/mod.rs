//! A model: its configuration resolved from metadata, its weights, and its architecture's
//! recipe written once against the backend-ops seam. Nothing here knows a device; the devices
//! (`crate::device`) implement the seam and run the recipe.
//!
//! Modules:
//! - [`config`]: the typed configuration a file's metadata resolves to, and its key reader.
//! - [`hf_folder`]: a Hugging Face folder as a GGUF view, mapped by its family, and
//!   `GgufFile::open`, the one open for every format.
//! - [`weights`]: [`weights::Linear`] dense or quantized, the weight set, the tensor loaders.
//! - [`arena`]: where a loaded model's weight bytes live (one arena on huge pages per model).
//! - [`weight_bytes`]: a matrix's bytes, alone or its slice of the arena.
//! - [`ops`]: the backend-ops seam ([`ops::Ops`]) a recipe runs on.
//! - [`pooling`]: embeddings: a prompt's final hidden states pooled into one vector.
//! - [`arch`]: the registry of families, each one module (its architectures, quirks, loader,
//!   known shapes and recipe), and the resolver of a file's configuration.
//! - [`record`]: the recording device (a test double) that lists the ops a recipe runs.
//! - [`loaded`]: the model bundle (model, tokenizer, chat template, precision) front ends hold.
//! - [`precision`]: a model's weight precision, typed (its matrices' type and any fallback).
//! - [`synthetic`]: models of known shapes with seeded random weights (vLLM's "dummy" format).
//! - [`tiny`]: tiny random models of each architecture as GGUF files laid out as the family's
//!   real ones, with a real tokenizer: what the engine is held against llama.cpp with.

use std::path::Path;

use crate::formats::gguf::{GgufError, GgufFile};

pub mod arch;
pub mod arena;
pub mod config;
pub mod hf_folder;
pub mod loaded;
pub mod ops;
pub mod pooling;
pub mod precision;
pub mod record;
pub mod synthetic;
pub mod tiny;
pub mod weight_bytes;
pub mod weights;

use config::{ConfigError, ModelConfig};
pub use loaded::LoadedModel;
use weights::{WeightError, Weights};

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Weights(#[from] WeightError),
}

pub struct Model {
    pub cfg: ModelConfig,
    pub weights: Weights,
}

impl Model {
    pub fn load(path: &Path) -> Result<(Self, GgufFile), ModelError> {
        let file = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&file)?;
        let model = Self::from_file(&file, cfg)?;
        Ok((model, file))
    }

    /// The model of an already opened file whose configuration was resolved.
    pub fn from_file(file: &GgufFile, cfg: ModelConfig) -> Result<Self, ModelError> {
        let weights = arch::load(file, &cfg)?;
        Ok(Self { cfg, weights })
    }
}

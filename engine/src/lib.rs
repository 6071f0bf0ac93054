//! TPS Lab engine: everything that runs a model, with no UI. Folders by role, each opening with
//! a doc that names its modules; lower ones never import higher ones.
//!
//! Modules:
//! - [`formats`]: GGUF (single and split), safetensors and Hugging Face folders, read and written.
//! - [`text`]: tokenizer, incremental detokenizer, chat templates and their render budgets.
//! - [`model`]: configuration, weights, the backend-ops seam, each architecture's recipe,
//!   precision, synthetic models.
//! - [`kv`]: paged KV storage, the batch the forward pass reads it through, the block pool.
//! - [`device`]: the devices that run a recipe (CPU, CUDA) behind the engine's `Backend` seam.
//! - [`sched`]: the continuous-batching scheduler and the stop rules it asks.
//! - [`spec`]: speculative decoding's proposers (n-gram, draft model, self-drafting) and knobs.
//! - [`quant`]: re-quantizing a GGUF and exporting a Hugging Face folder.
//! - [`library`]: the model library folder, its index, and fetching the default model.
//! - [`plan`]: the capacity planner (a calibrated roofline of this engine's steps per device).
//! - [`serving`]: the engine thread, requests and admission, sampling, generation, metrics, the
//!   load generator, perplexity, the live precision knob.
//! - [`tune`]: the SLO tuner (successive halving of measured runs over the engine's knobs).

/// Serializes a type as its `Display` label and reads it back through its `FromStr`: the one
/// way saved records and reports write the engine's named types (weight types, presets,
/// precisions).
macro_rules! serde_as_label {
    ($t:ty) => {
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_str(self)
            }
        }

        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let label = <String as serde::Deserialize>::deserialize(d)?;
                label.parse().map_err(serde::de::Error::custom)
            }
        }
    };
}

pub mod device;
pub mod formats;
pub mod kv;
pub mod library;
pub mod model;
pub mod plan;
pub mod quant;
pub mod sched;
pub mod serving;
pub mod spec;
pub mod text;
pub mod tune;

//! The architectures the engine runs, each written once against the backend-ops seam
//! ([`crate::model::ops::Ops`]) as a layer recipe, the way llama.cpp's `src/models/*.cpp` graph
//! builders describe each family (done eagerly here, op by op).
//!
//! Modules:
//! - [`llama`]: the Llama family (Llama 2/3, Mistral, SmolLM 1-3, Qwen2, Qwen3, Phi-3): pre-norm
//!   blocks of grouped-query attention with RoPE and a SwiGLU FFN, with each member's additions.
//! - [`gemma`]: Gemma 2 and 3: scaled embeddings, sandwich norms, GELU gating, local and global
//!   layers, soft-capping.
//! - [`gptoss`]: gpt-oss: biased attention with sinks, alternating sliding-window layers, YaRN,
//!   and biased experts gated by OpenAI's clamped SwiGLU.
//!
//! Adding an architecture is one file with its `load` (tensors by GGUF name) and `forward`
//! (the recipe), plus its registration: its entries in [`ARCHS`] and a [`Family`] variant (both
//! kept with the configuration, `model::config`, which resolves a file's architecture, and
//! re-exported here) dispatched below.

use crate::formats::gguf::GgufFile;
use crate::model::config::ModelConfig;
pub use crate::model::config::{ARCHS, Arch, Family, lookup, names};
use crate::model::ops::Ops;
use crate::model::weights::{WeightError, Weights};

pub mod gemma;
pub mod gptoss;
pub mod llama;

/// Runs the model's recipe over `file`'s headers alone: every tensor it needs found, with its
/// shape and a type the kernels run, and no data read. What `models import` asks of a model
/// before it enters the library; a file that passes can fail to load only by its data
/// (truncated, unreadable).
pub fn probe(file: &GgufFile, cfg: &ModelConfig) -> Result<(), WeightError> {
    let _probing = crate::model::weights::Probing::start();
    recipe(file, cfg).map(drop)
}

/// The weights of `cfg`'s architecture from `file`, in one arena ([`Weights::into_arena`]).
pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    Ok(recipe(file, cfg)?.into_arena())
}

/// The family's loader: each weight as its own buffer.
fn recipe(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    match cfg.family {
        Family::Llama => llama::load(file, cfg),
        Family::Gemma => gemma::load(file, cfg),
        Family::GptOss => gptoss::load(file, cfg),
    }
}

/// One forward step of `cfg`'s architecture on device `o`: every token of the step through
/// every layer, then the logits of the rows that want them.
pub fn forward<O: Ops>(
    cfg: &ModelConfig,
    w: &Weights<O::Matrix, O::Vector>,
    o: &mut O,
) -> Result<(), O::Error> {
    match cfg.family {
        Family::Llama => llama::forward(cfg, w, o),
        Family::Gemma => gemma::forward(cfg, w, o),
        Family::GptOss => gptoss::forward(cfg, w, o),
    }
}

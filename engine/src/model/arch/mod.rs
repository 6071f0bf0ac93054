//! The architectures the engine runs, each written once against the backend-ops seam
//! ([`crate::model::ops::Ops`]) as a layer recipe, the way llama.cpp's `src/models/*.cpp` graph
//! builders describe each family (done eagerly here, op by op).
//!
//! Modules:
//! - [`llama`]: the Llama family (Llama, Mistral, SmolLM, Qwen2): pre-norm blocks of grouped-query
//!   attention with RoPE and a SwiGLU FFN.
//!
//! Adding an architecture is one file with its `load` (tensors by GGUF name) and `forward`
//! (the recipe), plus its entries in [`ARCHS`] and a [`Family`] variant dispatched below.

use crate::formats::gguf::GgufFile;
use crate::model::config::{ModelConfig, RopeStyle};
use crate::model::ops::Ops;
use crate::model::weights::{WeightError, Weights};

pub mod llama;

/// A recipe: the graph one or more GGUF architectures share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
}

/// What the engine knows of a GGUF `general.architecture` it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arch {
    /// The GGUF name ("llama"), which also prefixes its metadata keys.
    pub name: &'static str,
    pub family: Family,
    pub rope_style: RopeStyle,
}

/// Every architecture the engine runs, by GGUF name.
pub const ARCHS: &[Arch] = &[
    Arch {
        name: "llama",
        family: Family::Llama,
        rope_style: RopeStyle::Interleaved,
    },
    Arch {
        name: "mistral",
        family: Family::Llama,
        rope_style: RopeStyle::Interleaved,
    },
    Arch {
        name: "smollm",
        family: Family::Llama,
        rope_style: RopeStyle::Interleaved,
    },
    Arch {
        name: "qwen2",
        family: Family::Llama,
        rope_style: RopeStyle::Neox,
    },
];

/// The architecture of a GGUF `general.architecture`, if the engine runs it (the library's
/// import check asks this too, so a model it admits is one that loads).
pub fn lookup(name: &str) -> Option<&'static Arch> {
    ARCHS.iter().find(|a| a.name == name)
}

/// The names of [`ARCHS`], for messages ("llama, mistral, ...").
pub fn names() -> String {
    ARCHS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

/// The weights of `cfg`'s architecture from `file`.
pub fn load(file: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
    match cfg.family {
        Family::Llama => llama::load(file, cfg),
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
    }
}

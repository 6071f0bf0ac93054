//! SmolLM3: the Llama block with RoPE left out of every fourth layer (its NoPE layers).

use crate::formats::gguf::GgufFile;
use crate::model::arch::family::{FamilyDef, GgufArch};
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};
use crate::model::weights::{WeightError, Weights};

pub use crate::model::arch::llama::block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[GgufArch {
            name: "smollm3",
            rope_style: RopeStyle::Interleaved,
        }]
    }

    fn load(&self, f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
        crate::model::arch::llama::block::load(f, cfg)
    }

    fn extras(
        &self,
        _: &Keys<'_>,
        _: &ModelConfig,
        _window: usize,
        e: &mut Extras,
    ) -> Result<(), ConfigError> {
        e.no_rope_every = Some(4);
        Ok(())
    }
}

//! Phi-3: the Llama block over fused `attn_qkv` and gate-up tensors (read fused), NeoX-style
//! RoPE with LongRoPE's per-dimension factors, and no sliding window (llama.cpp leaves it off;
//! Phi-3's files set it wrongly).

use crate::formats::gguf::GgufFile;
use crate::model::arch::family::{FamilyDef, GgufArch};
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};
use crate::model::weights::{WeightError, Weights};

pub use crate::model::arch::llama::block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[GgufArch {
            name: "phi3",
            rope_style: RopeStyle::Neox,
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
        _: &mut Extras,
    ) -> Result<(), ConfigError> {
        Ok(())
    }
}

//! The Gemma family, Gemma 2 and 3: its own recipe ([`block`]) over the sandwich norms, and
//! what it resolves from its metadata: the embedding scale, local (sliding-window) and global
//! layers with their own RoPE base, soft-caps (Gemma 2's defaults, Gemma 3's only where its
//! file sets one), and the 27B models' query scale.
//!
//! Modules: this file, the family's facts; [`block`], its recipe and loader.

use crate::formats::gguf::GgufFile;
use crate::model::arch::family::{FamilyDef, GgufArch};
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};
use crate::model::weights::{WeightError, Weights};

pub mod block;

pub use block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[
            GgufArch {
                name: "gemma2",
                rope_style: RopeStyle::Neox,
            },
            GgufArch {
                name: "gemma3",
                rope_style: RopeStyle::Neox,
            },
        ]
    }

    fn load(&self, f: &GgufFile, cfg: &ModelConfig) -> Result<Weights, WeightError> {
        block::load(f, cfg)
    }

    /// llama.cpp's `load_arch_hparams` for `gemma2` and `gemma3`.
    fn extras(
        &self,
        k: &Keys<'_>,
        c: &ModelConfig,
        window: usize,
        e: &mut Extras,
    ) -> Result<(), ConfigError> {
        let gemma2 = k.arch == "gemma2";
        if gemma2 {
            e.window = Some(if window > 0 { window } else { 4096 });
            e.swa_layers = k.swa_pattern(c.n_layers, 2)?;
            e.attn_softcap = Some(k.float_or("attn_logit_softcapping", 50.0, false)?);
            e.final_softcap = Some(k.float_or("final_logit_softcapping", 30.0, false)?);
        } else {
            if window > 0 {
                e.window = Some(window);
                e.swa_layers = k.swa_pattern(c.n_layers, 6)?;
            }
            let cap = k.float_or("final_logit_softcapping", 0.0, true)?;
            e.final_softcap = (cap > 0.0).then_some(cap);
        }
        // Gemma 2's local layers share the global base unless the file says otherwise; Gemma
        // 3's default to 10 000 (llama.cpp's `rope_freq_base_train_swa`).
        let swa_default = if gemma2 { c.rope_theta } else { 10_000.0 };
        e.rope_theta_swa = k.float_or("rope.freq_base_swa", swa_default, false)?;
        e.embed_scale = Some((c.hidden as f32).sqrt());
        // The 27B models (46 and 62 layers) scale queries by hidden / heads, not the head size.
        if matches!((k.arch, c.n_layers), ("gemma2", 46) | ("gemma3", 62)) {
            e.attn_scale = 1.0 / ((c.hidden / c.n_heads) as f32).sqrt();
        }
        Ok(())
    }
}

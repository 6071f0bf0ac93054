//! SmolLM3: the Llama block with RoPE left out of every fourth layer (its NoPE layers).

use serde_json::{Map, Value as Json};

use crate::formats::hf_config::HfConfig;
use crate::formats::hf_map::{Bad, Change, Md, Shape, default_theta};
use crate::model::arch::family::{FamilyDef, GgufArch, HfClass, HfInput, TinySpec};
use crate::model::arch::llama::hf as llama_hf;
use crate::model::config::{ConfigError, Extras, Keys, ModelConfig, RopeStyle};

pub use crate::model::arch::llama::block::forward;

pub struct Def;

impl FamilyDef for Def {
    fn gguf_archs(&self) -> &'static [GgufArch] {
        &[GgufArch {
            name: "smollm3",
            rope_style: RopeStyle::Interleaved,
        }]
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

    fn hf_classes(&self) -> &'static [HfClass] {
        &[HfClass {
            class: "SmolLM3ForCausalLM",
            model_types: &["smollm3"],
            gguf_arch: "smollm3",
        }]
    }

    /// transformers' `SmolLM3Config`: a RoPE base of 2 000 000.
    fn hf_defaults(&self, _: &HfClass, _: &mut HfConfig, j: &mut Map<String, Json>) {
        default_theta(j, 2_000_000.0);
    }

    fn hf_metadata(&self, _: &HfClass, md: &mut Md, x: &HfInput<'_>) -> Result<(), Bad> {
        llama_hf::llama_model_keys(md, x)?;
        check_no_rope(x.j, x.cfg.num_hidden_layers)
    }

    fn hf_computed(&self, _: &HfClass, x: &HfInput<'_>) -> Result<Vec<(String, Vec<f32>)>, Bad> {
        llama_hf::llama3_tensors(x)
    }

    fn hf_change(&self, _: &HfClass, name: &str, s: &Shape) -> Change {
        llama_hf::permute(name, s)
    }

    /// Four layers, so one goes without RoPE.
    fn tiny(&self) -> &'static [TinySpec] {
        &[TinySpec {
            variant: "smollm3",
            reference_vocab: Some("llama-bpe"),
            arch: "smollm3",
            layers: 4,
            ..TinySpec::PLAIN
        }]
    }
}

/// SmolLM3's `no_rope_layers` (1: the layer rotates): llama.cpp, and so the engine, leave out
/// RoPE on every 4th layer, so a config that says otherwise is refused, not run wrongly.
fn check_no_rope(j: &Map<String, Json>, layers: u64) -> Result<(), Bad> {
    let Some(v) = j.get("no_rope_layers").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let want: Vec<u64> = (0..layers).map(|i| u64::from((i + 1) % 4 != 0)).collect();
    let got: Option<Vec<u64>> = v
        .as_array()
        .map(|a| a.iter().filter_map(Json::as_u64).collect());
    if got.as_ref() != Some(&want) {
        return Err(format!(
            "no_rope_layers {v} is not the pattern llama.cpp runs (RoPE left out of every 4th \
             layer: {want:?})"
        ));
    }
    Ok(())
}

//! The `config.json` of a Hugging Face folder, as far as every family reads it (a leaf module:
//! the folder reader, the family mapping and the tokenizer import all read it).

use serde::Deserialize;
use serde_json::Value as Json;

/// The `config.json` fields every family uses (serde mirror; the text model's own fields when
/// they sit under `text_config`). Family-specific fields are read from the whole object
/// (each family's mapping in `model::arch`).
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    pub model_type: Option<String>,
    #[serde(default)]
    pub architectures: Vec<String>,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: Option<u64>,
    pub num_key_value_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub max_position_embeddings: Option<u64>,
    pub vocab_size: u64,
    pub rms_norm_eps: Option<f64>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<Json>,
    pub eos_token_id: Option<Json>,
}

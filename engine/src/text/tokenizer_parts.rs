//! A tokenizer's parts as a GGUF file's `tokenizer.ggml.*` metadata gives them ([`Parts`]), read
//! and checked before [`crate::text::tokenizer::Tokenizer`] builds anything from them: the model
//! kind, the token strings, types, scores and merges, the special ids (llama.cpp's defaults where
//! keys are missing) and the flags, and a whole `tokenizer.json` where the metadata carries one.

use crate::formats::gguf::{GgufFile, Value};
use crate::formats::hf::MAX_TOKENIZER_JSON;
use crate::formats::pretokenizer::PreTokenizerSpec;
use crate::text::tokenizer_error::TokenizerError;
use crate::text::vocab::{SpecialIds, VocabKind};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
const KEY_NAME: &str = "general.name";
pub use crate::formats::hf_tokenizer::KEY_HF_JSON;

/// Everything read from the metadata, before the build.
pub(super) struct Parts {
    pub(super) kind: VocabKind,
    pub(super) tokens: Vec<String>,
    pub(super) types: Vec<u64>,
    pub(super) scores: Vec<f32>,
    pub(super) merges: Vec<String>,
    /// A whole `tokenizer.json`, whose pipeline then encodes (`text::hf_model`).
    pub(super) hf: Option<String>,
    pub(super) pre: Option<PreTokenizerSpec>,
    pub(super) special: SpecialIds,
    pub(super) extra_stop: Vec<u32>,
    pub(super) add_bos: bool,
    pub(super) add_eos: bool,
    pub(super) add_space_prefix: bool,
    pub(super) clean_spaces: bool,
    pub(super) general_name: Option<String>,
}

pub(super) fn bad(msg: String) -> TokenizerError {
    TokenizerError::BadMetadata(msg)
}

fn optional_u32(gguf: &GgufFile, key: &str) -> Result<Option<u32>, TokenizerError> {
    match gguf.get(key) {
        None => Ok(None),
        Some(v) => {
            let n = v
                .as_u64()
                .ok_or_else(|| bad(format!("'{key}' is not an unsigned integer")))?;
            u32::try_from(n)
                .map(Some)
                .map_err(|_| bad(format!("'{key}' = {n} is too large")))
        }
    }
}

fn optional_bool(gguf: &GgufFile, key: &str) -> Result<Option<bool>, TokenizerError> {
    match gguf.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(bad(format!("'{key}' is not a bool"))),
    }
}

/// A numeric array key (token types, scores), each entry through `f`.
fn optional_array<T>(
    gguf: &GgufFile,
    key: &str,
    f: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Vec<T>>, TokenizerError> {
    let Some(v) = gguf.get(key) else {
        return Ok(None);
    };
    let arr = v
        .as_array()
        .ok_or_else(|| bad(format!("'{key}' is not an array")))?;
    arr.iter()
        .map(|x| f(x).ok_or_else(|| bad(format!("'{key}' holds a non-number"))))
        .collect::<Result<Vec<T>, _>>()
        .map(Some)
}

/// The special ids the file names. EOS and BOS outside the vocabulary are refused (a file that
/// says so is broken); the others are dropped, as llama.cpp drops them.
fn special_ids(gguf: &GgufFile, kind: VocabKind, n: usize) -> Result<SpecialIds, TokenizerError> {
    let key = |k: &str| optional_u32(gguf, &format!("tokenizer.ggml.{k}"));
    let inside = |id: Option<u32>| id.filter(|&id| (id as usize) < n);
    let (bos, eos) = (key("bos_token_id")?, key("eos_token_id")?);
    for (name, id) in [("bos", bos), ("eos", eos)] {
        if let Some(id) = id.filter(|&id| id as usize >= n) {
            return Err(bad(format!(
                "{name} token id {id} is outside the vocabulary of {n} tokens"
            )));
        }
    }
    // SentencePiece defaults (<unk> 0, <s> 1, </s> 2) where the keys are missing, as llama.cpp.
    // llama.cpp's BPE default of 11 for both is left out: 11 is an ordinary word piece ("," in
    // GPT-2), and stopping on it would cut every answer at its first comma.
    let default = |id: u32| inside(Some(id)).filter(|_| kind == VocabKind::Spm);
    Ok(SpecialIds {
        bos: bos.or(default(1)),
        eos: eos.or(default(2)),
        unk: inside(key("unknown_token_id")?).or(default(0)),
        eot: inside(key("eot_token_id")?),
        eom: inside(key("eom_token_id")?),
        fim_pre: inside(key("fim_pre_token_id")?.or(key("prefix_token_id")?)),
        fim_suf: inside(key("fim_suf_token_id")?.or(key("suffix_token_id")?)),
        fim_mid: inside(key("fim_mid_token_id")?.or(key("middle_token_id")?)),
        fim_pad: inside(key("fim_pad_token_id")?),
        fim_rep: inside(key("fim_rep_token_id")?),
        fim_sep: inside(key("fim_sep_token_id")?),
    })
}

impl Parts {
    pub(super) fn from_gguf(gguf: &GgufFile) -> Result<Self, TokenizerError> {
        let kind = match gguf.get_str(KEY_MODEL)? {
            "gpt2" => VocabKind::Bpe,
            "llama" => VocabKind::Spm,
            other => return Err(TokenizerError::UnsupportedModel(other.to_string())),
        };
        let pre = match kind {
            VocabKind::Spm => None,
            VocabKind::Bpe => {
                let name = match gguf.get(KEY_PRE) {
                    None => None,
                    Some(v) => Some(
                        v.as_str()
                            .ok_or_else(|| bad(format!("'{KEY_PRE}' is not a string")))?,
                    ),
                };
                Some(PreTokenizerSpec::from_gguf_name(name)?)
            }
        };
        let tokens: Vec<String> = gguf
            .get_str_array(KEY_TOKENS)?
            .into_iter()
            .map(str::to_string)
            .collect();
        let n = tokens.len();
        let types = optional_array(gguf, KEY_TYPES, Value::as_u64)?.unwrap_or_else(|| vec![1; n]);
        let scores =
            optional_array(gguf, KEY_SCORES, |v| v.as_f64().map(|f| f as f32))?.unwrap_or_default();
        if !scores.is_empty() && scores.len() < n {
            return Err(bad(format!(
                "{KEY_SCORES} has {} entries for {n} tokens",
                scores.len()
            )));
        }
        let merges = match gguf.get(KEY_MERGES) {
            None => Vec::new(),
            Some(_) => gguf
                .get_str_array(KEY_MERGES)?
                .into_iter()
                .map(str::to_string)
                .collect(),
        };
        let hf = match gguf.get(KEY_HF_JSON) {
            None => None,
            Some(v) => {
                let json = v
                    .as_str()
                    .ok_or_else(|| bad(format!("'{KEY_HF_JSON}' is not a string")))?;
                if json.len() as u64 > MAX_TOKENIZER_JSON {
                    return Err(bad(format!(
                        "'{KEY_HF_JSON}' is {} bytes, past the {MAX_TOKENIZER_JSON}-byte budget \
                         for a tokenizer",
                        json.len()
                    )));
                }
                Some(json.to_string())
            }
        };
        let spm = kind == VocabKind::Spm;
        Ok(Self {
            kind,
            special: special_ids(gguf, kind, n)?,
            extra_stop: Vec::new(),
            add_bos: optional_bool(gguf, KEY_ADD_BOS)?
                .unwrap_or(spm || pre.is_some_and(|p| p.add_bos)),
            add_eos: optional_bool(gguf, KEY_ADD_EOS)?.unwrap_or(false),
            add_space_prefix: optional_bool(gguf, KEY_ADD_PREFIX)?.unwrap_or(spm),
            clean_spaces: pre.is_some_and(|p| p.clean_spaces),
            general_name: gguf
                .get(KEY_NAME)
                .and_then(Value::as_str)
                .map(str::to_string),
            tokens,
            types,
            scores,
            merges,
            hf,
            pre,
        })
    }

    /// Sizes and ids that must agree before anything is built.
    pub(super) fn validate(&mut self) -> Result<(), TokenizerError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(bad("the vocabulary is empty".into()));
        }
        if u32::try_from(n).is_err() {
            return Err(bad(format!("{n} tokens is too many")));
        }
        if self.types.len() < n || (self.types.len() > n && self.kind == VocabKind::Bpe) {
            return Err(bad(format!(
                "{KEY_TOKENS} has {n} entries but {KEY_TYPES} has {}",
                self.types.len()
            )));
        }
        self.types.truncate(n);
        self.scores.truncate(n);
        let s = &self.special;
        for (key, id) in [("bos", s.bos), ("eos", s.eos)] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(bad(format!(
                    "{key} token id {id} is outside the vocabulary of {n} tokens"
                )));
            }
        }
        self.extra_stop.retain(|&id| (id as usize) < n);
        Ok(())
    }
}

//! The pre-tokenizers (how text is split into words before BPE) by llama.cpp's
//! `tokenizer.ggml.pre` name, built as Hugging Face `tokenizers` pre-tokenizers: the one table
//! both the GGUF tokenizer (`text::tokenizer`) and a Hugging Face folder's `tokenizer.json`
//! mapping ([`crate::formats::hf_tokenizer`]) read.

use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior};

/// A pre-tokenizer this engine does not run, or one whose regex does not build.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreTokenizerError {
    #[error("unsupported pre-tokenizer type '{0}'")]
    Unsupported(String),
    #[error("pre-tokenizer regex: {0}")]
    Regex(String),
}

/// Llama 3's split (from its tokenizer.json; digits in groups of up to three).
const LLAMA3_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen2's split: as Llama 3 but single digits.
const QWEN2_REGEX: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How text is split into words before BPE, by llama.cpp's `tokenizer.ggml.pre` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2's regex (also used when the key is missing or says "default").
    Gpt2,
    /// GPT-2's regex after splitting every digit apart (SmolLM, StarCoder).
    Gpt2Digits,
    /// Llama 3 (also ignores merges for words that are whole vocabulary entries).
    Llama3,
    /// Qwen2.
    Qwen2,
}

impl PreTokenizerKind {
    /// Maps a `tokenizer.ggml.pre` value; unknown names are refused rather than guessed, because
    /// a wrong split silently changes token ids and degrades the model.
    pub fn from_gguf_name(name: Option<&str>) -> Result<Self, PreTokenizerError> {
        Ok(match name {
            // llama.cpp's own "default" regex is a legacy oddity; HF's GPT-2 split is what the
            // GPT-2 family was trained with, so missing/"default" use that.
            None | Some("gpt2" | "default" | "mpt" | "olmo") => Self::Gpt2,
            Some("smollm" | "starcoder" | "refact" | "codeshell") => Self::Gpt2Digits,
            Some("llama3" | "llama-bpe" | "llama-v3") => Self::Llama3,
            Some("qwen2" | "stablelm2") => Self::Qwen2,
            Some(other) => return Err(PreTokenizerError::Unsupported(other.to_string())),
        })
    }

    pub(crate) fn build(self) -> Result<PreTokenizerWrapper, PreTokenizerError> {
        let split = |re: &str| {
            Split::new(
                SplitPattern::Regex(re.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| PreTokenizerError::Regex(e.to_string()))
        };
        Ok(match self {
            Self::Gpt2 => ByteLevel::new(false, true, true).into(),
            Self::Gpt2Digits => Sequence::new(vec![
                Digits::new(true).into(),
                ByteLevel::new(false, true, true).into(),
            ])
            .into(),
            Self::Llama3 => Sequence::new(vec![
                split(LLAMA3_REGEX)?.into(),
                ByteLevel::new(false, true, false).into(),
            ])
            .into(),
            Self::Qwen2 => Sequence::new(vec![
                split(QWEN2_REGEX)?.into(),
                ByteLevel::new(false, false, false).into(),
            ])
            .into(),
        })
    }
}

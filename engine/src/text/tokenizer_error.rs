//! Why a tokenizer could not be built or used (its own module, so the tokenizer's parts can
//! name it without importing the tokenizer that imports them).

use crate::formats::gguf::GgufError;
use crate::formats::pretokenizer::{PreTokenizerError, SUPPORTED_NAMES};

impl From<PreTokenizerError> for TokenizerError {
    fn from(e: PreTokenizerError) -> Self {
        match e {
            PreTokenizerError::Unsupported(name) => Self::UnsupportedPre(name),
            PreTokenizerError::Regex(e) => Self::Build(format!("pre-tokenizer regex: {e}")),
        }
    }
}

/// Why a tokenizer could not be built or used.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("tokenizer metadata: {0}")]
    Metadata(#[from] GgufError),
    #[error(
        "unsupported tokenizer model '{0}': supported are 'gpt2' (byte-level BPE) and 'llama' \
         (SentencePiece)"
    )]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer type '{0}' (supported: {SUPPORTED_NAMES})")]
    UnsupportedPre(String),
    #[error("bad tokenizer metadata: {0}")]
    BadMetadata(String),
    #[error("cannot build the tokenizer: {0}")]
    Build(String),
    #[error("cannot encode text: {0}")]
    Encode(String),
    #[error("token id {id} is out of range (the vocabulary has {vocab_size} tokens)")]
    UnknownId { id: u32, vocab_size: usize },
}

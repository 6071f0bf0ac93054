//! GPT-2 style byte-level BPE over the Hugging Face `tokenizers` crate: the pipelines a BPE
//! [`crate::text::tokenizer::Tokenizer`] runs (pre-tokenizer + merges), and the byte-level
//! alphabet that maps vocabulary characters back to bytes.
//!
//! Special tokens are cut out of the text before these pipelines see it
//! ([`crate::text::special`]), as llama.cpp does, so the pipeline that encodes has none; a second
//! one carries them as added tokens only for what a Hugging Face `tokenizer.json` must hold.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, BpeTrainer, Vocab as BpeVocab};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, Token, TokenizerImpl,
};

use crate::formats::pretokenizer::PreTokenizerKind;
use crate::text::tokenizer_error::TokenizerError;
use crate::text::vocab::{Vocab, attr};

/// The BPE model (vocabulary, merges, word cache) behind both pipelines: one copy in memory,
/// read-only (its word cache takes its own lock with `try_*` calls, so it never makes an encode
/// wait).
#[derive(Clone)]
struct SharedBpe(Arc<BPE>);

impl Model for SharedBpe {
    type Trainer = BpeTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        self.0.tokenize(sequence)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }

    fn get_vocab(&self) -> std::collections::HashMap<String, u32> {
        self.0.get_vocab()
    }

    fn get_vocab_size(&self) -> usize {
        self.0.get_vocab_size()
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.0.save(folder, prefix)
    }

    fn get_trainer(&self) -> BpeTrainer {
        self.0.get_trainer()
    }
}

impl serde::Serialize for SharedBpe {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(&*self.0, s)
    }
}

/// A Hugging Face tokenizer pipeline over the shared BPE model.
type HfTokenizer = TokenizerImpl<
    SharedBpe,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// The two pipelines of a BPE tokenizer. Both immutable after the build, so no encode ever
/// waits on another.
pub(crate) struct BpePipelines {
    /// Pre-tokenizer and merges only: what each raw text fragment goes through.
    raw: HfTokenizer,
    /// The same with control and user-defined tokens added, as `tokenizer.json` holds them.
    full: HfTokenizer,
}

impl BpePipelines {
    pub fn new(
        vocab: &Vocab,
        merges: &[String],
        pre: PreTokenizerKind,
        ignore_merges: bool,
    ) -> Result<Self, TokenizerError> {
        let mut bpe_vocab = BpeVocab::with_capacity(vocab.len());
        for (text, &id) in &vocab.ids {
            bpe_vocab.insert(text.clone(), id);
        }
        let mut merge_pairs = Vec::with_capacity(merges.len());
        for (i, m) in merges.iter().enumerate() {
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                TokenizerError::BadMetadata(format!(
                    "merge #{i} '{m}' is not two tokens separated by a space"
                ))
            })?;
            merge_pairs.push((a.to_string(), b.to_string()));
        }
        let bpe = BPE::builder()
            .vocab_and_merges(bpe_vocab, merge_pairs)
            .ignore_merges(ignore_merges)
            .build()
            .map_err(|e| TokenizerError::Build(format!("BPE model: {e}")))?;
        let bpe = SharedBpe(Arc::new(bpe));
        let pipeline = |bpe: SharedBpe| -> Result<HfTokenizer, TokenizerError> {
            let mut hf = HfTokenizer::new(bpe);
            hf.with_pre_tokenizer(Some(pre.build()?));
            hf.with_decoder(Some(ByteLevelDecoder::default()));
            Ok(hf)
        };
        let raw = pipeline(bpe.clone())?;
        let mut full = pipeline(bpe)?;
        let mut special_added = Vec::new();
        let mut user_added = Vec::new();
        for (text, &a) in vocab.texts.iter().zip(&vocab.attrs) {
            if a & (attr::CONTROL | attr::UNKNOWN) != 0 {
                special_added.push(AddedToken::from(text.clone(), true));
            } else if a & attr::USER_DEFINED != 0 {
                user_added.push(AddedToken::from(text.clone(), false));
            }
        }
        full.add_special_tokens(&special_added);
        full.add_tokens(&user_added);
        Ok(Self { raw, full })
    }

    /// One raw text fragment (no special tokens in it) to ids, appended to `out`.
    pub fn encode_fragment(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let enc = self
            .raw
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// Decodes with the Hugging Face pipeline (kept to hold our decode against it).
    pub fn decode_hf(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.full
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The pipeline with its added tokens as `tokenizer.json`.
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.full
            .to_string(true)
            .map_err(|e| TokenizerError::Build(format!("cannot serialize: {e}")))
    }
}

/// GPT-2's byte <-> printable-char mapping, inverted: the byte a vocabulary char stands for.
/// Bytes that are printable in Latin-1 map to themselves; the other 68 are shifted to U+0100...
const fn byte_level_inverse() -> [i16; 324] {
    let mut table = [-1i16; 324];
    let mut shifted = 0usize;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
        if printable {
            table[b] = b as i16;
        } else {
            table[256 + shifted] = b as i16;
            shifted += 1;
        }
        b += 1;
    }
    table
}

static BYTE_OF_CHAR: [i16; 324] = byte_level_inverse();

/// A token string's bytes, by the rule Hugging Face's ByteLevel decoder applies: if every char is
/// in the byte-level alphabet, the bytes they stand for; otherwise the string's own UTF-8 bytes.
pub(crate) fn byte_level_bytes(token: &str, out: &mut Vec<u8>) {
    let start = out.len();
    for c in token.chars() {
        match BYTE_OF_CHAR.get(c as usize).copied() {
            Some(b) if b >= 0 => out.push(b as u8),
            _ => {
                out.truncate(start);
                out.extend_from_slice(token.as_bytes());
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_is_a_bijection() {
        let mut seen = [false; 256];
        for &b in BYTE_OF_CHAR.iter().filter(|&&b| b >= 0) {
            assert!(!seen[b as usize], "byte {b} mapped twice");
            seen[b as usize] = true;
        }
        assert!(seen.iter().all(|&s| s));
        // Space is 'Ġ' (U+0120) and newline 'Ċ' (U+010A) in GPT-2 vocabularies.
        assert_eq!(BYTE_OF_CHAR['Ġ' as usize], 32);
        assert_eq!(BYTE_OF_CHAR['Ċ' as usize], 10);
    }
}

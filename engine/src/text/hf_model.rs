//! The second way a [`crate::text::tokenizer::Tokenizer`] turns text into ids: a Hugging Face
//! `tokenizer.json` run by the `tokenizers` crate, for the folders whose tokenizer is not the
//! byte-level BPE the engine implements itself (SentencePiece-style byte-fallback BPE of
//! Llama 2, Mistral, Gemma and Phi-3; Unigram). Only encoding goes through it: decoding stays the
//! engine's, token by token from each token's bytes (`▁` as a space, `<0xXX>` as its byte),
//! because streaming, stop strings, grammar constraints and logprobs all work on a token's bytes.
//!
//! Why a backend and not a conversion into the engine's SentencePiece: the file's normalizer,
//! pre-tokenizer and model (BPE merges with byte fallback, Unigram's Viterbi, Metaspace's
//! "first" against Llama 2's `Prepend` normalizer, added tokens and their strip flags) decide the
//! ids, and the crate that wrote the file runs all of them exactly as transformers does; a
//! conversion would re-implement each one and drift where it is least visible.
//!
//! Two ways in: a text whose control tokens are all to be parsed is handed whole to the crate
//! (the added-vocabulary split, then the pipeline: exactly transformers' ids); a text whose
//! control tokens are to stay text (`parse_special` off, or a chat prompt with
//! [`crate::text::special::TEXT_MARK`]s) is cut by the engine's own special matcher, and the
//! pieces between the tokens go through the same normalizer, pre-tokenizer and model at their
//! place in the whole text (so Metaspace's "first" still sees which piece is first).

use tokenizers::normalizer::Range;
use tokenizers::{
    Model, ModelWrapper, Normalizer, OffsetReferential, OffsetType, PreTokenizedString,
    PreTokenizer, Split, Token, Tokenizer as HfTokenizer,
};

use crate::text::special::Fragment;
use crate::text::tokenizer_error::TokenizerError;
use crate::text::vocab::Vocab;

/// The `tokenizer.json` pipeline; immutable after the build (the BPE word cache takes its own
/// lock with `try_*` calls, so no encode waits on another).
pub(crate) struct HfModel {
    tok: HfTokenizer,
}

fn build_err(what: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Build(format!("tokenizer.json: {what}"))
}

fn encode_err(e: impl std::fmt::Display) -> TokenizerError {
    TokenizerError::Encode(e.to_string())
}

impl HfModel {
    /// Parses `json` (a whole `tokenizer.json`), with padding and truncation taken off (they
    /// are for batches of training inputs; a file's fixed padding length would make every
    /// encode that long) and BPE dropout refused (it makes ids random).
    pub fn from_json(json: &str) -> Result<Self, TokenizerError> {
        let mut tok: HfTokenizer = json.parse().map_err(build_err)?;
        if let ModelWrapper::BPE(bpe) = tok.get_model()
            && bpe.dropout.is_some_and(|p| p > 0.0)
        {
            return Err(build_err(
                "BPE dropout is set (a training setting that makes ids random)",
            ));
        }
        tok.with_padding(None);
        tok.with_truncation(None).map_err(build_err)?;
        Ok(Self { tok })
    }

    /// Checks the pipeline against the vocabulary the engine decodes with: every id it can
    /// produce lies inside it and stands for the same text there.
    pub fn check_vocab(&self, vocab: &Vocab) -> Result<(), TokenizerError> {
        for (text, id) in self.tok.get_vocab(true) {
            match vocab.texts.get(id as usize) {
                // The vocabulary names an empty token `[EMPTY_{id}]` (as llama.cpp does).
                Some(t) if *t == text || text.is_empty() => {}
                Some(t) => {
                    return Err(build_err(format!(
                        "id {id} is '{text}', but the vocabulary has '{t}' there"
                    )));
                }
                None => {
                    return Err(build_err(format!(
                        "'{text}' has id {id}, outside the vocabulary of {} tokens",
                        vocab.len()
                    )));
                }
            }
        }
        Ok(())
    }

    /// `text` to ids with every special token written in it parsed, as transformers encodes
    /// without `add_special_tokens`.
    pub fn encode_parsed(&self, text: &str, out: &mut Vec<u32>) -> Result<(), TokenizerError> {
        let enc = self.tok.encode_fast(text, false).map_err(encode_err)?;
        out.extend_from_slice(enc.get_ids());
        Ok(())
    }

    /// `text` cut into `frags` by the engine's special matcher: the tokens as given, each text
    /// piece through the pipeline at its place in `text`.
    pub fn encode_fragments(
        &self,
        vocab: &Vocab,
        text: &str,
        frags: &[Fragment],
        out: &mut Vec<u32>,
    ) -> Result<(), TokenizerError> {
        // The whole text again, with each token's own text where it was cut out (its ranges
        // are what Metaspace's "first" and the offsets go by).
        let mut whole = String::with_capacity(text.len());
        let mut parts: Vec<(usize, usize, Option<u32>)> = Vec::with_capacity(frags.len());
        for f in frags {
            let start = whole.len();
            let id = match *f {
                Fragment::Text(s, e) => {
                    whole.push_str(&text[s..e]);
                    None
                }
                Fragment::Token(id) => {
                    whole.push_str(&vocab.texts[id as usize]);
                    Some(id)
                }
            };
            parts.push((start, whole.len(), id));
        }
        let mut pts = PreTokenizedString::from(whole.as_str());
        pts.split(|_, all| {
            parts
                .iter()
                .map(|&(s, e, id)| {
                    // Fragments are cut at character boundaries, so every slice exists.
                    let piece = all
                        .slice(Range::Original(s..e))
                        .ok_or_else(|| format!("no text at {s}..{e}"))?;
                    let tokens = id.map(|id| {
                        let content = vocab.texts[id as usize].clone();
                        vec![Token::new(id, content, (0, e - s))]
                    });
                    Ok(Split::from((piece, tokens)))
                })
                .collect::<tokenizers::Result<Vec<Split>>>()
        })
        .map_err(encode_err)?;
        if let Some(n) = self.tok.get_normalizer() {
            pts.normalize(|s| n.normalize(s)).map_err(encode_err)?;
        }
        if let Some(p) = self.tok.get_pre_tokenizer() {
            p.pre_tokenize(&mut pts).map_err(encode_err)?;
        }
        let model = self.tok.get_model();
        pts.tokenize(|s| model.tokenize(s.get()))
            .map_err(encode_err)?;
        for (_, _, tokens) in pts.get_splits(OffsetReferential::Original, OffsetType::None) {
            out.extend(tokens.iter().flatten().map(|t| t.id));
        }
        Ok(())
    }

    /// The pipeline as `tokenizer.json` text.
    pub fn to_json(&self) -> Result<String, TokenizerError> {
        self.tok.to_string(false).map_err(build_err)
    }

    /// Decodes with the file's own decoder (what transformers' `decode` gives).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.tok.decode(ids, skip_special).map_err(encode_err)
    }
}

//! The model's tokenizer, built from GGUF metadata: GPT-2 style byte-level BPE on top of the
//! Hugging Face `tokenizers` crate, with the pre-tokenizer llama.cpp uses for the file's `pre` type.
//!
//! Why build it from the GGUF and not ship a `tokenizer.json`: the GGUF is the one file the user
//! has, and llama.cpp (our reference) tokenizes from exactly these keys. The pre-tokenizer regexes
//! mirror llama.cpp's `llm_tokenizer_bpe` table for each supported `tokenizer.ggml.pre` value.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, BpeTrainer, Vocab};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper,
    PreTokenizerWrapper, Token, TokenizerImpl,
};

use crate::formats::gguf::{GgufError, GgufFile, Value};
use crate::formats::pretokenizer::PreTokenizerError;
pub use crate::formats::pretokenizer::PreTokenizerKind;

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_TYPES: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_BOS: &str = "tokenizer.ggml.bos_token_id";
const KEY_EOS: &str = "tokenizer.ggml.eos_token_id";
const KEY_EOT: &str = "tokenizer.ggml.eot_token_id";
const KEY_EOM: &str = "tokenizer.ggml.eom_token_id";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";

/// The pre-tokenizer `pre` values this build knows, for error messages.
const SUPPORTED_PRE: &str = "gpt2, default, smollm, starcoder, refact, codeshell, mpt, olmo, \
                             llama3, llama-bpe, llama-v3, qwen2, stablelm2";

/// End-of-turn token texts that stop generation when the vocabulary has them as control tokens
/// (the same list llama.cpp uses to build its end-of-generation set).
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|endoftext|>",
    "<|end|>",
    "<end_of_turn>",
    "<EOT>",
];

/// GGUF token types (llama.cpp's `llama_token_type`).
const TYPE_UNKNOWN: u64 = 2;
const TYPE_CONTROL: u64 = 3;
const TYPE_USER_DEFINED: u64 = 4;

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
        "unsupported tokenizer model '{0}': only GPT-2 style byte-level BPE ('gpt2') is supported"
    )]
    UnsupportedModel(String),
    #[error("unsupported pre-tokenizer type '{0}' (supported: {SUPPORTED_PRE})")]
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

/// The BPE model (vocabulary, merges, word cache) behind both of a [`Tokenizer`]'s pipelines:
/// one copy in memory, read-only (its word cache takes its own lock with `try_*` calls, so it
/// never makes an encode wait).
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

/// A model's tokenizer. Cheap to clone and share across threads (`Send + Sync`).
///
/// Two Hugging Face pipelines, both immutable after the build, so no encode ever waits on
/// another: `hf` parses control tokens written in the text, `plain` tokenizes them as ordinary
/// text. They share one BPE model ([`SharedBpe`]); each has only its own small added-token
/// table and pre-tokenizer, so the second pipeline costs kilobytes, not a second vocabulary.
#[derive(Clone)]
pub struct Tokenizer {
    hf: Arc<HfTokenizer>,
    plain: Arc<HfTokenizer>,
    n_vocab: usize,
    /// Every token's decoded bytes, flattened; token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// Control (and unknown-type) tokens: skipped when decoding with `skip_special`.
    special: Vec<bool>,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
    stop_ids: Vec<u32>,
    pre: PreTokenizerKind,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.n_vocab)
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

fn optional_u32(gguf: &GgufFile, key: &str) -> Result<Option<u32>, TokenizerError> {
    match gguf.get(key) {
        None => Ok(None),
        Some(v) => {
            let n = v.as_u64().ok_or_else(|| {
                TokenizerError::BadMetadata(format!("'{key}' is not an unsigned integer"))
            })?;
            u32::try_from(n)
                .map(Some)
                .map_err(|_| TokenizerError::BadMetadata(format!("'{key}' = {n} is too large")))
        }
    }
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, TokenizerError> {
        let model = gguf.get_str(KEY_MODEL)?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_string()));
        }
        let pre_name = match gguf.get(KEY_PRE) {
            None => None,
            Some(v) => Some(v.as_str().ok_or_else(|| {
                TokenizerError::BadMetadata(format!("'{KEY_PRE}' is not a string"))
            })?),
        };
        let pre = PreTokenizerKind::from_gguf_name(pre_name).map_err(TokenizerError::from)?;
        let tokens = gguf.get_str_array(KEY_TOKENS)?;
        let types: Vec<u64> = match gguf.get(KEY_TYPES) {
            None => vec![1; tokens.len()],
            Some(v) => v
                .as_array()
                .ok_or_else(|| {
                    TokenizerError::BadMetadata(format!("'{KEY_TYPES}' is not an array"))
                })?
                .iter()
                .map(|t| {
                    t.as_u64().ok_or_else(|| {
                        TokenizerError::BadMetadata(format!("'{KEY_TYPES}' holds a non-integer"))
                    })
                })
                .collect::<Result<_, _>>()?,
        };
        let merges = match gguf.get(KEY_MERGES) {
            None => Vec::new(),
            Some(_) => gguf.get_str_array(KEY_MERGES)?,
        };
        let config = TokenizerConfig {
            tokens: tokens.iter().map(|s| (*s).to_string()).collect(),
            types,
            merges: merges.iter().map(|s| (*s).to_string()).collect(),
            pre,
            bos: optional_u32(gguf, KEY_BOS)?,
            eos: optional_u32(gguf, KEY_EOS)?,
            extra_stop: [optional_u32(gguf, KEY_EOT)?, optional_u32(gguf, KEY_EOM)?]
                .into_iter()
                .flatten()
                .collect(),
            add_bos: match gguf.get(KEY_ADD_BOS) {
                None => false,
                Some(Value::Bool(b)) => *b,
                Some(_) => {
                    return Err(TokenizerError::BadMetadata(format!(
                        "'{KEY_ADD_BOS}' is not a bool"
                    )));
                }
            },
        };
        Self::from_config(config)
    }

    /// Builds the tokenizer from already-extracted metadata (also what tests use for tiny vocabularies).
    pub fn from_config(c: TokenizerConfig) -> Result<Self, TokenizerError> {
        c.validate()?;
        let n = c.tokens.len();

        // First occurrence wins for duplicate strings; decoding still works for every id because
        // it goes through our own byte table, not the BPE's reverse map.
        let mut vocab = Vocab::with_capacity(n);
        for (id, tok) in (0u32..).zip(&c.tokens) {
            vocab.entry(tok.clone()).or_insert(id);
        }

        let special: Vec<bool> = c
            .types
            .iter()
            .map(|&t| t == TYPE_CONTROL || t == TYPE_UNKNOWN)
            .collect();
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(n + 1);
        offsets.push(0);
        for tok in &c.tokens {
            token_string_bytes(tok, &mut bytes);
            offsets.push(u32::try_from(bytes.len()).map_err(|_| {
                TokenizerError::BadMetadata("the token strings exceed 4 GiB".into())
            })?);
        }

        let mut stop_ids: Vec<u32> = c
            .eos
            .into_iter()
            .chain(c.extra_stop.iter().copied())
            .collect();
        for text in END_OF_TURN_TEXTS {
            if let Some(&id) = vocab.get(*text)
                && special[id as usize]
            {
                stop_ids.push(id);
            }
        }
        stop_ids.retain(|&id| (id as usize) < n);
        stop_ids.sort_unstable();
        stop_ids.dedup();

        let bpe = SharedBpe(Arc::new(c.build_bpe(vocab)?));
        let hf = c.build_hf(bpe.clone(), false)?;
        let plain = c.build_hf(bpe, true)?;
        Ok(Self {
            hf: Arc::new(hf),
            plain: Arc::new(plain),
            n_vocab: n,
            bytes,
            offsets,
            special,
            bos: c.bos,
            eos: c.eos,
            add_bos: c.add_bos,
            stop_ids,
            pre: c.pre,
        })
    }

    /// Text to token ids, without BOS. With `parse_special`, control tokens written in the text
    /// ("<|im_start|>") become their ids; without it they are tokenized as ordinary text.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        let hf = if parse_special { &self.hf } else { &self.plain };
        let enc = hf
            .encode_fast(text, false)
            .map_err(|e| TokenizerError::Encode(e.to_string()))?;
        Ok(enc.get_ids().to_vec())
    }

    /// As [`Tokenizer::encode`], with BOS in front when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`) and the text does not already start with it.
    pub fn encode_prompt(
        &self,
        text: &str,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let ids = self.encode(text, parse_special)?;
        match self.bos {
            Some(bos) if self.add_bos && ids.first() != Some(&bos) => {
                let mut out = Vec::with_capacity(ids.len() + 1);
                out.push(bos);
                out.extend(ids);
                Ok(out)
            }
            _ => Ok(ids),
        }
    }

    /// Token ids to text. Invalid UTF-8 (a character cut off mid-way) becomes U+FFFD, as in
    /// Hugging Face's byte-level decoder. With `skip_special`, control tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut buf = Vec::new();
        for &id in ids {
            buf.extend_from_slice(self.token_bytes_checked(id, skip_special)?);
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Decodes with the wrapped Hugging Face tokenizer. Same result as [`Tokenizer::decode`] for
    /// valid ids (tests hold them equal); kept for that check.
    pub fn decode_hf(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        self.hf
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// The raw bytes one token stands for (may be part of a UTF-8 character); `None` for an id
    /// outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let (start, end) = (*self.offsets.get(i)?, *self.offsets.get(i + 1)?);
        self.bytes.get(start as usize..end as usize)
    }

    /// The bytes `id` contributes to decoded text: empty for a skipped control token.
    pub(crate) fn token_bytes_checked(
        &self,
        id: u32,
        skip_special: bool,
    ) -> Result<&[u8], TokenizerError> {
        let bytes = self.token_bytes(id).ok_or(TokenizerError::UnknownId {
            id,
            vocab_size: self.n_vocab,
        })?;
        if skip_special && self.special[id as usize] {
            Ok(&[])
        } else {
            Ok(bytes)
        }
    }

    /// Whether `id` is a control token (hidden by `skip_special`).
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`, default false).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// Tokens that end generation: EOS, EOT/EOM when the file names them, and the end-of-turn
    /// control tokens the vocabulary has (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, ...). Sorted.
    pub fn stop_token_ids(&self) -> Vec<u32> {
        self.stop_ids.clone()
    }

    pub fn vocab_size(&self) -> usize {
        self.n_vocab
    }

    /// The token's string as the vocabulary stores it (byte-level form, e.g. "Ġthe"); `None`
    /// outside the vocabulary (and for a later duplicate of an earlier token's string).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.hf.id_to_token(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    pub fn pre_tokenizer(&self) -> PreTokenizerKind {
        self.pre
    }

    /// The wrapped Hugging Face tokenizer (control tokens parsed in text) as `tokenizer.json`:
    /// what a Hugging Face folder of this model holds ([`crate::quant::hf_export`] writes it).
    pub fn hf_json(&self) -> Result<String, TokenizerError> {
        self.hf
            .to_string(true)
            .map_err(|e| TokenizerError::Build(format!("cannot serialize: {e}")))
    }
}

/// Tokenizer metadata in plain form: what [`Tokenizer::from_gguf`] reads from the file.
#[derive(Debug, Clone)]
pub struct TokenizerConfig {
    pub tokens: Vec<String>,
    /// GGUF token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub types: Vec<u64>,
    /// "a b" merge rules, highest priority first.
    pub merges: Vec<String>,
    pub pre: PreTokenizerKind,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    /// More end-of-generation ids (EOT, EOM) besides EOS.
    pub extra_stop: Vec<u32>,
    pub add_bos: bool,
}

impl TokenizerConfig {
    /// Sizes and ids that must agree before anything is built.
    fn validate(&self) -> Result<(), TokenizerError> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(TokenizerError::BadMetadata(
                "the vocabulary is empty".into(),
            ));
        }
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::BadMetadata(format!(
                "{n} tokens is too many"
            )));
        }
        if self.types.len() != n {
            return Err(TokenizerError::BadMetadata(format!(
                "{KEY_TOKENS} has {n} entries but {KEY_TYPES} has {}",
                self.types.len()
            )));
        }
        for (key, id) in [("bos", self.bos), ("eos", self.eos)] {
            if let Some(id) = id.filter(|&id| id as usize >= n) {
                return Err(TokenizerError::BadMetadata(format!(
                    "{key} token id {id} is outside the vocabulary of {n} tokens"
                )));
            }
        }
        Ok(())
    }

    /// The BPE model over `vocab` (token string -> id) and the merges.
    fn build_bpe(&self, vocab: Vocab) -> Result<BPE, TokenizerError> {
        let mut merge_pairs = Vec::with_capacity(self.merges.len());
        for (i, m) in self.merges.iter().enumerate() {
            let (a, b) = m.split_once(' ').ok_or_else(|| {
                TokenizerError::BadMetadata(format!(
                    "merge #{i} '{m}' is not two tokens separated by a space"
                ))
            })?;
            merge_pairs.push((a.to_string(), b.to_string()));
        }
        BPE::builder()
            .vocab_and_merges(vocab, merge_pairs)
            .ignore_merges(self.pre == PreTokenizerKind::Llama3)
            .build()
            .map_err(|e| TokenizerError::Build(format!("BPE model: {e}")))
    }

    /// A Hugging Face pipeline over `bpe`: control tokens in the text are parsed, unless
    /// `plain_text`, which tokenizes them as ordinary text.
    fn build_hf(&self, bpe: SharedBpe, plain_text: bool) -> Result<HfTokenizer, TokenizerError> {
        let mut hf = HfTokenizer::new(bpe);
        hf.with_pre_tokenizer(Some(self.pre.build()?));
        hf.with_decoder(Some(ByteLevelDecoder::default()));
        let mut special_added = Vec::new();
        let mut user_added = Vec::new();
        for (tok, &ty) in self.tokens.iter().zip(&self.types) {
            match ty {
                TYPE_CONTROL | TYPE_UNKNOWN => {
                    special_added.push(AddedToken::from(tok.clone(), true))
                }
                // llama.cpp matches user-defined tokens in text even without special parsing,
                // as HF does for non-special added tokens.
                TYPE_USER_DEFINED => user_added.push(AddedToken::from(tok.clone(), false)),
                _ => {}
            }
        }
        hf.add_special_tokens(&special_added);
        hf.add_tokens(&user_added);
        // Set once at build time: the flag is the pipeline's, so flipping it per call would
        // need a write lock that every other encode waits on.
        hf.set_encode_special_tokens(plain_text);
        Ok(hf)
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
fn token_string_bytes(token: &str, out: &mut Vec<u8>) {
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

//! The model's tokenizer, built from GGUF metadata as llama.cpp builds it: GPT-2 style byte-level
//! BPE (`tokenizer.ggml.model = "gpt2"`, with the pre-tokenizer its `tokenizer.ggml.pre` names)
//! or SentencePiece (`"llama"`: scores, `<0xXX>` byte fallback, `▁` for spaces and the leading
//! space), special tokens cut out first ([`crate::text::special`]), BOS/EOS added as the file
//! says, and each token's decoded piece as llama.cpp's `token_to_piece` gives it.
//!
//! Why build it from the GGUF and not ship a `tokenizer.json`: the GGUF is the one file the user
//! has, and llama.cpp (our reference) tokenizes from exactly these keys.
//!
//! Where the metadata carries a whole Hugging Face `tokenizer.json`
//! (`tokenizer.huggingface.json`, what a Hugging Face folder that is not byte-level BPE gets,
//! [`crate::formats::hf_tokenizer`]), that file's pipeline encodes instead
//! (`text::hf_model`); the vocabulary, special tokens and decoding are the same either
//! way.

use std::borrow::Cow;
use std::sync::Arc;

use crate::formats::gguf::GgufFile;
use crate::formats::hf_tokenizer::hex_byte_token;
pub use crate::formats::pretokenizer::PreTokenizerKind;
use crate::formats::pretokenizer::PreTokenizerSpec;
use crate::text::bpe::{BpePipelines, byte_level_bytes};
use crate::text::hf_model::HfModel;
use crate::text::pieces::{self, Cuts, PIECE_BYTES, one_at_a_time};
pub use crate::text::special::TEXT_MARK;
use crate::text::special::{Fragment, SpecialMatcher};
use crate::text::spm;
pub use crate::text::tokenizer_error::TokenizerError;
use crate::text::tokenizer_parts::{Parts, bad};
use crate::text::vocab::{SpecialIds, Vocab, VocabKind, attr};

/// The algorithm over the vocabulary.
enum Model {
    Bpe {
        pipelines: Box<BpePipelines>,
        pre: PreTokenizerKind,
    },
    Spm {
        /// Where its escaped text may be cut ([`pieces::spm_cuts`]).
        cuts: Cuts,
    },
    /// A `tokenizer.json`'s own pipeline.
    Hf(Box<HfModel>),
}

/// Everything a tokenizer holds, shared read-only between its clones.
struct Inner {
    vocab: Vocab,
    matcher: SpecialMatcher,
    model: Model,
    /// Every token's decoded bytes, flattened; token `i` is `bytes[offsets[i]..offsets[i + 1]]`.
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// The longest token's decoded bytes (at least 1), from `offsets`.
    max_token_bytes: usize,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
}

/// A model's tokenizer. Cheap to clone and share across threads (`Send + Sync`); nothing in it
/// changes after the build, so no encode ever waits on another.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = &self.inner;
        f.debug_struct("Tokenizer")
            .field("model", &i.vocab.kind)
            .field("vocab_size", &i.vocab.len())
            .field("pre", &self.pre_tokenizer())
            .field("bos", &i.vocab.special.bos)
            .field("eos", &i.vocab.special.eos)
            .field("add_bos", &i.add_bos)
            .finish_non_exhaustive()
    }
}

/// Tokenizer metadata in plain form for a byte-level BPE vocabulary (what tests and synthetic
/// models build from; [`Tokenizer::from_gguf`] reads the same from a file, and more).
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

/// A vocabulary's fill-in-the-middle tokens ([`Tokenizer::fim_ids`]); `None` where it has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FimIds {
    pub prefix: Option<u32>,
    pub suffix: Option<u32>,
    pub middle: Option<u32>,
    pub repo: Option<u32>,
    pub file_sep: Option<u32>,
}

/// One token's decoded bytes, as llama.cpp's `token_to_piece` with `special = true`.
fn piece(vocab: &Vocab, id: u32, out: &mut Vec<u8>) {
    let text = &vocab.texts[id as usize];
    let a = vocab.attr(id);
    if a & (attr::CONTROL | attr::UNKNOWN | attr::USER_DEFINED) != 0 {
        out.extend_from_slice(text.as_bytes());
    } else if a & attr::NORMAL != 0 {
        match vocab.kind {
            VocabKind::Spm => out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
            VocabKind::Bpe => byte_level_bytes(text, out),
        }
    } else if a & attr::BYTE != 0 {
        match (hex_byte_token(text), vocab.kind) {
            (Some(b), _) => out.push(b),
            (None, VocabKind::Bpe) => byte_level_bytes(text, out),
            (None, VocabKind::Spm) => out.extend_from_slice(text.as_bytes()),
        }
    }
    // Unused and undefined tokens decode to nothing, as in llama.cpp.
}

impl Tokenizer {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self, TokenizerError> {
        Self::build(Parts::from_gguf(gguf)?)
    }

    /// Builds a byte-level BPE tokenizer from already-extracted metadata (also what tests use
    /// for tiny vocabularies).
    pub fn from_config(c: TokenizerConfig) -> Result<Self, TokenizerError> {
        let special = SpecialIds {
            eos: c.eos,
            bos: c.bos,
            ..SpecialIds::default()
        };
        Self::build(Parts {
            kind: VocabKind::Bpe,
            pre: Some(PreTokenizerSpec {
                kind: c.pre,
                ignore_merges: c.pre == PreTokenizerKind::Llama3,
                add_bos: c.add_bos,
                clean_spaces: false,
            }),
            tokens: c.tokens,
            types: c.types,
            scores: Vec::new(),
            merges: c.merges,
            hf: None,
            special,
            extra_stop: c.extra_stop,
            add_bos: c.add_bos,
            add_eos: false,
            add_space_prefix: false,
            clean_spaces: false,
            general_name: None,
        })
    }

    fn build(mut p: Parts) -> Result<Self, TokenizerError> {
        p.validate()?;
        let mut vocab = Vocab::new(
            p.kind,
            p.tokens,
            p.scores,
            &p.types,
            p.special,
            p.general_name.as_deref(),
        );
        vocab.eog.extend(&p.extra_stop);
        vocab.eog.sort_unstable();
        vocab.eog.dedup();
        let matcher =
            SpecialMatcher::new(&vocab).map_err(|e| TokenizerError::Build(e.to_string()))?;
        let mut bytes = Vec::new();
        let mut offsets = Vec::with_capacity(vocab.len() + 1);
        offsets.push(0);
        for id in 0..vocab.len() as u32 {
            piece(&vocab, id, &mut bytes);
            offsets.push(
                u32::try_from(bytes.len())
                    .map_err(|_| bad("the token strings exceed 4 GiB".into()))?,
            );
        }
        let model = match (p.hf, p.pre) {
            (Some(json), _) => {
                let hf = HfModel::from_json(&json)?;
                hf.check_vocab(&vocab)?;
                Model::Hf(Box::new(hf))
            }
            (None, Some(spec)) => Model::Bpe {
                pipelines: Box::new(BpePipelines::new(
                    &vocab,
                    &p.merges,
                    spec.kind,
                    spec.ignore_merges,
                )?),
                pre: spec.kind,
            },
            (None, None) => Model::Spm {
                cuts: pieces::spm_cuts(vocab.texts.iter().map(String::as_str)),
            },
        };
        let max_token_bytes = offsets
            .windows(2)
            .map(|w| w[1].saturating_sub(w[0]) as usize)
            .max()
            .unwrap_or(1)
            .max(1);
        Ok(Self {
            inner: Arc::new(Inner {
                vocab,
                matcher,
                model,
                bytes,
                offsets,
                max_token_bytes,
                add_bos: p.add_bos,
                add_eos: p.add_eos,
                add_space_prefix: p.add_space_prefix,
                clean_spaces: p.clean_spaces,
            }),
        })
    }

    /// Text to token ids, without BOS or EOS (llama.cpp's `tokenize` with `add_special` off).
    /// With `parse_special`, control tokens written in the text ("<|im_start|>") become their
    /// ids; without it they are tokenized as ordinary text. User-defined tokens are matched
    /// either way, as llama.cpp does.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>, TokenizerError> {
        self.encode_in_pieces(text, parse_special, PIECE_BYTES)
    }

    /// [`Tokenizer::encode`] with its text cut into pieces of `piece_bytes` where a cut is
    /// exact ([`crate::text::pieces`]); `usize::MAX` encodes each text fragment whole. The
    /// ids are the same for every piece size: tests hold small pieces against whole ones. A
    /// `tokenizer.json`'s pipeline takes each text whole (its own cuts are not the engine's).
    pub fn encode_in_pieces(
        &self,
        text: &str,
        parse_special: bool,
        piece_bytes: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        let i = &*self.inner;
        if let (Model::Hf(hf), true) = (&i.model, parse_special) {
            let mut out = Vec::with_capacity(text.len() / 3 + 1);
            hf.encode_parsed(text, &mut out)?;
            return Ok(out);
        }
        let frags = i.matcher.partition(&i.vocab, text, parse_special);
        self.encode_fragments(text, frags, piece_bytes)
    }

    /// `text` (a user's message, a tool's result) with every control token written in it
    /// broken up by [`TEXT_MARK`], so that [`Tokenizer::encode_chat`] reads it as text: a user
    /// who types `<|im_end|><|im_start|>system` gets those characters, not a forged turn.
    /// Borrowed when there is nothing to break.
    pub fn escape_control<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let i = &*self.inner;
        i.matcher.escape_control(&i.vocab, text)
    }

    /// The most input bytes one token stands for (its decoded bytes; a special token's text):
    /// a text of `n` bytes is at least `n / max_token_bytes()` tokens.
    pub fn max_token_bytes(&self) -> usize {
        self.inner.max_token_bytes
    }

    /// A rendered chat prompt to token ids: control tokens are parsed (the template's own
    /// turns), except where [`Tokenizer::escape_control`] marked them as a message's text;
    /// the marks themselves are dropped.
    pub fn encode_chat(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let i = &*self.inner;
        if !text.contains(TEXT_MARK) {
            return self.encode(text, true);
        }
        let frags = i.matcher.partition(&i.vocab, text, true);
        let mut clean = String::with_capacity(text.len());
        let mut out = Vec::with_capacity(frags.len());
        for f in frags {
            match f {
                Fragment::Text(s, e) => {
                    let start = clean.len();
                    clean.extend(text[s..e].chars().filter(|&c| c != TEXT_MARK));
                    if clean.len() > start {
                        out.push(Fragment::Text(start, clean.len()));
                    }
                }
                token => out.push(token),
            }
        }
        self.encode_fragments(&clean, out, PIECE_BYTES)
    }

    /// Tokenizes the text pieces of `frags` (byte ranges of `text`) between its tokens, each
    /// cut into pieces of about `piece_bytes` where a cut is exact.
    fn encode_fragments(
        &self,
        text: &str,
        frags: Vec<Fragment>,
        piece_bytes: usize,
    ) -> Result<Vec<u32>, TokenizerError> {
        let i = &*self.inner;
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        match &i.model {
            Model::Hf(hf) => hf.encode_fragments(&i.vocab, text, &frags, &mut out)?,
            Model::Bpe { pipelines, .. } => {
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            for p in pieces::pieces(&text[s..e], piece_bytes, Cuts::ByteLevel) {
                                one_at_a_time(p, |p| pipelines.encode_fragment(p, &mut out))?;
                            }
                        }
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
            Model::Spm { cuts } => {
                // The first piece of text, and every piece after a special token, gets the
                // leading space SentencePiece models are trained with.
                let mut after_special = true;
                let mut escaped = String::new();
                for f in frags {
                    match f {
                        Fragment::Text(s, e) => {
                            escaped.clear();
                            if i.add_space_prefix && after_special {
                                escaped.push('\u{2581}');
                            }
                            for c in text[s..e].chars() {
                                escaped.push(if c == ' ' { '\u{2581}' } else { c });
                            }
                            for p in pieces::pieces(&escaped, piece_bytes, *cuts) {
                                one_at_a_time(p, |p| {
                                    spm::tokenize(&i.vocab, p, i.vocab.special.unk, &mut out)
                                });
                            }
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            after_special = true;
                        }
                    }
                }
            }
        }
        Ok(out)
    }

    /// As [`Tokenizer::encode`], with BOS in front when the model asks for it
    /// (`tokenizer.ggml.add_bos_token`; on by default for SentencePiece and Llama 3) and the
    /// text does not already start with it, and EOS at the end when `add_eos_token` says so.
    pub fn encode_prompt(
        &self,
        text: &str,
        parse_special: bool,
    ) -> Result<Vec<u32>, TokenizerError> {
        let i = &*self.inner;
        let mut ids = self.encode(text, parse_special)?;
        if let Some(bos) = i.vocab.special.bos.filter(|_| i.add_bos)
            && ids.first() != Some(&bos)
        {
            ids.insert(0, bos);
        }
        if let Some(eos) = i.vocab.special.eos.filter(|_| i.add_eos) {
            ids.push(eos);
        }
        Ok(ids)
    }

    /// Token ids to text: the tokens' pieces one after another, as llama.cpp's server streams
    /// them. Invalid UTF-8 (a character cut off mid-way) becomes U+FFFD. With `skip_special`,
    /// control tokens are left out.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        let mut buf = Vec::new();
        for &id in ids {
            buf.extend_from_slice(self.token_bytes_checked(id, skip_special)?);
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// A whole sequence back to text as llama.cpp's `llama_detokenize` does it: the leading
    /// space SentencePiece adds is taken off again, BOS/EOS dropped with `remove_special`,
    /// control tokens shown with `unparse_special`, and `clean_up_tokenization_spaces` applied
    /// where the model sets it. This is the inverse of [`Tokenizer::encode`] llama.cpp's
    /// round-trip tests check; [`Tokenizer::decode`] is what continues a prompt. A
    /// `tokenizer.json`'s pipeline decodes the sequence with the file's own decoder instead,
    /// as transformers' `decode` does (its leading-space strip looks past skipped tokens).
    pub fn detokenize(
        &self,
        ids: &[u32],
        remove_special: bool,
        unparse_special: bool,
    ) -> Result<String, TokenizerError> {
        let i = &*self.inner;
        let mut ids = ids;
        let mut remove_space = i.add_space_prefix;
        let s = &i.vocab.special;
        if remove_special && i.add_bos && s.bos.is_some() && ids.first() == s.bos.as_ref() {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && i.add_eos && s.eos.is_some() && ids.last() == s.eos.as_ref() {
            ids = &ids[..ids.len() - 1];
        }
        if let Model::Hf(hf) = &i.model {
            if let Some(&id) = ids.iter().find(|&&id| id as usize >= i.vocab.len()) {
                return Err(TokenizerError::UnknownId {
                    id,
                    vocab_size: i.vocab.len(),
                });
            }
            return hf.decode(ids, !unparse_special);
        }
        let mut buf = Vec::new();
        for &id in ids {
            let mut piece = self.token_bytes_checked(id, !unparse_special)?;
            if remove_space {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
                remove_space = false;
            }
            buf.extend_from_slice(piece);
        }
        if i.clean_spaces {
            clean_up_spaces(&mut buf);
        }
        Ok(String::from_utf8_lossy(&buf).into_owned())
    }

    /// Decodes with the wrapped Hugging Face tokenizer. For byte-level BPE the same result as
    /// [`Tokenizer::decode`] for valid ids (tests hold them equal); for a `tokenizer.json`'s
    /// pipeline, its own decoder's (transformers' `decode`).
    pub fn decode_hf(&self, ids: &[u32], skip_special: bool) -> Result<String, TokenizerError> {
        match &self.inner.model {
            Model::Bpe { pipelines, .. } => pipelines.decode_hf(ids, skip_special),
            Model::Hf(hf) => hf.decode(ids, skip_special),
            Model::Spm { .. } => Err(TokenizerError::Build(
                "a SentencePiece vocabulary has no Hugging Face pipeline here".into(),
            )),
        }
    }

    /// The raw bytes one token stands for (may be part of a UTF-8 character); `None` for an id
    /// outside the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        let i = id as usize;
        let offsets = &self.inner.offsets;
        let (start, end) = (*offsets.get(i)?, *offsets.get(i + 1)?);
        self.inner.bytes.get(start as usize..end as usize)
    }

    /// The bytes `id` contributes to decoded text: empty for a skipped control token.
    pub(crate) fn token_bytes_checked(
        &self,
        id: u32,
        skip_special: bool,
    ) -> Result<&[u8], TokenizerError> {
        let bytes = self.token_bytes(id).ok_or(TokenizerError::UnknownId {
            id,
            vocab_size: self.inner.vocab.len(),
        })?;
        if skip_special && self.is_special(id) {
            Ok(&[])
        } else {
            Ok(bytes)
        }
    }

    /// Whether `id` is a control (or unknown-type) token, hidden by `skip_special`.
    pub fn is_special(&self, id: u32) -> bool {
        self.inner.vocab.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0
    }

    /// Fill-in-the-middle tokens: as the file names them (`tokenizer.ggml.fim_pre_token_id`...),
    /// else found by text as llama.cpp does (`<|fim_prefix|>`, `<fim_prefix>`, `<PRE>`...).
    pub fn fim_ids(&self) -> FimIds {
        let s = &self.inner.vocab.special;
        FimIds {
            prefix: s.fim_pre,
            suffix: s.fim_suf,
            middle: s.fim_mid,
            repo: s.fim_rep,
            file_sep: s.fim_sep,
        }
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.inner.vocab.special.bos
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.inner.vocab.special.eos
    }

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`, else llama.cpp's
    /// default for the tokenizer: on for SentencePiece and Llama 3, off otherwise).
    pub fn add_bos(&self) -> bool {
        self.inner.add_bos
    }

    /// Whether prompts end with EOS (`tokenizer.ggml.add_eos_token`, default off).
    pub fn add_eos(&self) -> bool {
        self.inner.add_eos
    }

    /// Tokens that end generation, as llama.cpp's end-of-generation set: EOS, EOT and EOM,
    /// FIM pad / repo / file-separator tokens, and every token with an end-of-turn text
    /// (`<|im_end|>`, `<|eot_id|>`, `<|endoftext|>`, `</s>`, ...). Sorted.
    pub fn stop_token_ids(&self) -> Vec<u32> {
        self.inner.vocab.eog.clone()
    }

    /// Whether `other` is this same tokenizer (a clone of it), not merely an equal one: what
    /// caches of per-vocabulary state key on.
    pub fn same_as(&self, other: &Tokenizer) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.vocab.len()
    }

    /// The token's string as the vocabulary stores it (byte-level form for BPE, e.g. "Ġthe";
    /// `▁` for spaces in SentencePiece); `None` outside the vocabulary.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.vocab.texts.get(id as usize).cloned()
    }

    /// The id of a token string (the first, if the vocabulary repeats it).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.vocab.ids.get(token).copied()
    }

    /// The BPE pre-tokenizer; `None` for SentencePiece, which splits no words, and for a
    /// `tokenizer.json`'s pipeline, which has its own.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizerKind> {
        match self.inner.model {
            Model::Bpe { pre, .. } => Some(pre),
            Model::Spm { .. } | Model::Hf(_) => None,
        }
    }

    /// Whether text is encoded by a Hugging Face `tokenizer.json`'s own pipeline
    /// (`text::hf_model`).
    pub fn is_hf_pipeline(&self) -> bool {
        matches!(self.inner.model, Model::Hf(_))
    }

    /// Whether this is a SentencePiece vocabulary (`tokenizer.ggml.model = "llama"`).
    pub fn is_sentencepiece(&self) -> bool {
        self.inner.vocab.kind == VocabKind::Spm
    }

    /// The wrapped Hugging Face tokenizer (control tokens parsed in text) as `tokenizer.json`:
    /// what a Hugging Face folder of this model holds ([`crate::quant::hf_export`] writes it).
    pub fn hf_json(&self) -> Result<String, TokenizerError> {
        match &self.inner.model {
            Model::Bpe { pipelines, .. } => pipelines.to_json(),
            Model::Hf(hf) => hf.to_json(),
            Model::Spm { .. } => Err(TokenizerError::Build(
                "writing a tokenizer.json for a SentencePiece vocabulary is not supported".into(),
            )),
        }
    }
}

/// llama.cpp's `clean_spaces` passes over detokenized bytes, in place as it runs them: no space
/// before `?!.,`, none around a lone apostrophe, none before `'s`, `'m`, `'re`, `'ve`.
fn clean_up_spaces(t: &mut Vec<u8>) {
    let mut total = t.len();
    // First pass: " ?", " !", " .", " ,".
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        t[total] = x;
        total += 1;
    }
    // Second pass: " ' " loses both spaces.
    let n = total;
    total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = t[i];
        if x == b'\'' && i + 1 < n && t[i - 1] == b' ' && t[i + 1] == b' ' {
            total -= 1;
            i += 1;
            t[i] = 0;
        }
        t[total] = x;
        total += 1;
        i += 1;
    }
    // Third pass: " 's", " 'm", " 're", " 've" lose their space.
    let n = total;
    total = usize::from(n > 0);
    for i in 1..n {
        let x = t[i];
        if t[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = t[i + 1];
            let two = |a: u8, b: u8| x1 == a && i + 2 < n && t[i + 2] == b;
            if matches!(x1, b's' | b'm')
                || (!matches!(x1, b't' | b'd') && (two(b'r', b'e') || two(b'v', b'e')))
            {
                total -= 1;
            }
        }
        t[total] = x;
        total += 1;
    }
    t.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut b = s.as_bytes().to_vec();
        clean_up_spaces(&mut b);
        String::from_utf8_lossy(&b).into_owned()
    }

    #[test]
    fn clean_up_spaces_as_llama_cpp() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("it ' s"), "it's");
        assert_eq!(clean("he 's here , we 're done"), "he's here, we're done");
        assert_eq!(clean("don 't"), "don 't");
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }
}

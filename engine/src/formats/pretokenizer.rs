//! The pre-tokenizers (how text is split into words before BPE) by llama.cpp's
//! `tokenizer.ggml.pre` name, built as Hugging Face `tokenizers` pre-tokenizers: the one table
//! both the GGUF tokenizer (`text::tokenizer`) and a Hugging Face folder's `tokenizer.json`
//! mapping ([`crate::formats::hf_tokenizer`]) read.
//!
//! Each kind is the list of regexes llama.cpp's `llm_tokenizer_bpe` applies for that
//! `LLAMA_VOCAB_PRE_TYPE_*` (src/llama-vocab.cpp), in order: each regex splits every piece the
//! previous ones left into its matches and the text between them, which is what a `Sequence` of
//! `Split(.., Isolated)` does. The regexes are llama.cpp's own adapted forms where it rewrote the
//! original (its `(?=[\p{L}])([^a-z])` and friends), so both engines read the same pattern.

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
/// Qwen3.5's split: as Qwen2 with combining marks kept inside words.
const QWEN35_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-2's split, as llama.cpp's custom GPT-2 splitter runs it (text between matches is kept as
/// its own piece there, which the final `\s+` spells out here).
const GPT2_REGEX: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_DEFAULT` (no `pre` key, or "default").
const DEFAULT_REGEXES: &[&str] = &[
    r"[\p{P}\$\+<=>\^~\|]+",
    GPT2_REGEX,
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
];
const FALCON_REGEXES: &[&str] = &[r"[\p{P}\$\+<=>\^~\|`]+", GPT2_REGEX, r"[0-9][0-9][0-9]"];
const DEEPSEEK_LLM_REGEXES: &[&str] = &[
    "[\u{d}\u{a}]",
    "\\s?[A-Za-z\u{b5}\u{c0}-\u{d6}\u{d8}-\u{f6}\u{f8}-\u{1ba}\u{1bc}-\u{1bf}\u{1c4}-\u{293}\u{295}-\u{2af}\u{370}-\u{373}\u{376}\u{377}\u{37b}-\u{37d}\u{37f}\u{386}\u{388}-\u{38a}\u{38c}\u{38e}-\u{3a1}\u{3a3}-\u{3f5}\u{3f7}-\u{481}\u{48a}-\u{52f}\u{531}-\u{556}\u{10a0}-\u{10c5}\u{13a0}-\u{13f5}\u{13f8}-\u{13fd}\u{1c90}-\u{1cba}\u{1cbd}-\u{1cbf}\u{1d00}-\u{1d2b}\u{1d6b}-\u{1d77}\u{1d79}-\u{1d9a}\u{1e00}-\u{1f15}\u{1f18}-\u{1f1d}\u{1f20}-\u{1f45}\u{1f48}-\u{1f4d}\u{1f50}-\u{1f57}\u{1f59}\u{1f5b}\u{1f5d}\u{1f5f}-\u{1f7d}\u{1f80}-\u{1fb4}\u{1fb6}-\u{1fbc}\u{1fbe}\u{1fc2}-\u{1fc4}\u{1fc6}-\u{1fcc}\u{1fd0}-\u{1fd3}\u{1fd6}-\u{1fdb}\u{1fe0}-\u{1fec}\u{1ff2}-\u{1ff4}\u{1ff6}-\u{1ffc}\u{2102}\u{2107}\u{210a}-\u{2113}\u{2115}\u{2119}-\u{211d}\u{2124}\u{2126}\u{2128}\u{212a}-\u{212d}\u{212f}-\u{2134}\u{2139}\u{213c}-\u{213f}\u{2145}-\u{2149}\u{214e}\u{2183}\u{2184}\u{2c00}-\u{2c7b}\u{2c7e}-\u{2ce4}\u{2ceb}-\u{2cee}\u{2cf2}\u{2cf3}\u{a640}-\u{a66d}\u{a680}-\u{a69b}\u{a722}-\u{a76f}\u{a771}-\u{a787}\u{a78b}-\u{a78e}\u{ab70}-\u{abbf}\u{fb00}-\u{fb06}\u{fb13}-\u{fb17}\u{ff21}-\u{ff3a}\u{ff41}-\u{ff5a}\u{10400}-\u{1044f}\u{104b0}-\u{104d3}\u{104d8}-\u{104fb}\u{10c80}-\u{10cb2}\u{10cc0}-\u{10cf2}\u{118a0}-\u{118df}\u{1e900}-\u{1e943}]+",
    "\\s?[!-/:-~\u{ff01}-\u{ff0f}\u{ff1a}-\u{ff5e}\u{2018}-\u{201f}\u{3000}-\u{3002}]+",
    "\\s+$",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    "\\p{N}+",
];
const DEEPSEEK_CODER_REGEXES: &[&str] = &[
    "[\u{d}\u{a}]",
    "\\s?\\p{L}+",
    "\\s?\\p{P}+",
    "[\u{4e00}-\u{9fa5}\u{800}-\u{4e00}\u{ac00}-\u{d7ff}]+",
    "\\p{N}",
];

/// The `tokenizer.ggml.pre` families this engine runs, for error messages.
pub const SUPPORTED_NAMES: &str = "default, gpt-2 (mpt, olmo, phi-2, ...), starcoder (refact, \
    command-r, smollm, codeshell, ...), llama-bpe (llama3, dbrx, ...), qwen2 (stablelm2, \
    deepseek-r1-qwen, ...), qwen35, deepseek-llm, deepseek-coder, falcon";

/// How text is split into words before BPE, by llama.cpp's `tokenizer.ggml.pre` name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// llama.cpp's default list (punctuation runs, GPT-2, digit runs, digit triples): files
    /// without a `pre` key, or "default".
    Default,
    /// GPT-2's regex (gpt-2, mpt, olmo, phi-2, ...).
    Gpt2,
    /// GPT-2's regex after splitting every digit apart (SmolLM, StarCoder, Refact, Command-R).
    Gpt2Digits,
    /// Llama 3 (digits in threes).
    Llama3,
    /// Qwen2 (single digits).
    Qwen2,
    /// Qwen3.5 (as Qwen2, combining marks inside words).
    Qwen35,
    /// DeepSeek LLM (Latin, CJK, punctuation and digit classes apart).
    DeepseekLlm,
    /// DeepSeek Coder.
    DeepseekCoder,
    /// Falcon.
    Falcon,
}

/// What llama.cpp's table sets for one `tokenizer.ggml.pre` name besides the split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreTokenizerSpec {
    pub kind: PreTokenizerKind,
    /// A word that is a whole vocabulary entry is taken as it is, without merges (Llama 3).
    pub ignore_merges: bool,
    /// Whether prompts start with BOS when the file has no `add_bos_token` key.
    pub add_bos: bool,
    /// `clean_up_tokenization_spaces`: whether a whole-sequence detokenize drops the space before
    /// `?!.,` and some apostrophes.
    pub clean_spaces: bool,
}

impl PreTokenizerKind {
    /// Maps a `tokenizer.ggml.pre` value; unknown names are refused rather than guessed, because
    /// a wrong split silently changes token ids and degrades the model.
    pub fn from_gguf_name(name: Option<&str>) -> Result<Self, PreTokenizerError> {
        PreTokenizerSpec::from_gguf_name(name).map(|s| s.kind)
    }

    /// The regexes applied in order (each splits the pieces the previous ones left), or `None`
    /// for the kinds built from Hugging Face's own pre-tokenizers.
    fn regexes(self) -> Option<&'static [&'static str]> {
        Some(match self {
            Self::Gpt2 | Self::Gpt2Digits | Self::Llama3 | Self::Qwen2 => return None,
            Self::Default => DEFAULT_REGEXES,
            Self::Qwen35 => &[QWEN35_REGEX],
            Self::DeepseekLlm => DEEPSEEK_LLM_REGEXES,
            Self::DeepseekCoder => DEEPSEEK_CODER_REGEXES,
            Self::Falcon => FALCON_REGEXES,
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
        if let Some(regexes) = self.regexes() {
            let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(regexes.len() + 1);
            for re in regexes {
                steps.push(split(re)?.into());
            }
            steps.push(ByteLevel::new(false, true, false).into());
            return Ok(Sequence::new(steps).into());
        }
        Ok(match self {
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
            _ => ByteLevel::new(false, true, true).into(),
        })
    }
}

impl PreTokenizerSpec {
    /// llama.cpp's table (`llama_vocab::impl::load`) for the names whose split this engine runs.
    pub fn from_gguf_name(name: Option<&str>) -> Result<Self, PreTokenizerError> {
        use PreTokenizerKind as K;
        let spec = |kind, clean_spaces| Self {
            kind,
            ignore_merges: false,
            add_bos: false,
            clean_spaces,
        };
        Ok(match name {
            None | Some("default") => spec(K::Default, true),
            Some(
                "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
                | "midm-2.0" | "lfm2" | "jina-v5-nano",
            ) => Self {
                ignore_merges: true,
                add_bos: true,
                ..spec(K::Llama3, true)
            },
            Some("dbrx" | "smaug-bpe") => spec(K::Llama3, true),
            Some("deepseek-llm") => spec(K::DeepseekLlm, false),
            Some("deepseek-coder") => spec(K::DeepseekCoder, false),
            Some("falcon") => spec(K::Falcon, true),
            // "gpt2" is no name of llama.cpp's: this engine's Hugging Face import wrote it before
            // it wrote "gpt-2", so files made then still load.
            Some(
                "gpt2" | "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
                | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "mpt" | "olmo" | "jais"
                | "exaone4",
            ) => spec(K::Gpt2, true),
            Some("trillion" | "granite-docling") => spec(K::Gpt2, false),
            Some("starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2") => {
                spec(K::Gpt2Digits, true)
            }
            Some("command-r" | "smollm") => spec(K::Gpt2Digits, false),
            Some("stablelm2" | "megrez") => spec(K::Qwen2, true),
            Some(
                "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
                | "grok-2",
            ) => spec(K::Qwen2, false),
            Some("qwen35") => spec(K::Qwen35, false),
            Some(other) => return Err(PreTokenizerError::Unsupported(other.to_string())),
        })
    }
}

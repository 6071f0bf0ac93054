//! A Hugging Face `tokenizer.json` (+ `tokenizer_config.json`) turned into the GGUF
//! `tokenizer.ggml.*` keys and `tokenizer.chat_template`, so
//! [`crate::text::tokenizer::Tokenizer::from_gguf`] builds it as it builds a GGUF's. Two ways:
//!
//! - a GPT-2 style byte-level BPE whose pre-tokenizer this engine implements
//!   ([`PreTokenizerKind`]) gets the keys convert_hf_to_gguf writes for it, and the engine's own
//!   BPE encodes. convert_hf_to_gguf names the pre-tokenizer by hashing the tokenizer's output on
//!   a test text; here the `pre_tokenizer` JSON is compared with the ones implemented.
//! - every other tokenizer (SentencePiece-style BPE with byte fallback: Llama 2, Mistral, Gemma,
//!   Phi-3; Unigram; a byte-level BPE split some other way) is encoded by the file's own
//!   pipeline through the `tokenizers` crate (`text::hf_model`): the whole file goes
//!   under GGUF's `tokenizer.huggingface.json`, beside the vocabulary, token types, scores and
//!   special ids the engine decodes with (`tokenizer.ggml.model` "llama" where tokens decode as
//!   SentencePiece pieces, `▁` a space and `<0xXX>` a byte; "gpt2" where they are byte-level).
//!   A quantized GGUF written from the folder keeps the file, and so its ids; the scores
//!   (Unigram's own, else minus the id, the order SentencePiece's BPE merges by) are what
//!   llama.cpp would tokenize that GGUF with.
//!
//! A tokenizer whose tokens do not decode one by one (WordPiece's `##` joins, a decoder this
//! engine does not know) is refused: streaming, stop strings and grammar constraints work on
//! each token's own bytes. The file is refused past [`MAX_TOKENIZER_JSON`] before it is read.

use std::path::Path;

use serde_json::Value as Json;

use crate::formats::gguf::Value;
use crate::formats::hf::{
    HfConfig, HfError, MAX_TOKENIZER_JSON, TOKENIZER, TOKENIZER_CONFIG, read_json, read_json_text,
};
use crate::formats::pretokenizer::PreTokenizerKind;

/// GGUF's key for a whole Hugging Face `tokenizer.json` (for executors that run one directly).
pub const KEY_HF_JSON: &str = "tokenizer.huggingface.json";

/// The byte a `<0xXX>` token stands for.
pub(crate) fn hex_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// GGUF token types.
const NORMAL: i32 = 1;
const UNKNOWN: i32 = 2;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;
const BYTE: i32 = 6;

/// How a tokenizer's tokens decode one by one, from its `decoder`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pieces {
    /// GPT-2's byte-level alphabet.
    ByteLevel,
    /// SentencePiece's: `▁` a space, `<0xXX>` a byte (Metaspace, or Replace + ByteFallback).
    SentencePiece,
}

/// The decoder's [`Pieces`], or why its tokens do not decode one by one.
fn pieces_of(decoder: &Json) -> Result<Pieces, String> {
    let ty = decoder.get("type").and_then(Json::as_str).unwrap_or("none");
    let list: Vec<&Json> = match ty {
        "Sequence" => decoder
            .get("decoders")
            .and_then(Json::as_array)
            .map(|d| d.iter().collect())
            .unwrap_or_default(),
        _ => vec![decoder],
    };
    let mut found = None;
    for d in list {
        let t = d.get("type").and_then(Json::as_str).unwrap_or("none");
        let replaces_mark = d
            .get("pattern")
            .and_then(|p| p.get("String"))
            .and_then(Json::as_str)
            == Some("\u{2581}")
            && d.get("content").and_then(Json::as_str) == Some(" ");
        let this = match t {
            "ByteLevel" => Pieces::ByteLevel,
            "Metaspace" | "ByteFallback" => Pieces::SentencePiece,
            "Replace" if replaces_mark => Pieces::SentencePiece,
            // Joining and trimming the pieces: the engine's `detokenize` does the same.
            "Fuse" | "Strip" => continue,
            _ => {
                return Err(format!(
                    "its decoder '{t}' does not decode tokens one by one"
                ));
            }
        };
        if found.is_some_and(|f| f != this) {
            return Err("its decoder mixes byte-level and SentencePiece pieces".into());
        }
        found = Some(this);
    }
    found.ok_or_else(|| format!("its decoder '{ty}' does not say how tokens decode"))
}

/// Whether the pipeline puts a `▁` before the text (Llama 2's `Prepend` normalizer, Metaspace's
/// prepend scheme), which decoding takes off again.
fn adds_space_prefix(tj: &Json) -> bool {
    fn any(v: &Json, list_key: &str, f: &dyn Fn(&Json) -> bool) -> bool {
        match v.get(list_key).and_then(Json::as_array) {
            Some(list) => list.iter().any(|x| any(x, list_key, f)),
            None => f(v),
        }
    }
    let prepend = |n: &Json| {
        n.get("type").and_then(Json::as_str) == Some("Prepend")
            && n.get("prepend").and_then(Json::as_str) == Some("\u{2581}")
    };
    let metaspace = |p: &Json| {
        p.get("type").and_then(Json::as_str) == Some("Metaspace")
            && match p.get("prepend_scheme").and_then(Json::as_str) {
                Some(scheme) => scheme != "never",
                None => p.get("add_prefix_space").and_then(Json::as_bool) != Some(false),
            }
    };
    let null = Json::Null;
    any(
        tj.get("normalizer").unwrap_or(&null),
        "normalizers",
        &prepend,
    ) || any(
        tj.get("pre_tokenizer").unwrap_or(&null),
        "pretokenizers",
        &metaspace,
    )
}

/// The pre-tokenizers this engine implements, with the `tokenizer.ggml.pre` name each is written
/// under.
const KINDS: [(PreTokenizerKind, &str); 4] = [
    (PreTokenizerKind::Gpt2, "gpt-2"),
    (PreTokenizerKind::Gpt2Digits, "smollm"),
    (PreTokenizerKind::Llama3, "llama-bpe"),
    (PreTokenizerKind::Qwen2, "qwen2"),
];

/// What decides how a pre-tokenizer splits text, flattened: equal signatures split alike.
fn signature(v: &Json, out: &mut Vec<String>) {
    let s = |k: &str| v.get(k).map_or("null".to_string(), Json::to_string);
    match v.get("type").and_then(Json::as_str) {
        Some("Sequence") => {
            for p in v
                .get("pretokenizers")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                signature(p, out);
            }
        }
        Some("ByteLevel") => out.push(format!(
            "ByteLevel(prefix {}, regex {})",
            v.get("add_prefix_space")
                .and_then(Json::as_bool)
                .unwrap_or(false),
            v.get("use_regex").and_then(Json::as_bool).unwrap_or(true)
        )),
        Some("Digits") => out.push(format!("Digits({})", s("individual_digits"))),
        Some("Split") => out.push(format!(
            "Split({}, {}, {})",
            s("pattern"),
            s("behavior"),
            s("invert")
        )),
        other => out.push(other.unwrap_or("untyped").to_string()),
    }
}

/// The `tokenizer.ggml.pre` name of the engine's pre-tokenizer that splits as `pre` does.
fn pre_name(pre: &Json) -> Option<&'static str> {
    let mut want = Vec::new();
    signature(pre, &mut want);
    for (kind, name) in KINDS {
        let ours = kind
            .build()
            .ok()
            .and_then(|p| serde_json::to_value(&p).ok());
        let mut sig = Vec::new();
        if let Some(ours) = ours {
            signature(&ours, &mut sig);
        }
        if sig == want {
            return Some(name);
        }
    }
    None
}

/// A special token's text in tokenizer_config.json: a string or `{"content": ...}`.
fn token_text(v: &Json) -> Option<&str> {
    v.as_str()
        .or_else(|| v.get("content").and_then(Json::as_str))
}

/// An id from config.json: a number or a list whose first entry is one.
fn config_id(v: Option<&Json>) -> Option<u64> {
    let v = v?;
    v.as_u64()
        .or_else(|| v.as_array()?.first().and_then(Json::as_u64))
}

/// The GGUF tokenizer keys (and chat template) for the folder `dir`.
pub fn metadata(dir: &Path, cfg: &HfConfig) -> Result<Vec<(String, Value)>, HfError> {
    let path = dir.join(TOKENIZER);
    let (tj, text) = read_json_text(&path, MAX_TOKENIZER_JSON)?;
    let bad = |what: String| HfError::Tokenizer {
        path: path.clone(),
        what,
    };
    let model = tj.get("model").ok_or_else(|| bad("no model".into()))?;
    let ty = model.get("type").and_then(Json::as_str).unwrap_or("");
    if !matches!(ty, "BPE" | "Unigram") {
        return Err(bad(format!(
            "the tokenizer model is '{ty}': only BPE (byte-level or with SentencePiece pieces) \
             and Unigram are supported"
        )));
    }
    let byte_fallback = model.get("byte_fallback").and_then(Json::as_bool) == Some(true);
    let pieces = match tj.get("decoder") {
        // No decoder: a plain BPE is taken as byte-level, as before decoders were read.
        None | Some(Json::Null) if ty == "BPE" && !byte_fallback => Pieces::ByteLevel,
        d => pieces_of(d.unwrap_or(&Json::Null)).map_err(bad)?,
    };
    // The engine's own byte-level BPE, where it implements this pre-tokenizer (and the
    // normalizer changes nothing it would not: llama.cpp ignores Qwen2's NFC too).
    let plain_normalizer = match tj.get("normalizer") {
        None | Some(Json::Null) => true,
        Some(n) => n.get("type").and_then(Json::as_str) == Some("NFC"),
    };
    let own_pre =
        (ty == "BPE" && !byte_fallback && pieces == Pieces::ByteLevel && plain_normalizer)
            .then(|| pre_name(tj.get("pre_tokenizer").unwrap_or(&Json::Null)))
            .flatten();

    let n = cfg.vocab_size as usize;
    let (tokens, types, scores) = vocabulary(&tj, model, n, &path)?;
    let id_of = |text: &str| {
        tokens
            .iter()
            .position(|t| t.as_str() == Some(text))
            .map(|i| i as u64)
    };
    let tc_path = dir.join(TOKENIZER_CONFIG);
    let tc = if tc_path.is_file() {
        read_json(&tc_path)?
    } else {
        Json::Null
    };
    let special_id = |key: &str| tc.get(key).and_then(token_text).and_then(id_of);
    let bos = special_id("bos_token").or(config_id(cfg.bos_token_id.as_ref()));
    let eos = special_id("eos_token").or(config_id(cfg.eos_token_id.as_ref()));
    let (unk, pad) = (special_id("unk_token"), special_id("pad_token"));
    let mut out: Vec<(String, Value)> = Vec::new();
    let mut put = |key: &str, v: Value| out.push((key.to_string(), v));
    match own_pre {
        Some(pre) => {
            put("tokenizer.ggml.model", Value::String("gpt2".into()));
            put("tokenizer.ggml.pre", Value::String(pre.into()));
            put("tokenizer.ggml.tokens", Value::Array(tokens));
            put("tokenizer.ggml.merges", Value::Array(merges(model, &path)?));
        }
        None => {
            let kind = match pieces {
                Pieces::ByteLevel => "gpt2",
                Pieces::SentencePiece => "llama",
            };
            put("tokenizer.ggml.model", Value::String(kind.into()));
            put("tokenizer.ggml.tokens", Value::Array(tokens));
            put(
                "tokenizer.ggml.scores",
                Value::Array(scores.into_iter().map(Value::F32).collect()),
            );
            put(
                "tokenizer.ggml.add_space_prefix",
                Value::Bool(adds_space_prefix(&tj)),
            );
            put(
                "tokenizer.ggml.add_eos_token",
                Value::Bool(add_eos(&tc, &tj)),
            );
            put(KEY_HF_JSON, Value::String(text));
        }
    }
    put(
        "tokenizer.ggml.token_type",
        Value::Array(types.into_iter().map(Value::I32).collect()),
    );
    for (key, id) in [
        ("bos_token_id", bos),
        ("eos_token_id", eos),
        ("unknown_token_id", unk),
        ("padding_token_id", pad),
    ] {
        if let Some(id) = id.filter(|&id| id < n as u64) {
            put(&format!("tokenizer.ggml.{key}"), Value::U32(id as u32));
        }
    }
    put(
        "tokenizer.ggml.add_bos_token",
        Value::Bool(add_bos(&tc, &tj)),
    );
    if let Some(t) = chat_template(dir, &tc)? {
        put("tokenizer.chat_template", Value::String(t));
    }
    Ok(out)
}

/// Token strings, GGUF token types and scores, by id.
type Vocabulary = (Vec<Value>, Vec<i32>, Vec<f32>);

/// Token strings, GGUF token types and scores by id: the model's vocabulary (an object of ids,
/// or Unigram's list of `[piece, score]`), `<0xXX>` pieces as bytes where the model falls back
/// to them, its unknown token, and the added tokens (control when special, user-defined
/// otherwise), padded to config.json's `n` with `[PAD{id}]`. Scores are Unigram's own, else
/// minus the id.
fn vocabulary(tj: &Json, model: &Json, n: usize, path: &Path) -> Result<Vocabulary, HfError> {
    let bad = |what: String| HfError::Tokenizer {
        path: path.into(),
        what,
    };
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![NORMAL; n];
    let mut scores: Vec<f32> = (0..n).map(|i| -(i as f32)).collect();
    let mut put = |id: Option<u64>, tok: &str, what: &str| -> Result<usize, HfError> {
        let id = id.ok_or_else(|| bad(format!("{what} '{tok}' has no integer id")))?;
        let slot = tokens.get_mut(id as usize).ok_or_else(|| {
            bad(format!(
                "{what} '{tok}' has id {id}, past config.json's vocab_size {n}"
            ))
        })?;
        *slot = Some(tok.to_string());
        Ok(id as usize)
    };
    let byte_fallback = model.get("byte_fallback").and_then(Json::as_bool) == Some(true);
    let vocab = model.get("vocab");
    let unk = match (
        vocab.and_then(Json::as_object),
        vocab.and_then(Json::as_array),
    ) {
        (Some(vocab), _) => {
            for (tok, id) in vocab {
                put(id.as_u64(), tok, "token")?;
            }
            let unk = model.get("unk_token").and_then(Json::as_str);
            unk.and_then(|u| vocab.get(u)).and_then(Json::as_u64)
        }
        (_, Some(list)) => {
            for (id, entry) in list.iter().enumerate() {
                let (tok, score) = match entry.as_array().map(Vec::as_slice) {
                    Some([t, s]) => (t.as_str(), s.as_f64()),
                    _ => (None, None),
                };
                let (Some(tok), Some(score)) = (tok, score) else {
                    return Err(bad(format!("model.vocab[{id}] is not [piece, score]")));
                };
                let id = put(Some(id as u64), tok, "token")?;
                scores[id] = score as f32;
            }
            model.get("unk_id").and_then(Json::as_u64)
        }
        _ => return Err(bad("model.vocab is neither an object nor a list".into())),
    };
    for a in tj
        .get("added_tokens")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let tok = a
            .get("content")
            .and_then(Json::as_str)
            .ok_or_else(|| bad("an added token has no content".into()))?;
        let id = put(a.get("id").and_then(Json::as_u64), tok, "added token")?;
        let special = a.get("special").and_then(Json::as_bool).unwrap_or(false);
        types[id] = if special { CONTROL } else { USER_DEFINED };
    }
    if byte_fallback {
        for (ty, tok) in types.iter_mut().zip(&tokens) {
            if *ty == NORMAL && tok.as_deref().and_then(hex_byte_token).is_some() {
                *ty = BYTE;
            }
        }
    }
    if let Some(ty) = unk.and_then(|id| types.get_mut(id as usize)) {
        *ty = UNKNOWN;
    }
    let tokens: Vec<Value> = tokens
        .into_iter()
        .enumerate()
        .map(|(i, t)| match t {
            Some(t) => Value::String(t),
            None => {
                types[i] = USER_DEFINED;
                Value::String(format!("[PAD{i}]"))
            }
        })
        .collect();
    Ok((tokens, types, scores))
}

/// The merges, as "a b" strings (tokenizer.json has them so or as `[a, b]` pairs).
fn merges(model: &Json, path: &Path) -> Result<Vec<Value>, HfError> {
    let bad = |what: String| HfError::Tokenizer {
        path: path.into(),
        what,
    };
    model
        .get("merges")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
        .map(|m| match (m.as_str(), m.as_array().map(Vec::as_slice)) {
            (Some(s), _) => Ok(Value::String(s.to_string())),
            (_, Some([a, b])) => match (a.as_str(), b.as_str()) {
                (Some(a), Some(b)) => Ok(Value::String(format!("{a} {b}"))),
                _ => Err(bad(format!("merge {m} is not two strings"))),
            },
            _ => Err(bad(format!("merge {m} is not \"a b\" or [a, b]"))),
        })
        .collect()
}

/// The post-processor's template for one sequence (TemplateProcessing's `single`, alone or in
/// a Sequence of processors).
fn post_single(tj: &Json) -> Option<&Vec<Json>> {
    let pp = tj.get("post_processor")?;
    pp.get("single").and_then(Json::as_array).or_else(|| {
        pp.get("processors")?
            .as_array()?
            .iter()
            .find_map(|p| p.get("single")?.as_array())
    })
}

/// tokenizer_config.json's `add_bos_token`, else whether tokenizer.json's post-processor puts
/// a special token first (as convert_hf_to_gguf decides).
fn add_bos(tc: &Json, tj: &Json) -> bool {
    if let Some(b) = tc.get("add_bos_token").and_then(Json::as_bool) {
        return b;
    }
    post_single(tj)
        .and_then(|s| s.first())
        .is_some_and(|first| first.get("SpecialToken").is_some())
}

/// tokenizer_config.json's `add_eos_token`, else whether tokenizer.json's post-processor puts
/// a special token last (T5's `</s>`).
fn add_eos(tc: &Json, tj: &Json) -> bool {
    if let Some(b) = tc.get("add_eos_token").and_then(Json::as_bool) {
        return b;
    }
    post_single(tj)
        .and_then(|s| s.last())
        .is_some_and(|last| last.get("SpecialToken").is_some())
}

/// The chat template: tokenizer_config.json's `chat_template` (a string, or the "default" of a
/// list of named ones), else a `chat_template.jinja` file.
fn chat_template(dir: &Path, tc: &Json) -> Result<Option<String>, HfError> {
    match tc.get("chat_template") {
        Some(Json::String(s)) => return Ok(Some(s.clone())),
        Some(Json::Array(list)) => {
            let pick = list
                .iter()
                .find(|t| t.get("name").and_then(Json::as_str) == Some("default"))
                .or_else(|| list.first());
            if let Some(t) = pick.and_then(|t| t.get("template")).and_then(Json::as_str) {
                return Ok(Some(t.to_string()));
            }
        }
        _ => {}
    }
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        let text = std::fs::read_to_string(&jinja).map_err(|source| HfError::Io {
            path: jinja,
            source,
        })?;
        return Ok(Some(text));
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_byte_tokens() {
        assert_eq!(hex_byte_token("<0x0A>"), Some(10));
        assert_eq!(hex_byte_token("<0xFF>"), Some(255));
        assert_eq!(hex_byte_token("<0x1>"), None);
        assert_eq!(hex_byte_token("<0xZZ>"), None);
        assert_eq!(hex_byte_token("0x0A"), None);
    }
}

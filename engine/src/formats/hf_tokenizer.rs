//! A Hugging Face `tokenizer.json` (+ `tokenizer_config.json`) turned into the GGUF
//! `tokenizer.ggml.*` keys and `tokenizer.chat_template`, as convert_hf_to_gguf writes them for a
//! GPT-2 style byte-level BPE, so [`crate::text::tokenizer::Tokenizer::from_gguf`] builds it unchanged.
//!
//! convert_hf_to_gguf names the pre-tokenizer by hashing the tokenizer's output on a test text;
//! here the `pre_tokenizer` JSON is compared with the ones this engine implements
//! ([`PreTokenizerKind`]), and anything else is refused, since a wrong split silently changes ids.

use std::path::Path;

use serde_json::Value as Json;

use crate::formats::gguf::Value;
use crate::formats::hf::{HfConfig, HfError, TOKENIZER, TOKENIZER_CONFIG, read_json};
use crate::formats::pretokenizer::PreTokenizerKind;

/// GGUF token types.
const NORMAL: i32 = 1;
const CONTROL: i32 = 3;
const USER_DEFINED: i32 = 4;

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

fn pre_name(pre: &Json, path: &Path) -> Result<&'static str, HfError> {
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
            return Ok(name);
        }
    }
    Err(HfError::Tokenizer {
        path: path.into(),
        what: format!(
            "the pre-tokenizer [{}] is not one this engine implements (GPT-2, SmolLM/StarCoder \
             digits, Llama 3, Qwen2)",
            want.join(", ")
        ),
    })
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
    let tj = read_json(&path)?;
    let bad = |what: String| HfError::Tokenizer {
        path: path.clone(),
        what,
    };
    let model = tj.get("model").ok_or_else(|| bad("no model".into()))?;
    let ty = model.get("type").and_then(Json::as_str).unwrap_or("");
    if ty != "BPE" || model.get("byte_fallback").and_then(Json::as_bool) == Some(true) {
        return Err(bad(format!(
            "the tokenizer model is '{ty}'{}: only GPT-2 style byte-level BPE is supported",
            if ty == "BPE" {
                " with byte fallback"
            } else {
                ""
            }
        )));
    }
    match tj.get("normalizer") {
        // llama.cpp ignores Qwen2's NFC too; anything else would change the text before BPE.
        None | Some(Json::Null) => {}
        Some(n) if n.get("type").and_then(Json::as_str) == Some("NFC") => {}
        Some(n) => return Err(bad(format!("normalizer {n} is not supported"))),
    }
    let pre = pre_name(tj.get("pre_tokenizer").unwrap_or(&Json::Null), &path)?;

    let n = cfg.vocab_size as usize;
    let (tokens, types) = vocabulary(&tj, model, n, &path)?;
    let merges = merges(model, &path)?;
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
    let mut out = vec![
        (
            "tokenizer.ggml.model".to_string(),
            Value::String("gpt2".into()),
        ),
        ("tokenizer.ggml.pre".into(), Value::String(pre.into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), Value::Array(merges)),
    ];
    for (key, id) in [
        ("bos_token_id", bos),
        ("eos_token_id", eos),
        ("unknown_token_id", unk),
        ("padding_token_id", pad),
    ] {
        if let Some(id) = id.filter(|&id| id < n as u64) {
            out.push((format!("tokenizer.ggml.{key}"), Value::U32(id as u32)));
        }
    }
    out.push((
        "tokenizer.ggml.add_bos_token".into(),
        Value::Bool(add_bos(&tc, &tj)),
    ));
    if let Some(t) = chat_template(dir, &tc)? {
        out.push(("tokenizer.chat_template".into(), Value::String(t)));
    }
    Ok(out)
}

/// Token strings and GGUF token types by id: the BPE vocabulary and the added tokens (control
/// when special, user-defined otherwise), padded to config.json's `n` with `[PAD{id}]`.
fn vocabulary(
    tj: &Json,
    model: &Json,
    n: usize,
    path: &Path,
) -> Result<(Vec<Value>, Vec<i32>), HfError> {
    let bad = |what: String| HfError::Tokenizer {
        path: path.into(),
        what,
    };
    let mut tokens: Vec<Option<String>> = vec![None; n];
    let mut types = vec![NORMAL; n];
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
    let vocab = model
        .get("vocab")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("model.vocab is not an object".into()))?;
    for (tok, id) in vocab {
        put(id.as_u64(), tok, "token")?;
    }
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
    Ok((tokens, types))
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

/// tokenizer_config.json's `add_bos_token`, else whether tokenizer.json's post-processor puts
/// a special token first (as convert_hf_to_gguf decides).
fn add_bos(tc: &Json, tj: &Json) -> bool {
    if let Some(b) = tc.get("add_bos_token").and_then(Json::as_bool) {
        return b;
    }
    let pp = tj.get("post_processor").unwrap_or(&Json::Null);
    let single = pp.get("single").and_then(Json::as_array).or_else(|| {
        pp.get("processors")?
            .as_array()?
            .iter()
            .find_map(|p| p.get("single")?.as_array())
    });
    single
        .and_then(|s| s.first())
        .is_some_and(|first| first.get("SpecialToken").is_some())
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

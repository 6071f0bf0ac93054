//! Token log-probabilities in OpenAI's two shapes: chat's `logprobs.content` (a list of
//! `{token, logprob, bytes, top_logprobs}`) and completions' `logprobs` (parallel lists
//! `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`). A token's text is its bytes as
//! UTF-8 (a token that is part of a character shows U+FFFD; `bytes` is exact); a log-probability
//! of `-inf` is sent as -9999.0, as vLLM does, since JSON has no infinity. vLLM's
//! `prompt_logprobs` ([`prompt`]) have their own shape: per position, token id to
//! `{logprob, rank, decoded_token}`.

use serde_json::{Map, Value, json};
use tpslab_engine::serving::logprobs::TokenLogprob;
use tpslab_engine::text::tokenizer::Tokenizer;

/// One generated token with its log-probabilities.
pub type Scored = (u32, TokenLogprob);

/// What JSON carries for `ln p`.
fn finite(lp: f32) -> f64 {
    if lp.is_finite() {
        f64::from(lp)
    } else {
        -9999.0
    }
}

/// A token's text and bytes (empty for an id outside the vocabulary).
pub fn token_text(tok: &Tokenizer, id: u32) -> (String, &[u8]) {
    let bytes = tok.token_bytes(id).unwrap_or_default();
    (String::from_utf8_lossy(bytes).into_owned(), bytes)
}

/// How tokens are named in the log-probabilities.
#[derive(Clone, Copy)]
pub struct Names<'a> {
    pub tok: &'a Tokenizer,
    /// vLLM's `return_tokens_as_token_ids`: each token is named `token_id:<id>`.
    pub as_ids: bool,
}

impl Names<'_> {
    fn name(&self, id: u32) -> (String, &[u8]) {
        let (text, bytes) = token_text(self.tok, id);
        if self.as_ids {
            (format!("token_id:{id}"), bytes)
        } else {
            (text, bytes)
        }
    }
}

fn chat_entry(names: Names<'_>, id: u32, lp: f32) -> Map<String, Value> {
    let (text, bytes) = names.name(id);
    let mut m = Map::new();
    m.insert("token".into(), json!(text));
    m.insert("logprob".into(), json!(finite(lp)));
    m.insert("bytes".into(), json!(bytes));
    m
}

/// Chat's `logprobs` object for these tokens.
pub fn chat(names: Names<'_>, items: &[Scored]) -> Value {
    let content: Vec<Value> = items
        .iter()
        .map(|(id, lp)| {
            let mut e = chat_entry(names, *id, lp.logprob);
            let top: Vec<Value> = lp
                .top
                .iter()
                .map(|&(t, l)| Value::Object(chat_entry(names, t, l)))
                .collect();
            e.insert("top_logprobs".into(), Value::Array(top));
            Value::Object(e)
        })
        .collect();
    json!({"content": content, "refusal": null})
}

/// Completions' `logprobs` for these tokens; `offset` is where the first one starts in the
/// choice's text, and is moved past them. `top_logprobs` maps each alternative's text to its
/// log-probability, the chosen token included (vLLM's shape); tokens with the same text keep
/// the higher one. Offsets count the tokens' text, whatever they are named. A token without
/// log-probabilities (an echoed prompt's first) has `null` for both.
pub fn completion<'a>(
    names: Names<'_>,
    items: impl IntoIterator<Item = (u32, Option<&'a TokenLogprob>)>,
    offset: &mut usize,
) -> Value {
    let (mut tokens, mut lps, mut tops, mut offsets) = (vec![], vec![], vec![], vec![]);
    for (id, lp) in items {
        let (text, _) = names.name(id);
        offsets.push(*offset);
        *offset += token_text(names.tok, id).0.len();
        tokens.push(json!(text));
        let Some(lp) = lp else {
            lps.push(Value::Null);
            tops.push(Value::Null);
            continue;
        };
        let mut top = Map::new();
        for &(t, l) in lp.top.iter().chain(std::iter::once(&(id, lp.logprob))) {
            let (k, _) = names.name(t);
            let v = finite(l);
            let keep = top
                .get(&k)
                .and_then(Value::as_f64)
                .is_none_or(|old| v > old);
            if keep {
                top.insert(k, json!(v));
            }
        }
        lps.push(json!(finite(lp.logprob)));
        tops.push(Value::Object(top));
    }
    json!({
        "tokens": tokens,
        "token_logprobs": lps,
        "top_logprobs": tops,
        "text_offset": offsets,
    })
}

/// vLLM's `prompt_logprobs`: `null` for the first prompt token, then per position a map of token
/// id (as a string) to `{logprob, rank, decoded_token}` holding the prompt's token (its rank in
/// the row) and the `k` most likely (ranks 1 to `k`; a prompt token among them keeps that
/// rank, as vLLM's map does). `lps[i]` scores `ids[i + 1]`.
pub fn prompt(tok: &Tokenizer, ids: &[u32], lps: &[TokenLogprob], k: usize) -> Value {
    let entry = |id: u32, lp: f32, rank: u32| json!({"logprob": finite(lp), "rank": rank, "decoded_token": token_text(tok, id).0});
    let first = ids.first().map(|_| Value::Null);
    let rest = ids.iter().skip(1).zip(lps).map(|(&id, lp)| {
        let mut m = Map::new();
        m.insert(id.to_string(), entry(id, lp.logprob, lp.rank));
        for (r, &(t, l)) in (1u32..).zip(lp.top.iter().take(k)) {
            m.insert(t.to_string(), entry(t, l, r));
        }
        Value::Object(m)
    });
    Value::Array(first.into_iter().chain(rest).collect())
}

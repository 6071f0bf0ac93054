//! Token log-probabilities in OpenAI's two shapes: chat's `logprobs.content` (a list of
//! `{token, logprob, bytes, top_logprobs}`) and completions' `logprobs` (parallel lists
//! `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`). A token's text is its bytes as
//! UTF-8 (a token that is part of a character shows U+FFFD; `bytes` is exact); a log-probability
//! of `-inf` is sent as -9999.0, as vLLM does, since JSON has no infinity. vLLM's
//! `prompt_logprobs` ([`PromptPieces`]) have their own shape: per position, token id to
//! `{logprob, rank, decoded_token}`. The two shapes a prompt's positions fill are written a
//! slice at a time ([`CompletionPieces`], [`PromptPieces`]), so a whole answer streams them
//! ([`super::json_body`]).

use serde_json::{Map, Value, json};

use super::json_body::Pieces;
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

/// Items written per call of a writer's `write_next`.
const ITEMS_PER_PIECE: usize = 128;

/// Completions' `logprobs` for these tokens, written a slice at a time: the parallel lists
/// `tokens`, `token_logprobs`, `top_logprobs` and `text_offset` one after the other.
/// `top_logprobs` maps each alternative's text to its log-probability, the chosen token
/// included (vLLM's shape); tokens with the same text keep the higher one. Offsets count the
/// tokens' text, whatever they are named. A token without log-probabilities (an echoed
/// prompt's first) has `null` for both.
pub struct CompletionPieces {
    tok: Tokenizer,
    as_ids: bool,
    items: Vec<(u32, Option<TokenLogprob>)>,
    /// 0 to 3: the list being written; 4: done.
    list: usize,
    pos: usize,
    /// The text offset of the next token (in the `text_offset` list).
    offset: usize,
}

const COMPLETION_LISTS: [&str; 4] = ["tokens", "token_logprobs", "top_logprobs", "text_offset"];

impl CompletionPieces {
    /// The writer of `items`, the first of which starts at `offset` in the choice's text.
    pub fn new(names: Names<'_>, items: Vec<(u32, Option<TokenLogprob>)>, offset: usize) -> Self {
        Self {
            tok: names.tok.clone(),
            as_ids: names.as_ids,
            items,
            list: 0,
            pos: 0,
            offset,
        }
    }

    /// Where the text after the tokens written starts (moved as `text_offset` is written).
    pub fn offset(&self) -> usize {
        self.offset
    }

    fn item(&mut self, i: usize) -> Value {
        let names = Names {
            tok: &self.tok,
            as_ids: self.as_ids,
        };
        let (id, lp) = &self.items[i];
        match (self.list, lp) {
            (0, _) => json!(names.name(*id).0),
            (1 | 2, None) => Value::Null,
            (1, Some(lp)) => json!(finite(lp.logprob)),
            (2, Some(lp)) => {
                let mut top = Map::new();
                for &(t, l) in lp.top.iter().chain(std::iter::once(&(*id, lp.logprob))) {
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
                Value::Object(top)
            }
            _ => {
                let at = self.offset;
                self.offset += token_text(&self.tok, *id).0.len();
                json!(at)
            }
        }
    }
}

impl Pieces for CompletionPieces {
    fn write_next(&mut self, out: &mut String) -> bool {
        let Some(name) = COMPLETION_LISTS.get(self.list) else {
            return false;
        };
        if self.pos == 0 {
            out.push_str(if self.list == 0 { "{" } else { "," });
            out.push_str(&format!("\"{name}\":["));
        }
        let end = (self.pos + ITEMS_PER_PIECE).min(self.items.len());
        for i in self.pos..end {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&self.item(i).to_string());
        }
        self.pos = end;
        if self.pos == self.items.len() {
            out.push(']');
            self.list += 1;
            self.pos = 0;
            if self.list == COMPLETION_LISTS.len() {
                out.push('}');
                return false;
            }
        }
        true
    }
}

/// vLLM's `prompt_logprobs`, written a slice of positions at a time: `null` for the first
/// prompt token, then per position a map of token id (as a string) to
/// `{logprob, rank, decoded_token}` holding the prompt's token (its rank in the row) and the
/// `k` most likely (ranks 1 to `k`; a prompt token among them keeps that rank, as vLLM's map
/// does). `lps[i]` scores `ids[i + 1]`.
pub struct PromptPieces {
    tok: Tokenizer,
    ids: Vec<u32>,
    lps: Vec<TokenLogprob>,
    k: usize,
    /// Positions written (the first's `null` included).
    pos: usize,
}

impl PromptPieces {
    pub fn new(tok: &Tokenizer, ids: Vec<u32>, lps: Vec<TokenLogprob>, k: usize) -> Self {
        Self {
            tok: tok.clone(),
            ids,
            lps,
            k,
            pos: 0,
        }
    }

    /// Positions in all: the first's `null`, then one per scored token.
    fn len(&self) -> usize {
        if self.ids.is_empty() {
            0
        } else {
            1 + (self.ids.len() - 1).min(self.lps.len())
        }
    }

    fn position(&self, p: usize) -> Value {
        let (id, lp) = (self.ids[p], &self.lps[p - 1]);
        let entry = |id: u32, lp: f32, rank: u32| json!({"logprob": finite(lp), "rank": rank, "decoded_token": token_text(&self.tok, id).0});
        let mut m = Map::new();
        m.insert(id.to_string(), entry(id, lp.logprob, lp.rank));
        for (r, &(t, l)) in (1u32..).zip(lp.top.iter().take(self.k)) {
            m.insert(t.to_string(), entry(t, l, r));
        }
        Value::Object(m)
    }
}

impl Pieces for PromptPieces {
    fn write_next(&mut self, out: &mut String) -> bool {
        let len = self.len();
        if self.pos == 0 {
            out.push('[');
            if len > 0 {
                out.push_str("null");
                self.pos = 1;
            }
        }
        let end = (self.pos + ITEMS_PER_PIECE).min(len);
        for p in self.pos..end {
            out.push(',');
            out.push_str(&self.position(p).to_string());
        }
        self.pos = end;
        if self.pos < len {
            return true;
        }
        out.push(']');
        false
    }
}

//! Stop criteria: when a request's generation ends (stop token, stop string, token limit) and
//! which text may be streamed so far, holding back anything that could turn into a stop string.
//!
//! As in OpenAI's API and vLLM, a matched stop string ends the output and is not part of it, and
//! a stop token's own text is never emitted. Stop strings can span tokens, so text that is a
//! prefix of some stop string is held until it is clearly not one.

use serde::{Deserialize, Serialize};

/// When to end a request's generation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct StopCriteria {
    /// At most this many generated tokens (the stop token counts); `None` = no limit here. The
    /// engine's admission replaces `None` with as many as fit the context and the KV pool.
    pub max_tokens: Option<usize>,
    /// Tokens that end generation: usually the model's `Tokenizer::stop_token_ids()` plus any
    /// the caller adds.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end generation; the output is cut before the first match. Empty ones are ignored.
    pub stop_strings: Vec<String>,
    /// Benchmark mode: ignore the stop tokens and always run to `max_tokens` (stop strings still apply).
    pub ignore_eos: bool,
}

impl StopCriteria {
    /// Stop on the given tokens (e.g. the tokenizer's stop set), after at most `max_tokens`.
    pub fn new(max_tokens: Option<usize>, stop_token_ids: Vec<u32>) -> Self {
        Self {
            max_tokens,
            stop_token_ids,
            ..Self::default()
        }
    }
}

/// Why a request finished, serialized as OpenAI's `finish_reason` ("stop", "length") plus
/// vLLM's "abort" for requests cancelled or dropped by the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FinishReason {
    /// A stop token or stop string was generated.
    Stop,
    /// The token limit was reached.
    Length,
    /// Cancelled by the client or dropped by the engine.
    Abort,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::Abort => "abort",
        }
    }
}

impl std::fmt::Display for FinishReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What exactly matched when a request stopped with [`FinishReason::Stop`] (vLLM's `stop_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StopMatch {
    Token(u32),
    String(String),
}

/// The outcome of feeding one token to a [`StopChecker`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StopStep {
    /// Text that may be shown now (possibly empty).
    pub text: String,
    /// Set on the step that ends the request.
    pub finish: Option<FinishReason>,
    pub matched: Option<StopMatch>,
}

/// Applies [`StopCriteria`] to one request's stream of (token, decoded text).
#[derive(Debug, Clone)]
pub struct StopChecker {
    criteria: StopCriteria,
    /// Text not yet emitted because it may be the start of a stop string.
    held: String,
    n_tokens: usize,
    finished: Option<FinishReason>,
    /// Finished on a stop string: everything after it is dropped, including later flushes.
    cut: bool,
}

impl StopChecker {
    pub fn new(mut criteria: StopCriteria) -> Self {
        criteria.stop_strings.retain(|s| !s.is_empty());
        Self {
            criteria,
            held: String::new(),
            n_tokens: 0,
            finished: None,
            cut: false,
        }
    }

    pub fn criteria(&self) -> &StopCriteria {
        &self.criteria
    }

    /// Tokens fed so far.
    pub fn n_tokens(&self) -> usize {
        self.n_tokens
    }

    pub fn finished(&self) -> Option<FinishReason> {
        self.finished
    }

    /// Feeds one generated token and the text the detokenizer produced for it. After the request
    /// has finished, further tokens are ignored (empty text, same finish reason).
    pub fn push(&mut self, token: u32, text: &str) -> StopStep {
        if let Some(reason) = self.finished {
            return StopStep {
                text: String::new(),
                finish: Some(reason),
                matched: None,
            };
        }
        self.n_tokens += 1;
        if !self.criteria.ignore_eos && self.criteria.stop_token_ids.contains(&token) {
            return self.finish(FinishReason::Stop, Some(StopMatch::Token(token)));
        }
        self.held.push_str(text);
        if let Some(step) = self.match_stop_string() {
            return step;
        }
        if self.criteria.max_tokens.is_some_and(|m| self.n_tokens >= m) {
            return self.finish(FinishReason::Length, None);
        }
        let keep = self.holdback_len();
        let emit_to = self.held.len() - keep;
        let rest = self.held.split_off(emit_to);
        let text = std::mem::replace(&mut self.held, rest);
        StopStep {
            text,
            finish: None,
            matched: None,
        }
    }

    /// Ends the stream (finished, cancelled, or out of tokens): returns the held text plus `tail`
    /// (e.g. `Detokenizer::finish()`), still cut at a stop string if one completes in it.
    /// After a stop-string match nothing more is emitted.
    pub fn flush(&mut self, tail: &str) -> StopStep {
        if self.cut {
            return StopStep {
                text: String::new(),
                finish: self.finished,
                matched: None,
            };
        }
        self.held.push_str(tail);
        if let Some(step) = self.match_stop_string() {
            return step;
        }
        StopStep {
            text: std::mem::take(&mut self.held),
            finish: self.finished,
            matched: None,
        }
    }

    fn finish(&mut self, reason: FinishReason, matched: Option<StopMatch>) -> StopStep {
        self.finished = Some(reason);
        StopStep {
            text: std::mem::take(&mut self.held),
            finish: Some(reason),
            matched,
        }
    }

    /// The earliest stop string in the held text, if any: emits what precedes it and finishes.
    fn match_stop_string(&mut self) -> Option<StopStep> {
        // Held text never contains a whole stop string (it would have matched earlier), so the
        // earliest match in held + new text is the first one in the stream.
        let (pos, s) = self
            .criteria
            .stop_strings
            .iter()
            .filter_map(|s| self.held.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|&(p, s)| (p, std::cmp::Reverse(s.len())))?;
        let matched = StopMatch::String(s.clone());
        self.held.truncate(pos);
        self.cut = true;
        Some(self.finish(FinishReason::Stop, Some(matched)))
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn holdback_len(&self) -> usize {
        let mut keep = 0;
        for s in &self.criteria.stop_strings {
            let longest = (s.len() - 1).min(self.held.len());
            for l in (keep + 1..=longest).rev() {
                if s.is_char_boundary(l) && self.held.ends_with(&s[..l]) {
                    keep = l;
                    break;
                }
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(c: StopCriteria, pieces: &[(u32, &str)]) -> (String, Option<FinishReason>) {
        let mut ch = StopChecker::new(c);
        let mut out = String::new();
        for &(t, p) in pieces {
            let step = ch.push(t, p);
            out.push_str(&step.text);
            if step.finish.is_some() {
                out.push_str(&ch.flush("").text);
                return (out, step.finish);
            }
        }
        out.push_str(&ch.flush("").text);
        (out, None)
    }

    #[test]
    fn holds_back_then_releases_a_false_start() {
        let c = StopCriteria {
            stop_strings: vec!["END".into()],
            ..Default::default()
        };
        let mut ch = StopChecker::new(c);
        assert_eq!(ch.push(5, "abc E").text, "abc ");
        assert_eq!(ch.push(5, "N").text, "");
        assert_eq!(ch.push(5, "d").text, "ENd");
    }

    #[test]
    fn stop_token_and_length() {
        let c = StopCriteria {
            max_tokens: Some(3),
            stop_token_ids: vec![2],
            ..Default::default()
        };
        assert_eq!(
            run(c.clone(), &[(7, "a"), (2, "<|im_end|>"), (7, "b")]),
            ("a".into(), Some(FinishReason::Stop))
        );
        assert_eq!(
            run(c.clone(), &[(7, "a"), (7, "b"), (7, "c"), (7, "d")]),
            ("abc".into(), Some(FinishReason::Length))
        );
        let ignore = StopCriteria {
            ignore_eos: true,
            ..c
        };
        assert_eq!(
            run(ignore, &[(2, "x"), (2, "y"), (2, "z")]),
            ("xyz".into(), Some(FinishReason::Length))
        );
    }

    #[test]
    fn finish_reason_serializes_like_openai() {
        assert_eq!(
            serde_json::to_string(&FinishReason::Stop).ok().as_deref(),
            Some("\"stop\"")
        );
        assert_eq!(
            serde_json::to_string(&FinishReason::Length).ok().as_deref(),
            Some("\"length\"")
        );
    }
}

//! Reasoning output: splits what a thinking model writes (`<think>…</think>`, and the variants
//! other families use) into its reasoning and its answer as the text streams, token by token.
//!
//! The rules are llama-server's and vLLM's: reasoning is a block at the start of the output,
//! opened by the model's open tag or already opened by the prompt (DeepSeek-R1's and Qwen3's
//! templates end the generation prompt with `<think>\n`), and closed by the close tag; the
//! whitespace just inside the tags and just after the close is dropped; a tag anywhere later is
//! part of the answer. A tag split across tokens (`</th` + `ink>`) is held back until it is known
//! to be one, so no piece of a tag ever reaches either side. An output that never closes its
//! reasoning is all reasoning.
//!
//! gpt-oss writes OpenAI's harmony format, a run of messages whose channels are marked by
//! control tokens: `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final
//! <|message|>…`. Its pair is the analysis header and the `<|end|><|start|>assistant` between
//! two messages; each message's header decides its side again: an analysis is reasoning, the
//! final channel's header is dropped and its text is the answer, and any other message (a
//! commentary preamble, a call `to=functions.…`) goes to the answer as written, for the tool
//! reader ([`crate::text::tool_calls::ToolFormat::Harmony`]). Those tokens are text only when
//! the detokenizer keeps control tokens, which it does for such a model
//! ([`ReasoningTags::keeps_control_tokens`]).

/// A pair of tags that open and close a model's reasoning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReasoningTags {
    pub open: &'static str,
    pub close: &'static str,
    /// A header an answer without reasoning starts with, dropped (harmony's final channel);
    /// empty for the others.
    pub content_open: &'static str,
}

/// DeepSeek-R1, Qwen3, QwQ, SmolLM3 and most others.
pub const THINK: ReasoningTags = ReasoningTags {
    open: "<think>",
    close: "</think>",
    content_open: "",
};

/// gpt-oss's harmony channels: the analysis is the reasoning, the final channel the answer.
pub const HARMONY: ReasoningTags = ReasoningTags {
    open: "<|channel|>analysis<|message|>",
    close: "<|end|><|start|>assistant",
    content_open: "<|channel|>final<|message|>",
};

/// What marks a harmony template.
const HARMONY_MARK: &str = "<|channel|>";

/// The pairs known, most specific first (ByteDance Seed, Mistral's Magistral, Cohere's Command
/// R7B); `<think>` last because the others contain no `</think>` but it may appear beside them.
const KNOWN: [ReasoningTags; 4] = [
    ReasoningTags {
        open: "<seed:think>",
        close: "</seed:think>",
        content_open: "",
    },
    ReasoningTags {
        open: "[THINK]",
        close: "[/THINK]",
        content_open: "",
    },
    ReasoningTags {
        open: "<|START_THINKING|>",
        close: "<|END_THINKING|>",
        content_open: "",
    },
    THINK,
];

/// Whitespace held back at most (inside the reasoning, before a close tag that may follow, or
/// before an open tag at the start); past it the text is passed on as it is.
const MAX_HELD_WHITESPACE: usize = 256;

impl ReasoningTags {
    /// The pair a chat template uses: harmony's when it writes channels, else the first known
    /// pair whose close tag it mentions, else `<think>` (a model may think without its template
    /// saying so).
    pub fn for_template(source: &str) -> Self {
        if source.contains(HARMONY_MARK) {
            return HARMONY;
        }
        KNOWN
            .into_iter()
            .find(|t| source.contains(t.close))
            .unwrap_or(THINK)
    }

    /// Whether the answer's control tokens must stay in its text for these tags to be seen
    /// (harmony's channel markers are control tokens; `<think>` and the others are text).
    pub fn keeps_control_tokens(&self) -> bool {
        *self == HARMONY
    }

    /// Whether the output is a run of messages whose headers each decide their side (harmony):
    /// `close` ends any message, not only the reasoning.
    fn messages(&self) -> bool {
        !self.content_open.is_empty()
    }

    /// Whether `prompt` ends inside an opened reasoning block: its last open tag is followed by
    /// whitespace only (the generation prompt opened it for the model).
    pub fn opened_by(&self, prompt: &str) -> bool {
        prompt
            .rfind(self.open)
            .is_some_and(|i| prompt[i + self.open.len()..].trim().is_empty())
    }
}

/// Text of one step, split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

impl Split {
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }

    /// Appends another step's split.
    pub fn extend(&mut self, other: Split) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing but whitespace seen yet: the output may still open with the tag.
    Start,
    /// Inside the reasoning; `started` once its first non-whitespace character is out.
    Reasoning { started: bool },
    /// The answer; `started` once its first non-whitespace character is out (whitespace right
    /// after a close tag is dropped, an answer without reasoning is kept as it is).
    Content { started: bool },
}

/// The streaming splitter of one answer.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    tags: ReasoningTags,
    state: State,
    /// Text received but not yet given out: a possible start of a tag, or held whitespace.
    pending: String,
}

impl ReasoningParser {
    /// An answer that may open with `tags.open`.
    pub fn new(tags: ReasoningTags) -> Self {
        Self {
            tags,
            state: State::Start,
            pending: String::new(),
        }
    }

    /// An answer to `prompt`: already inside the reasoning when the prompt opened it.
    pub fn for_prompt(tags: ReasoningTags, prompt: &str) -> Self {
        let mut p = Self::new(tags);
        if tags.opened_by(prompt) {
            p.state = State::Reasoning { started: false };
        }
        p
    }

    /// Whether text given now would be reasoning.
    pub fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Reasoning { .. })
    }

    /// Takes the next piece of output and returns what is now known of each side.
    pub fn push(&mut self, text: &str) -> Split {
        let mut out = Split::default();
        let mut buf = std::mem::take(&mut self.pending);
        buf.push_str(text);
        // Each pass either ends (holding or giving out all of `buf`) or moves to another state
        // with what follows a tag, so this runs at most three times (harmony: three per
        // message in `buf`).
        loop {
            match self.state {
                State::Start => match self.start(&buf) {
                    Some(rest) => {
                        buf = rest;
                    }
                    None => return out,
                },
                State::Reasoning { started } => match buf.find(self.tags.close) {
                    Some(i) => {
                        let inside = &buf[..i];
                        let inside = if started { inside } else { inside.trim_start() };
                        out.reasoning.push_str(inside.trim_end());
                        buf = buf[i + self.tags.close.len()..].to_string();
                        self.state = if self.tags.messages() {
                            State::Start
                        } else {
                            State::Content { started: false }
                        };
                    }
                    None => {
                        let keep = held_back(&buf, self.tags.close);
                        let (give, hold) = buf.split_at(buf.len() - keep);
                        let give = if started { give } else { give.trim_start() };
                        if !give.is_empty() {
                            self.state = State::Reasoning { started: true };
                        }
                        out.reasoning.push_str(give);
                        self.pending = hold.to_string();
                        return out;
                    }
                },
                State::Content { started } => {
                    // Harmony: the message ends at `close`, and the next one's header decides.
                    let (upto, next) = match buf.find(self.tags.close) {
                        Some(i) if self.tags.messages() => (i, Some(i + self.tags.close.len())),
                        _ if self.tags.messages() => {
                            (buf.len() - partial(&buf, self.tags.close), None)
                        }
                        _ => (buf.len(), None),
                    };
                    let give = if started {
                        &buf[..upto]
                    } else {
                        buf[..upto].trim_start()
                    };
                    if !give.is_empty() {
                        self.state = State::Content { started: true };
                    }
                    out.content.push_str(give);
                    match next {
                        Some(at) => {
                            buf = buf[at..].to_string();
                            self.state = State::Start;
                        }
                        None => {
                            self.pending = buf[upto..].to_string();
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// In `Start`: decides from `buf` whether the output opens reasoning. Returns the text to go
    /// on with (after the tag, or all of it as the answer), or None when it cannot tell yet (the
    /// text is then held).
    fn start(&mut self, buf: &str) -> Option<String> {
        let t = buf.trim_start();
        if let Some(rest) = t.strip_prefix(self.tags.open) {
            self.state = State::Reasoning { started: false };
            return Some(rest.to_string());
        }
        let header = self.tags.content_open;
        if let Some(rest) = t.strip_prefix(header).filter(|_| !header.is_empty()) {
            self.state = State::Content { started: false };
            return Some(rest.to_string());
        }
        let could_be = |tag: &str| !tag.is_empty() && tag.starts_with(t);
        let undecided =
            (could_be(self.tags.open) || could_be(header)) && buf.len() <= MAX_HELD_WHITESPACE;
        if undecided {
            self.pending = buf.to_string();
            return None;
        }
        // An answer without reasoning keeps its text exactly.
        self.state = State::Content { started: true };
        Some(buf.to_string())
    }

    /// The end of the output: whatever was held back, on the side it was on.
    pub fn finish(&mut self) -> Split {
        let held = std::mem::take(&mut self.pending);
        let mut out = Split::default();
        match self.state {
            State::Start => out.content = held,
            State::Reasoning { started } => {
                let text = if started {
                    &held[..]
                } else {
                    held.trim_start()
                };
                out.reasoning = text.trim_end().to_string();
            }
            State::Content { .. } => out.content = held,
        }
        out
    }

    /// Splits a whole output at once (what a non-streamed answer needs).
    pub fn split_all(mut self, text: &str) -> Split {
        let mut out = self.push(text);
        out.extend(self.finish());
        out
    }
}

/// How many bytes at the end of `buf` must wait: a start of `close`, with the whitespace before
/// it (a reasoning block's trailing whitespace is dropped when the close tag follows), bounded.
fn held_back(buf: &str, close: &str) -> usize {
    let partial = partial(buf, close);
    let before = &buf[..buf.len() - partial];
    let ws = before.len() - before.trim_end().len();
    partial + ws.min(MAX_HELD_WHITESPACE)
}

/// How many bytes at the end of `buf` are a start of `tag` (a tag split across tokens, held
/// back until it is known to be one; the tool-call reader holds its markers the same way).
pub(crate) fn partial(buf: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&n| {
            buf.len() >= n && buf.is_char_boundary(buf.len() - n) && buf.ends_with(&tag[..n])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_of_a_template() {
        assert_eq!(ReasoningTags::for_template("{{ '</think>' }}"), THINK);
        assert_eq!(
            ReasoningTags::for_template("[THINK]x[/THINK]").close,
            "[/THINK]"
        );
        assert_eq!(ReasoningTags::for_template("plain"), THINK);
        assert!(THINK.opened_by("<|im_start|>assistant\n<think>\n"));
        assert!(!THINK.opened_by("<think>\n\n</think>\n\n"));
        assert!(!THINK.opened_by("user said <think> then\n<|im_start|>assistant\n"));
        assert_eq!(
            ReasoningTags::for_template("{{- '<|start|>assistant<|channel|>final<|message|>' }}"),
            HARMONY
        );
        assert!(HARMONY.keeps_control_tokens() && !THINK.keeps_control_tokens());
    }

    /// Harmony's channels, streamed in every split of the text (the markers arrive as whole
    /// tokens in practice, but no split may leak a piece of one), and an answer that skips the
    /// analysis.
    #[test]
    fn harmony_channels_split_in_any_pieces() {
        let text = "<|channel|>analysis<|message|>User asks 2+2. Easy.<|end|>\
                    <|start|>assistant<|channel|>final<|message|>It is 4.";
        for cut in 0..=text.len() {
            if !text.is_char_boundary(cut) {
                continue;
            }
            let mut p = ReasoningParser::new(HARMONY);
            let mut got = p.push(&text[..cut]);
            got.extend(p.push(&text[cut..]));
            got.extend(p.finish());
            assert_eq!(got.reasoning, "User asks 2+2. Easy.", "cut at {cut}");
            assert_eq!(got.content, "It is 4.", "cut at {cut}");
        }
        let direct = ReasoningParser::new(HARMONY).split_all("<|channel|>final<|message|>Hi.");
        assert_eq!(
            (direct.reasoning.as_str(), direct.content.as_str()),
            ("", "Hi.")
        );
        // Unfinished analysis is all reasoning; plain text stays an answer.
        let cut = ReasoningParser::new(HARMONY).split_all("<|channel|>analysis<|message|>Hmm");
        assert_eq!((cut.reasoning.as_str(), cut.content.as_str()), ("Hmm", ""));
        let plain = ReasoningParser::new(HARMONY).split_all("Hello there");
        assert_eq!(plain.content, "Hello there");
    }

    /// Harmony after the analysis: a commentary preamble and a call go to the answer as written
    /// (for the tool reader), a second analysis is reasoning again; in every split.
    #[test]
    fn harmony_messages_after_the_analysis_each_take_their_side() {
        let text = "<|channel|>analysis<|message|>Need weather.<|end|>\
                    <|start|>assistant<|channel|>commentary<|message|>Checking.<|end|>\
                    <|start|>assistant<|channel|>analysis<|message|>Call it.<|end|>\
                    <|start|>assistant<|channel|>commentary to=functions.get_weather \
                    <|constrain|>json<|message|>{\"city\":\"Paris\"}";
        for cut in 0..=text.len() {
            let mut p = ReasoningParser::new(HARMONY);
            let mut got = p.push(&text[..cut]);
            got.extend(p.push(&text[cut..]));
            got.extend(p.finish());
            assert_eq!(got.reasoning, "Need weather.Call it.", "cut at {cut}");
            assert_eq!(
                got.content,
                "<|channel|>commentary<|message|>Checking.\
                 <|channel|>commentary to=functions.get_weather <|constrain|>json\
                 <|message|>{\"city\":\"Paris\"}",
                "cut at {cut}"
            );
        }
        // The think tags never reopen: a tag in the answer is the answer's.
        let think = ReasoningParser::new(THINK).split_all("<think>a</think>b<think>c</think>");
        assert_eq!(think.content, "b<think>c</think>");
    }
}

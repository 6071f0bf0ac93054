//! Tool calls in model output: finds the calls a model writes in its family's format (Hermes /
//! Qwen `<tool_call>{..}</tool_call>`, Llama 3.x JSON, Mistral `[TOOL_CALLS]`, gpt-oss's harmony
//! messages `to=functions.NAME`, read in [`harmony`]) and splits them from the answer's text,
//! whole or as the text streams.
//!
//! The rules are vLLM's tool parsers': a call whose JSON does not parse, or lacks a `name`, is
//! given back as text exactly as written (never an error); a marker split across tokens
//! (`<tool_` + `call>`) is held back until it is known to be one, so no piece of a marker ever
//! reaches the text. A call is given out once it is complete: its name first, then its arguments
//! (as JSON text, compact). Budgets: at most [`MAX_CALLS`] calls per answer (later markers are
//! text), and at most [`MAX_HELD`] bytes held back for one call (past it the call is text).

use serde_json::Value;

use super::reasoning::partial as partial_marker;

mod harmony;

/// Most calls one answer may make; markers past it are left in the text.
pub const MAX_CALLS: usize = 64;
/// Most bytes held back while a call is incomplete; past it the call is given back as text.
pub const MAX_HELD: usize = 1 << 20;

const HERMES_OPEN: &str = "<tool_call>";
const HERMES_CLOSE: &str = "</tool_call>";
const PYTHON_TAG: &str = "<|python_tag|>";
const MISTRAL: &str = "[TOOL_CALLS]";
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";

/// How a model family writes its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// Hermes, Qwen2.5, Qwen3, SmolLM3: `<tool_call>{"name": .., "arguments": {..}}</tool_call>`,
    /// one or several, anywhere in the answer.
    Hermes,
    /// Llama 3.x: the answer is `{"name": .., "parameters": {..}}` (or `"arguments"`), optionally
    /// after `<|python_tag|>`, several separated by `;`.
    Llama3Json,
    /// Mistral: `[TOOL_CALLS][{"name": .., "arguments": {..}}, ..]`, or the newer
    /// `[TOOL_CALLS]name[ARGS]{..}` (with `[CALL_ID]id` before `[ARGS]` in some), repeated.
    Mistral,
    /// gpt-oss (OpenAI's harmony): a commentary message addressed to a function,
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>` (the
    /// recipient may come before the channel); other messages' headers and ends are dropped and
    /// their text is the answer's.
    Harmony,
}

impl ToolFormat {
    /// The format a chat template teaches: harmony's channels, Mistral's marker, then Hermes' tag, then Llama 3's
    /// `ipython` role; Hermes when the template says nothing (vLLM's most common parser, and
    /// what small ChatML models imitate).
    pub fn for_template(source: &str) -> Self {
        if source.contains(harmony::TEMPLATE_MARK) {
            ToolFormat::Harmony
        } else if source.contains(MISTRAL) {
            ToolFormat::Mistral
        } else if source.contains(HERMES_OPEN) {
            ToolFormat::Hermes
        } else if source.contains(PYTHON_TAG) || source.contains("ipython") {
            ToolFormat::Llama3Json
        } else {
            ToolFormat::Hermes
        }
    }
}

/// One call: the function's name and its arguments as JSON text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub name: String,
    pub arguments: String,
}

/// A piece of one call, as streamed: the first of each call carries its name (and empty
/// arguments), the later ones fragments of its arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolDelta {
    /// The call's place in the answer, from 0.
    pub index: usize,
    pub name: Option<String>,
    pub arguments: String,
}

/// What one pushed piece of text gave: answer text, and pieces of calls (the text comes before
/// the calls of the same step).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolStep {
    pub content: String,
    pub calls: Vec<ToolDelta>,
}

impl ToolStep {
    pub fn is_empty(&self) -> bool {
        self.content.is_empty() && self.calls.is_empty()
    }

    pub fn extend(&mut self, other: ToolStep) {
        self.content.push_str(&other.content);
        self.calls.extend(other.calls);
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Llama 3 and harmony: nothing but whitespace seen; the answer may still open with a call
    /// (harmony's recipient before its channel).
    Start,
    /// Answer text; for Hermes and Mistral a marker may follow.
    Text,
    /// Inside a call: `pending` holds it from its marker on.
    Call,
    /// Llama 3 only: after a call; `;` or `{` opens another, anything else is text.
    AfterCall,
    /// Llama 3 only: the answer is text (it did not open with a call).
    Plain,
}

/// The streaming parser of one answer.
#[derive(Debug, Clone)]
pub struct ToolCallParser {
    format: ToolFormat,
    state: State,
    pending: String,
    calls: usize,
}

/// The call one JSON text holds, if it parses as one ([`call_of`]).
fn call_in(json: &str) -> Vec<ToolCall> {
    serde_json::from_str::<Value>(json)
        .ok()
        .as_ref()
        .and_then(call_of)
        .into_iter()
        .collect()
}

/// A call's JSON object read as vLLM reads it: `name` a non-empty string, `arguments` (or
/// `parameters`) an object, a JSON string of one, or absent (`{}`).
fn call_of(v: &Value) -> Option<ToolCall> {
    let o = v.as_object()?;
    let name = o.get("name")?.as_str()?.trim();
    if name.is_empty() {
        return None;
    }
    let args = o.get("arguments").or_else(|| o.get("parameters"));
    Some(ToolCall {
        name: name.to_string(),
        arguments: arguments_text(args)?,
    })
}

fn arguments_text(args: Option<&Value>) -> Option<String> {
    match args {
        None | Some(Value::Null) => Some("{}".into()),
        Some(v @ Value::Object(_)) => serde_json::to_string(v).ok(),
        // Some templates (Llama 3.2's) and models write the arguments as a JSON string.
        Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
            Ok(v @ Value::Object(_)) => serde_json::to_string(&v).ok(),
            _ => None,
        },
        Some(_) => None,
    }
}

/// Where the JSON value opening `s` (an object or array, after whitespace) ends: the byte after
/// its closing bracket, or None when it is not complete yet (or does not open with a bracket).
/// Brackets inside strings (escapes included) do not count.
fn json_end(s: &str) -> Option<usize> {
    let start = s.len() - s.trim_start().len();
    let b = s.as_bytes();
    if !matches!(b.get(start), Some(b'{' | b'[')) {
        return None;
    }
    let (mut depth, mut in_str, mut esc) = (0usize, false, false);
    for (i, &c) in b.iter().enumerate().skip(start) {
        if in_str {
            match (esc, c) {
                (true, _) => esc = false,
                (false, b'\\') => esc = true,
                (false, b'"') => in_str = false,
                _ => {}
            }
            continue;
        }
        match c {
            b'"' => in_str = true,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
    }
    None
}

/// The result of trying to read one marked call from the start of a buffer.
enum Read {
    /// Not complete yet.
    More,
    /// `used` bytes make up the calls (empty when they were not valid: the bytes are text).
    Done { used: usize, calls: Vec<ToolCall> },
    /// `used` bytes are the format's own (harmony's headers and message ends): neither text
    /// nor a call.
    Skip { used: usize },
}

impl ToolCallParser {
    pub fn new(format: ToolFormat) -> Self {
        let state = match format {
            ToolFormat::Llama3Json | ToolFormat::Harmony => State::Start,
            _ => State::Text,
        };
        Self {
            format,
            state,
            pending: String::new(),
            calls: 0,
        }
    }

    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// Takes the next piece of output and returns what is now known of the text and the calls.
    pub fn push(&mut self, text: &str) -> ToolStep {
        let mut out = ToolStep::default();
        self.pending.push_str(text);
        self.run(&mut out, false);
        out
    }

    /// The end of the output: an unclosed call is read as far as it goes (a Hermes call whose
    /// close tag never came is still a call when its JSON is whole), the rest is text.
    pub fn finish(&mut self) -> ToolStep {
        let mut out = ToolStep::default();
        self.run(&mut out, true);
        out.content.push_str(&std::mem::take(&mut self.pending));
        out
    }

    /// Splits a whole output at once: the text and the calls.
    pub fn parse_all(format: ToolFormat, text: &str) -> (String, Vec<ToolCall>) {
        let mut p = Self::new(format);
        let mut step = p.push(text);
        step.extend(p.finish());
        (step.content, collect(step.calls))
    }

    fn emit(&mut self, out: &mut ToolStep, calls: Vec<ToolCall>) {
        for c in calls {
            let index = self.calls;
            self.calls += 1;
            out.calls.push(ToolDelta {
                index,
                name: Some(c.name),
                arguments: String::new(),
            });
            out.calls.push(ToolDelta {
                index,
                name: None,
                arguments: c.arguments,
            });
        }
    }

    /// Moves `n` bytes of `pending` to the text.
    fn give(&mut self, out: &mut ToolStep, n: usize) {
        out.content.push_str(&self.pending[..n]);
        self.pending.drain(..n);
    }

    fn room(&self) -> bool {
        self.calls < MAX_CALLS
    }

    /// Each pass gives out or holds all of `pending`, or consumes a prefix and changes state.
    fn run(&mut self, out: &mut ToolStep, end: bool) {
        loop {
            match self.state {
                State::Plain => {
                    let n = self.pending.len();
                    self.give(out, n);
                    return;
                }
                State::Start if self.format == ToolFormat::Harmony => {
                    let t = self.pending.trim_start();
                    if t.starts_with(harmony::RECIPIENT) {
                        self.state = State::Call;
                        continue;
                    }
                    if harmony::RECIPIENT.starts_with(t) && !end && self.pending.len() <= MAX_HELD {
                        return;
                    }
                    self.state = State::Text;
                }
                State::Start | State::AfterCall => {
                    let t = self.pending.trim_start();
                    let t = if self.state == State::AfterCall {
                        t.strip_prefix(';').map_or(t, str::trim_start)
                    } else {
                        t
                    };
                    if t.starts_with('{') || t.starts_with(PYTHON_TAG) {
                        if !self.room() {
                            self.state = State::Plain;
                            continue;
                        }
                        self.state = State::Call;
                        continue;
                    }
                    let undecided = t.is_empty() || PYTHON_TAG.starts_with(t);
                    if undecided && !end && self.pending.len() <= MAX_HELD {
                        return;
                    }
                    self.state = State::Plain;
                }
                State::Text => {
                    if self.text(out, end) {
                        return;
                    }
                }
                State::Call => {
                    let read = match self.format {
                        ToolFormat::Hermes => hermes(&self.pending, end),
                        ToolFormat::Mistral => mistral(&self.pending, end),
                        ToolFormat::Llama3Json => llama(&self.pending, end),
                        ToolFormat::Harmony => harmony::read(&self.pending, end),
                    };
                    match read {
                        Read::More if !end && self.pending.len() <= MAX_HELD => return,
                        Read::More => {
                            // Past the budget, or the output ended inside the call: it is text.
                            let n = self.pending.len();
                            self.give(out, n);
                            self.state = self.after_call();
                            if end {
                                return;
                            }
                        }
                        Read::Skip { used } => {
                            self.pending.drain(..used);
                            self.state = self.after_call();
                        }
                        Read::Done { used, calls } => {
                            if calls.is_empty() {
                                self.give(out, used);
                            } else {
                                let room = MAX_CALLS - self.calls;
                                self.pending.drain(..used);
                                self.emit(out, calls.into_iter().take(room).collect());
                            }
                            self.state = self.after_call();
                        }
                    }
                }
            }
        }
    }

    /// In `Text`: gives out the text before the next marker and moves to `Call` at it (false:
    /// go on), or gives out all but a possible start of one (true: wait for more).
    fn text(&mut self, out: &mut ToolStep, end: bool) -> bool {
        let markers = match self.format {
            ToolFormat::Hermes => &[HERMES_OPEN][..],
            ToolFormat::Mistral => &[MISTRAL][..],
            ToolFormat::Harmony => &harmony::MARKS[..],
            ToolFormat::Llama3Json => {
                self.state = State::Plain;
                return false;
            }
        };
        if !self.room() {
            let n = self.pending.len();
            self.give(out, n);
            return true;
        }
        if let Some(i) = markers.iter().filter_map(|m| self.pending.find(m)).min() {
            self.give(out, i);
            self.state = State::Call;
            return false;
        }
        let keep = if end {
            0
        } else {
            markers
                .iter()
                .map(|m| partial_marker(&self.pending, m))
                .max()
                .unwrap_or(0)
        };
        let n = self.pending.len() - keep;
        self.give(out, n);
        true
    }

    fn after_call(&self) -> State {
        match self.format {
            ToolFormat::Llama3Json => State::AfterCall,
            _ => State::Text,
        }
    }
}

/// The whole calls of a run of deltas (names and their argument fragments joined).
pub fn collect(deltas: Vec<ToolDelta>) -> Vec<ToolCall> {
    let mut calls: Vec<ToolCall> = Vec::new();
    for d in deltas {
        if let Some(name) = d.name {
            calls.push(ToolCall {
                name,
                arguments: d.arguments,
            });
        } else if let Some(c) = calls.get_mut(d.index) {
            c.arguments.push_str(&d.arguments);
        }
    }
    calls
}

/// `<tool_call>{..}</tool_call>` at the start of `buf`.
fn hermes(buf: &str, end: bool) -> Read {
    let body = &buf[HERMES_OPEN.len().min(buf.len())..];
    let (inner, used) = match body.find(HERMES_CLOSE) {
        Some(i) => (&body[..i], HERMES_OPEN.len() + i + HERMES_CLOSE.len()),
        None if end => (body, buf.len()),
        None => return Read::More,
    };
    let calls = call_in(inner.trim());
    Read::Done { used, calls }
}

/// A Llama 3 call (`<|python_tag|>` optional, `;` before a later one) at the start of `buf`.
fn llama(buf: &str, _end: bool) -> Read {
    let lead = buf.len() - buf.trim_start().len();
    let mut at = lead;
    if buf[at..].starts_with(';') {
        at += 1;
    }
    at += buf[at..].len() - buf[at..].trim_start().len();
    if buf[at..].starts_with(PYTHON_TAG) {
        at += PYTHON_TAG.len();
    }
    let Some(n) = json_end(&buf[at..]) else {
        return Read::More;
    };
    let used = at + n;
    let calls = call_in(&buf[at..used]);
    Read::Done { used, calls }
}

/// `[TOOL_CALLS]` and what follows it: a JSON array of calls, or `name[CALL_ID]id[ARGS]{..}`.
fn mistral(buf: &str, end: bool) -> Read {
    let body = &buf[MISTRAL.len().min(buf.len())..];
    let trimmed = body.trim_start();
    let skip = MISTRAL.len() + body.len() - trimmed.len();
    if trimmed.is_empty() {
        return if end {
            Read::Done {
                used: buf.len(),
                calls: Vec::new(),
            }
        } else {
            Read::More
        };
    }
    if trimmed.starts_with('[') || trimmed.starts_with('{') {
        let Some(n) = json_end(trimmed) else {
            return Read::More;
        };
        let used = skip + n;
        let calls = match serde_json::from_str::<Value>(&trimmed[..n]) {
            Ok(Value::Array(items)) => items
                .iter()
                .map(call_of)
                .collect::<Option<Vec<_>>>()
                .unwrap_or_default(),
            Ok(v @ Value::Object(_)) => call_of(&v).into_iter().collect(),
            _ => Vec::new(),
        };
        return Read::Done { used, calls };
    }
    let Some(a) = trimmed.find(MISTRAL_ARGS) else {
        return Read::More;
    };
    let head = &trimmed[..a];
    let name = head
        .split(MISTRAL_CALL_ID)
        .next()
        .unwrap_or_default()
        .trim();
    let args = &trimmed[a + MISTRAL_ARGS.len()..];
    let Some(n) = json_end(args) else {
        return Read::More;
    };
    let used = skip + a + MISTRAL_ARGS.len() + n;
    let valid = !name.is_empty() && !name.contains(char::is_whitespace);
    let calls = serde_json::from_str::<Value>(&args[..n])
        .ok()
        .filter(|_| valid)
        .and_then(|v| arguments_text(Some(&v)))
        .map(|arguments| ToolCall {
            name: name.to_string(),
            arguments,
        })
        .into_iter()
        .collect();
    Read::Done { used, calls }
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn call(name: &str, args: &str) -> ToolCall {
        ToolCall {
            name: name.into(),
            arguments: args.into(),
        }
    }

    #[test]
    fn each_format_whole() {
        let (text, calls) = ToolCallParser::parse_all(
            ToolFormat::Hermes,
            "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n</tool_call>",
        );
        assert_eq!(text, "Sure.\n");
        assert_eq!(calls, vec![call("f", "{\"a\":1}")]);
        let (text, calls) = ToolCallParser::parse_all(
            ToolFormat::Llama3Json,
            "<|python_tag|>{\"name\": \"f\", \"parameters\": {}}; {\"name\": \"g\"}",
        );
        assert_eq!(text, "");
        assert_eq!(calls, vec![call("f", "{}"), call("g", "{}")]);
        let (_, calls) = ToolCallParser::parse_all(
            ToolFormat::Mistral,
            "[TOOL_CALLS]f[ARGS]{\"x\": \"}\"}[TOOL_CALLS]g[CALL_ID]abc123def[ARGS]{}",
        );
        assert_eq!(calls, vec![call("f", "{\"x\":\"}\"}"), call("g", "{}")]);
    }

    #[test]
    fn malformed_calls_are_text() {
        let bad = "<tool_call>{\"name\": oops}</tool_call> after";
        assert_eq!(
            ToolCallParser::parse_all(ToolFormat::Hermes, bad),
            (bad.to_string(), vec![])
        );
        let plain = "{not json at all";
        assert_eq!(
            ToolCallParser::parse_all(ToolFormat::Llama3Json, plain),
            (plain.to_string(), vec![])
        );
        assert_eq!(
            ToolCallParser::parse_all(ToolFormat::Llama3Json, "Hello {\"name\": \"f\"}").1,
            vec![]
        );
        let cut = "[TOOL_CALLS][{\"name\": \"f\"";
        assert_eq!(
            ToolCallParser::parse_all(ToolFormat::Mistral, cut),
            (cut.to_string(), vec![])
        );
    }

    #[test]
    fn the_number_of_calls_is_capped() {
        let one = "<tool_call>{\"name\": \"f\"}</tool_call>";
        let (text, calls) =
            ToolCallParser::parse_all(ToolFormat::Hermes, &one.repeat(MAX_CALLS + 2));
        assert_eq!(calls.len(), MAX_CALLS);
        assert_eq!(text, one.repeat(2));
    }

    #[test]
    fn formats_of_templates() {
        assert_eq!(
            ToolFormat::for_template("{{ '[TOOL_CALLS][' }}"),
            ToolFormat::Mistral
        );
        assert_eq!(
            ToolFormat::for_template("<tool_call>\n"),
            ToolFormat::Hermes
        );
        assert_eq!(
            ToolFormat::for_template("<|start_header_id|>ipython"),
            ToolFormat::Llama3Json
        );
        assert_eq!(ToolFormat::for_template("plain"), ToolFormat::Hermes);
    }
}

//! `tool_choice: "required"`'s output read as it streams. The grammar makes the answer a JSON
//! list `[{"name": ..., "arguments": ...}, ...]`; [`CallList`] announces each call as soon as
//! its name is complete and passes its arguments on as they are written (the model's own text,
//! as a named tool's are), so a streamed answer sends `delta.tool_calls` pieces while the model
//! writes instead of all at the end. A whole answer is read by the same scanner.
//!
//! The scanner keeps a call's text only until it is sent, counts nesting instead of parsing,
//! and stops at [`MAX_CALLS`] calls; the answer itself is bounded by `max_tokens`.

use tpslab_engine::text::tool_calls::{MAX_CALLS, ToolCall, ToolDelta, ToolStep};

/// Which member of a call a value belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Name,
    Arguments,
    Other,
}

/// Where the scanner stands in the list.
#[derive(Clone, Debug, PartialEq, Eq)]
enum At {
    /// Before the list's `[`.
    Start,
    /// In the list, between calls.
    List,
    /// In a call's object, where a key or the object's end comes next.
    Key,
    /// Reading a key string.
    InKey(String),
    /// After a key, before its `:`.
    Colon(Field),
    /// After the `:`, before the value's first character.
    Value(Field),
    /// In a value.
    InValue(Field),
    /// After the list (or text that is no list): nothing more is read.
    Done,
}

/// One call as read so far.
#[derive(Clone, Debug, Default)]
struct Call {
    /// The name's JSON string, quotes included, until it is complete.
    name_raw: String,
    name: Option<String>,
    /// The arguments' text not yet sent.
    args: String,
    /// Whitespace after the arguments' last character, sent only if more of them follows.
    held_ws: String,
    announced: bool,
    complete: bool,
    /// The whole arguments text, for a whole answer.
    all_args: String,
}

/// The streaming reader of `required`'s JSON list of calls.
#[derive(Clone, Debug)]
pub struct CallList {
    at: At,
    /// Nesting inside the current value.
    depth: u32,
    in_str: bool,
    esc: bool,
    calls: Vec<Call>,
    /// Calls before this one are complete and sent.
    open: usize,
    /// Everything written, given back as the answer's text if no call comes of it.
    text: String,
}

impl Default for CallList {
    fn default() -> Self {
        CallList {
            at: At::Start,
            depth: 0,
            in_str: false,
            esc: false,
            calls: Vec::new(),
            open: 0,
            text: String::new(),
        }
    }
}

impl CallList {
    /// Reads a piece of the answer; gives the call pieces it completes.
    pub fn push(&mut self, piece: &str) -> ToolStep {
        self.text.push_str(piece);
        for c in piece.chars() {
            self.step(c);
        }
        ToolStep {
            content: String::new(),
            calls: self.pending(),
        }
    }

    /// The end of the answer: if no call was announced, what was written is the answer's text
    /// (cut short by `max_tokens` before a name was complete).
    pub fn finish(&mut self) -> ToolStep {
        let calls = self.pending();
        if self.calls.iter().any(|c| c.announced) {
            return ToolStep {
                content: String::new(),
                calls,
            };
        }
        ToolStep {
            content: std::mem::take(&mut self.text),
            calls: Vec::new(),
        }
    }

    /// A whole answer: its complete calls, or its text when it has none (a list cut short
    /// gives the calls it completed).
    pub fn read_all(text: &str) -> (String, Vec<ToolCall>) {
        let mut list = CallList::default();
        for c in text.chars() {
            list.step(c);
        }
        let calls: Vec<ToolCall> = list
            .calls
            .into_iter()
            .filter(|c| c.complete)
            .filter_map(|c| {
                Some(ToolCall {
                    name: c.name?,
                    arguments: c.all_args,
                })
            })
            .collect();
        if calls.is_empty() {
            (text.to_string(), calls)
        } else {
            (String::new(), calls)
        }
    }

    /// The pieces ready to send: each open call's announcement once its name is known, then its
    /// arguments as they grow.
    fn pending(&mut self) -> Vec<ToolDelta> {
        let mut out = Vec::new();
        for (index, call) in self.calls.iter_mut().enumerate().skip(self.open) {
            let Some(name) = &call.name else { continue };
            if !call.announced {
                call.announced = true;
                out.push(ToolDelta {
                    index,
                    name: Some(name.clone()),
                    arguments: std::mem::take(&mut call.args),
                });
            } else if !call.args.is_empty() {
                out.push(ToolDelta {
                    index,
                    name: None,
                    arguments: std::mem::take(&mut call.args),
                });
            }
        }
        while self
            .calls
            .get(self.open)
            .is_some_and(|c| c.complete && c.announced)
        {
            self.open += 1;
        }
        out
    }

    fn step(&mut self, c: char) {
        match std::mem::replace(&mut self.at, At::Done) {
            At::Start => {
                self.at = match c {
                    '[' => At::List,
                    c if c.is_whitespace() => At::Start,
                    _ => At::Done,
                }
            }
            At::List => {
                self.at = match c {
                    '{' if self.calls.len() < MAX_CALLS => {
                        self.calls.push(Call::default());
                        At::Key
                    }
                    ',' => At::List,
                    c if c.is_whitespace() => At::List,
                    _ => At::Done,
                }
            }
            At::Key => {
                self.at = match c {
                    '"' => At::InKey(String::new()),
                    '}' => {
                        self.close_call();
                        At::List
                    }
                    _ => At::Key,
                }
            }
            At::InKey(mut key) => {
                self.at = if self.esc {
                    self.esc = false;
                    key.push(c);
                    At::InKey(key)
                } else if c == '\\' {
                    self.esc = true;
                    At::InKey(key)
                } else if c == '"' {
                    At::Colon(match key.as_str() {
                        "name" => Field::Name,
                        "arguments" => Field::Arguments,
                        _ => Field::Other,
                    })
                } else {
                    key.push(c);
                    At::InKey(key)
                }
            }
            At::Colon(f) => self.at = if c == ':' { At::Value(f) } else { At::Colon(f) },
            At::Value(f) if c.is_whitespace() => self.at = At::Value(f),
            At::Value(f) | At::InValue(f) => self.in_value(f, c),
            At::Done => {}
        }
    }

    fn in_value(&mut self, f: Field, c: char) {
        self.at = At::InValue(f);
        if self.in_str {
            if self.esc {
                self.esc = false;
            } else if c == '\\' {
                self.esc = true;
            } else if c == '"' {
                self.in_str = false;
            }
        } else if self.depth == 0 && (c == ',' || c == '}') {
            self.end_value(f);
            self.at = if c == ',' {
                At::Key
            } else {
                self.close_call();
                At::List
            };
            return;
        } else {
            match c {
                '"' => self.in_str = true,
                '{' | '[' => self.depth += 1,
                '}' | ']' => self.depth = self.depth.saturating_sub(1),
                _ => {}
            }
        }
        let Some(call) = self.calls.last_mut() else {
            return;
        };
        match f {
            Field::Name => call.name_raw.push(c),
            Field::Arguments if c.is_whitespace() && !self.in_str => call.held_ws.push(c),
            Field::Arguments => {
                let held = std::mem::take(&mut call.held_ws);
                for s in [held.as_str(), c.encode_utf8(&mut [0; 4])] {
                    call.args.push_str(s);
                    call.all_args.push_str(s);
                }
            }
            Field::Other => {}
        }
    }

    fn end_value(&mut self, f: Field) {
        self.depth = 0;
        let Some(call) = self.calls.last_mut() else {
            return;
        };
        match f {
            Field::Name => call.name = serde_json::from_str(call.name_raw.trim()).ok(),
            Field::Arguments => call.held_ws.clear(),
            Field::Other => {}
        }
    }

    fn close_call(&mut self) {
        if let Some(call) = self.calls.last_mut() {
            call.complete = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tpslab_engine::text::tool_calls::collect;

    const TWO: &str = "[{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Pa\\\"ris, }\", \"days\": [1, 2]} },\n {\"arguments\": {\"a\": 1}, \"name\": \"f\"}]";

    #[test]
    fn every_split_streams_the_whole_answer() {
        let (text, whole) = CallList::read_all(TWO);
        assert_eq!(text, "");
        assert_eq!(
            whole,
            vec![
                ToolCall {
                    name: "get_weather".into(),
                    arguments: "{\"city\": \"Pa\\\"ris, }\", \"days\": [1, 2]}".into(),
                },
                ToolCall {
                    name: "f".into(),
                    arguments: "{\"a\": 1}".into(),
                },
            ]
        );
        let chars: Vec<char> = TWO.chars().collect();
        for cut in 0..chars.len() {
            for cut2 in [cut, (cut + 3).min(chars.len())] {
                let mut list = CallList::default();
                let parts = [
                    chars[..cut].iter().collect::<String>(),
                    chars[cut..cut2].iter().collect(),
                    chars[cut2..].iter().collect(),
                ];
                let mut deltas = Vec::new();
                for p in &parts {
                    deltas.extend(list.push(p).calls);
                }
                let end = list.finish();
                assert_eq!(end.content, "");
                deltas.extend(end.calls);
                assert_eq!(collect(deltas), whole, "split at {cut}, {cut2}");
            }
        }
    }

    #[test]
    fn a_call_is_announced_before_its_arguments_end() {
        let mut list = CallList::default();
        assert!(list.push("[{\"name\": \"get_wea").calls.is_empty());
        let first = list.push("ther\", \"arguments\": {\"ci").calls;
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].name.as_deref(), Some("get_weather"));
        assert_eq!(first[0].arguments, "{\"ci");
        let more = list.push("ty\": \"Paris\"}").calls;
        assert_eq!(
            (more[0].name.as_ref(), more[0].arguments.as_str()),
            (None, "ty\": \"Paris\"}")
        );
    }

    #[test]
    fn a_list_cut_short_keeps_what_was_written() {
        // No name complete: the text is the answer.
        let mut list = CallList::default();
        list.push("[{\"name\": \"f");
        assert_eq!(list.finish().content, "[{\"name\": \"f");
        assert_eq!(
            CallList::read_all("[{\"name\": \"f\""),
            ("[{\"name\": \"f\"".to_string(), vec![])
        );
        // Whole: the complete calls only.
        let cut = "[{\"name\": \"f\", \"arguments\": {}}, {\"name\": \"f\", \"argu";
        let (text, calls) = CallList::read_all(cut);
        assert_eq!((text.as_str(), calls.len()), ("", 1));
        // Not a list at all.
        assert_eq!(CallList::read_all("hello").0, "hello");
    }

    #[test]
    fn calls_past_the_cap_are_not_read() {
        let many = format!(
            "[{}]",
            vec!["{\"name\": \"f\", \"arguments\": {}}"; MAX_CALLS + 5].join(",")
        );
        assert_eq!(CallList::read_all(&many).1.len(), MAX_CALLS);
    }
}

//! gpt-oss's harmony messages in an answer's text ([`super::ToolFormat::Harmony`]): what is left
//! after the reasoning splitter took the analysis out is a run of messages, each a header
//! (`<|start|>assistant`, `<|channel|>NAME`, a recipient `to=…`, `<|constrain|>json`) up to
//! `<|message|>`, then its text up to `<|end|>`, `<|call|>` or `<|return|>`. A message addressed
//! `to=functions.NAME` is a call whose text is its JSON arguments; other headers and the ends
//! are dropped, and their messages' text is the answer's. A header is at most [`MAX_HEADER`]
//! bytes; one that does not end in time, or arguments that are not JSON, are text as written.

use serde_json::{Value, json};

use super::{Read, call_of};

/// What marks a harmony chat template (its channel tag).
pub const TEMPLATE_MARK: &str = "<|channel|>";
/// A message's recipient; before the channel in some answers, after it in others.
pub const RECIPIENT: &str = "to=";
const FUNCTIONS: &str = "functions.";
const MESSAGE: &str = "<|message|>";
/// Where the answer's text stops: a header's start (the recipient included, for the answers
/// that write it before the channel), or a message's end.
pub const MARKS: [&str; 6] = [
    "<|start|>",
    "<|channel|>",
    "to=functions.",
    "<|end|>",
    "<|call|>",
    "<|return|>",
];
const ENDS: [&str; 3] = ["<|end|>", "<|call|>", "<|return|>"];
/// The longest header read before its marker is taken as text.
const MAX_HEADER: usize = 512;

/// One message end, or one header and (for a call) its arguments, at the start of `buf`.
pub(super) fn read(buf: &str, end: bool) -> Read {
    let t = buf.trim_start();
    let lead = buf.len() - t.len();
    if let Some(e) = ENDS.iter().find(|e| t.starts_with(**e)) {
        return Read::Skip {
            used: lead + e.len(),
        };
    }
    // Not a header after all: its marker is text.
    let text = || Read::Done {
        used: lead
            + MARKS
                .iter()
                .find(|m| t.starts_with(**m))
                .map_or(t.len(), |m| m.len()),
        calls: Vec::new(),
    };
    let Some(h) = t.find(MESSAGE) else {
        return if end || t.len() > MAX_HEADER {
            text()
        } else {
            Read::More
        };
    };
    let header = &t[..h];
    if h > MAX_HEADER || ENDS.iter().any(|e| header.contains(e)) {
        return text();
    }
    let body_at = lead + h + MESSAGE.len();
    let Some(r) = header.find(RECIPIENT) else {
        return Read::Skip { used: body_at };
    };
    let r = &header[r + RECIPIENT.len()..];
    let recipient = &r[..r
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(r.len())];
    let body = &buf[body_at..];
    let close = ENDS
        .iter()
        .filter_map(|e| body.find(e).map(|i| (i, e.len())))
        .min();
    let (args, used) = match close {
        Some((i, n)) => (&body[..i], body_at + i + n),
        None if end => (body, buf.len()),
        None => return Read::More,
    };
    // A recipient other than a function (a built-in tool this server does not run) is text.
    let calls = recipient
        .strip_prefix(FUNCTIONS)
        .zip(serde_json::from_str::<Value>(args.trim()).ok())
        .and_then(|(name, a)| call_of(&json!({"name": name, "arguments": a})))
        .into_iter()
        .collect();
    Read::Done { used, calls }
}

#[cfg(test)]
mod tests {
    use super::super::tests::call;
    use super::super::{ToolCall, ToolCallParser, ToolFormat, collect};

    /// What the reasoning splitter leaves of gpt-oss answers, read in every split of the text.
    #[test]
    fn harmony_calls_and_preambles_in_any_pieces() {
        let cases: [(&str, &str, Vec<ToolCall>); 5] = [
            // A preamble, then a call (channel first, `<|call|>` kept by a client's detokenizer).
            (
                "<|channel|>commentary<|message|>Checking.<|end|>\
                 <|channel|>commentary to=functions.get_weather <|constrain|>json\
                 <|message|>{\"city\": \"Paris\"}<|call|>",
                "Checking.",
                vec![call("get_weather", r#"{"city":"Paris"}"#)],
            ),
            // The recipient first, right after the reasoning took `<|start|>assistant`; the
            // output ends at `<|call|>`, a stop token, so the text ends with the arguments.
            (
                " to=functions.add<|channel|>commentary json<|message|>{\"a\":2,\"b\":3}",
                "",
                vec![call("add", r#"{"a":2,"b":3}"#)],
            ),
            // No call: the final message's text alone.
            ("<|channel|>final<|message|>It is 4.", "It is 4.", vec![]),
            // Arguments that are not JSON, and a built-in tool's recipient, are text.
            (
                "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops",
                "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{oops",
                vec![],
            ),
            (
                "<|channel|>analysis to=python<|message|>print(1)<|call|>",
                "<|channel|>analysis to=python<|message|>print(1)<|call|>",
                vec![],
            ),
        ];
        for (text, content, calls) in cases {
            for cut in 0..=text.len() {
                let mut p = ToolCallParser::new(ToolFormat::Harmony);
                let mut step = p.push(&text[..cut]);
                step.extend(p.push(&text[cut..]));
                step.extend(p.finish());
                assert_eq!(step.content, content, "{text:?} cut at {cut}");
                assert_eq!(collect(step.calls), calls, "{text:?} cut at {cut}");
            }
        }
        // Prose that mentions a recipient, and a header that never ends, stay text.
        let prose = "Send it to=functions.x later, or <|channel|> ".repeat(20);
        assert_eq!(
            ToolCallParser::parse_all(ToolFormat::Harmony, &prose),
            (prose.clone(), vec![])
        );
    }
}

//! Tool calls over the API: `tools` and `tool_choice` read and checked, `required` and a named
//! tool enforced with a JSON-schema constraint (vLLM's way), `auto` parsed out of the answer in
//! the model family's format ([`ToolFormat::for_template`]), and the calls put into a chat
//! answer: `message.tool_calls` whole, `delta.tool_calls` streamed, `finish_reason: "tool_calls"`.
//!
//! `tool_choice: "none"` renders the tools (as vLLM does) and parses nothing.

use serde_json::{Map, Value, json};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::constraint::Grammar;
use tpslab_engine::text::tool_calls::{
    MAX_CALLS, ToolCall, ToolCallParser, ToolDelta, ToolFormat, ToolStep,
};

use super::errors::ApiError;
use super::structured::Asked;

const F: &str = "tool_choice";

/// What a request asked of its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// Tools rendered, nothing parsed.
    None,
    /// The model may call: calls are parsed out of its answer.
    Auto,
    /// At least one call, enforced.
    Required,
    /// This tool, enforced.
    Named(String),
}

/// A request's tools, checked: the choice, and each function's name and parameters schema.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub choice: Choice,
    pub functions: Vec<(String, Value)>,
}

/// The functions of a chat body's `tools` (`[{type: "function", function: {name, parameters}}]`).
fn functions(body: &Value) -> Result<Vec<(String, Value)>, ApiError> {
    let Some(tools) = body.get("tools").filter(|t| !t.is_null()) else {
        return Ok(Vec::new());
    };
    let bad = |m: String| Err(ApiError::bad_param("tools", m));
    let Some(list) = tools.as_array() else {
        return bad("tools must be a list".into());
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("function");
        if kind != "function" {
            return bad(format!(
                "tools[{i}] has type {kind:.40?}; only function tools are supported"
            ));
        }
        let f = t.get("function").unwrap_or(t);
        let Some(name) = f.get("name").and_then(Value::as_str).filter(|n| !n.is_empty()) else {
            return bad(format!("tools[{i}] needs a function name"));
        };
        let params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => return bad(format!("tools[{i}].function.parameters must be an object")),
        };
        out.push((name.to_string(), params));
    }
    Ok(out)
}

/// Reads `tools` and `tool_choice`; `None` when the request has no tools and no choice. A
/// choice naming an unknown tool, or asking for calls with no tools, is a 400 naming
/// `tool_choice`; so is an enforced choice beside another output constraint.
pub fn plan(body: &Value, other_constraint: Option<&Asked>) -> Result<Option<ToolPlan>, ApiError> {
    let functions = functions(body)?;
    let choice = match body.get(F).filter(|c| !c.is_null()) {
        None if functions.is_empty() => return Ok(None),
        None => Choice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(ApiError::bad_param(
                    F,
                    format!("tool_choice {other:.40?} is not one of none, auto, required, or a function"),
                ));
            }
        },
        Some(Value::Object(o)) => Choice::Named(named(o)?),
        Some(_) => {
            return Err(ApiError::bad_param(
                F,
                "tool_choice must be a string or {\"type\": \"function\", \"function\": {\"name\": ..}}",
            ));
        }
    };
    if let Choice::Named(n) = &choice
        && !functions.iter().any(|(f, _)| f == n)
    {
        return Err(ApiError::bad_param(
            F,
            format!("tool_choice names the function {n:.80?}, which is not in tools"),
        ));
    }
    if matches!(choice, Choice::Required | Choice::Auto) && functions.is_empty() {
        return Err(ApiError::bad_param(F, "tool_choice asks for tool calls but there are no tools"));
    }
    let enforced = matches!(choice, Choice::Required | Choice::Named(_));
    if enforced && let Some(a) = other_constraint {
        return Err(ApiError::bad_param(
            F,
            format!(
                "tool_choice {} is enforced with a grammar and cannot be combined with {}",
                if choice == Choice::Required { "required" } else { "with a named function" },
                a.field
            ),
        ));
    }
    Ok(Some(ToolPlan { choice, functions }))
}

/// The name in `{"type": "function", "function": {"name": ..}}` (or Responses' flat
/// `{"type": "function", "name": ..}`).
fn named(o: &Map<String, Value>) -> Result<String, ApiError> {
    if o.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::bad_param(F, "tool_choice objects must have type \"function\""));
    }
    o.get("function")
        .and_then(|f| f.get("name"))
        .or_else(|| o.get("name"))
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .ok_or_else(|| ApiError::bad_param(F, "tool_choice needs function.name"))
}

fn call_schema(name: &str, params: &Value) -> Value {
    json!({
        "type": "object",
        "properties": {"name": {"const": name}, "arguments": params},
        "required": ["name", "arguments"],
        "additionalProperties": false,
    })
}

impl ToolPlan {
    /// The constraint an enforced choice puts on the output: one call object for a named tool,
    /// an array of one or more for `required`.
    pub fn constraint(&self) -> Option<Asked> {
        let schema = match &self.choice {
            Choice::Named(n) => {
                let params = self.functions.iter().find(|(f, _)| f == n).map(|(_, p)| p)?;
                call_schema(n, params)
            }
            Choice::Required => {
                let any: Vec<Value> = self.functions.iter().map(|(n, p)| call_schema(n, p)).collect();
                json!({
                    "type": "array",
                    "items": {"anyOf": any},
                    "minItems": 1,
                    "maxItems": MAX_CALLS,
                })
            }
            Choice::None | Choice::Auto => return None,
        };
        Some(Asked {
            field: F,
            grammar: Grammar::json_schema(schema),
        })
    }
}

/// How one answer's text is read for calls.
#[derive(Debug, Clone)]
pub enum ToolParse {
    /// `auto`: the family's format, as the text streams.
    Parse(ToolCallParser),
    /// Enforced: the whole output is the constrained JSON, read at the end.
    Json(String),
}

impl ToolParse {
    /// The reader of a request's answer, if its tools ask for one.
    pub fn for_plan(plan: Option<&ToolPlan>, lm: &LoadedModel) -> Option<Self> {
        match plan?.choice {
            Choice::None => None,
            Choice::Auto => Some(ToolParse::Parse(ToolCallParser::new(ToolFormat::for_template(
                lm.template.source(),
            )))),
            Choice::Required | Choice::Named(_) => Some(ToolParse::Json(String::new())),
        }
    }

    pub fn push(&mut self, content: &str) -> ToolStep {
        match self {
            ToolParse::Parse(p) => p.push(content),
            ToolParse::Json(buf) => {
                buf.push_str(content);
                ToolStep::default()
            }
        }
    }

    pub fn finish(&mut self) -> ToolStep {
        match self {
            ToolParse::Parse(p) => p.finish(),
            ToolParse::Json(buf) => {
                let text = std::mem::take(buf);
                match json_calls(&text) {
                    Some(calls) => ToolStep {
                        content: String::new(),
                        calls: deltas(calls),
                    },
                    // Cut short (max_tokens): what was written is the answer's text.
                    None => ToolStep {
                        content: text,
                        calls: Vec::new(),
                    },
                }
            }
        }
    }

    /// A whole answer's text and calls.
    pub fn parse_all(mut self, content: &str) -> (String, Vec<ToolCall>) {
        let mut step = self.push(content);
        step.extend(self.finish());
        (step.content, tpslab_engine::text::tool_calls::collect(step.calls))
    }
}

/// The calls of an enforced output: one call object, or an array of them.
fn json_calls(text: &str) -> Option<Vec<ToolCall>> {
    let one = |v: &Value| {
        Some(ToolCall {
            name: v.get("name")?.as_str()?.to_string(),
            arguments: serde_json::to_string(v.get("arguments")?).ok()?,
        })
    };
    match serde_json::from_str::<Value>(text.trim()).ok()? {
        Value::Array(items) => items.iter().map(one).collect(),
        v @ Value::Object(_) => one(&v).map(|c| vec![c]),
        _ => None,
    }
}

fn deltas(calls: Vec<ToolCall>) -> Vec<ToolDelta> {
    calls
        .into_iter()
        .enumerate()
        .flat_map(|(index, c)| {
            [
                ToolDelta {
                    index,
                    name: Some(c.name),
                    arguments: String::new(),
                },
                ToolDelta {
                    index,
                    name: None,
                    arguments: c.arguments,
                },
            ]
        })
        .collect()
}

/// A fresh call id, `call_` and 24 random hex digits.
pub fn call_id() -> String {
    format!("call_{}", random_hex())
}

/// 24 random hex digits: std's randomly keyed SipHash over a clock and a counter (no extra
/// crate; ids need to be unique, not secret).
pub fn random_hex() -> String {
    use std::hash::{BuildHasher, Hasher};
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let word = |salt: u64| {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(n ^ salt);
        h.write_u64(t);
        h.finish()
    };
    format!("{:016x}{:08x}", word(0), word(1) >> 32)
}

/// Puts whole calls into a chat completion: `message.tool_calls`, `content` null when the
/// answer has no other text, `finish_reason: "tool_calls"`.
pub fn into_chat_response(v: &mut Value, content: &str, calls: &[ToolCall]) {
    let Some(choice) = v.pointer_mut("/choices/0") else {
        return;
    };
    choice["message"]["content"] = json!(content);
    if calls.is_empty() {
        return;
    }
    if content.trim().is_empty() {
        choice["message"]["content"] = Value::Null;
    }
    choice["message"]["tool_calls"] = calls
        .iter()
        .map(|c| {
            json!({
                "id": call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })
        })
        .collect();
    choice["finish_reason"] = json!("tool_calls");
}

/// A streamed chat answer's tool state: the reader, the ids given out, whether a call was made.
#[derive(Debug, Clone)]
pub struct ToolStream {
    parse: ToolParse,
    ids: Vec<String>,
    pending: Vec<ToolDelta>,
}

impl ToolStream {
    pub fn new(parse: ToolParse) -> Self {
        Self {
            parse,
            ids: Vec::new(),
            pending: Vec::new(),
        }
    }

    /// Content through the reader: what is text is returned, call pieces wait for the chunk.
    pub fn push(&mut self, content: &str) -> String {
        let step = self.parse.push(content);
        self.pending.extend(step.calls);
        step.content
    }

    /// The end of the answer: the text still held.
    pub fn finish(&mut self) -> String {
        let step = self.parse.finish();
        self.pending.extend(step.calls);
        step.content
    }

    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Puts the waiting call pieces into a chat chunk as `delta.tool_calls`, and on the last
    /// chunk turns `finish_reason` into `"tool_calls"` when a call was made.
    pub fn patch_chunk(&mut self, chunk: &mut Value) {
        let Some(choice) = chunk.pointer_mut("/choices/0") else {
            return;
        };
        if !self.pending.is_empty() {
            let mut list = Vec::new();
            for d in self.pending.drain(..) {
                list.push(match d.name {
                    Some(name) => {
                        let id = call_id();
                        self.ids.push(id.clone());
                        json!({"index": d.index, "id": id, "type": "function",
                               "function": {"name": name, "arguments": d.arguments}})
                    }
                    None => json!({"index": d.index, "function": {"arguments": d.arguments}}),
                });
            }
            choice["delta"]["tool_calls"] = Value::Array(list);
        }
        if !self.ids.is_empty() && choice.get("finish_reason").is_some_and(|f| !f.is_null()) {
            choice["finish_reason"] = json!("tool_calls");
        }
    }

    /// Takes the waiting call pieces (for another stream shape than chat chunks).
    pub fn take(&mut self) -> Vec<ToolDelta> {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_checked_against_tools() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let p = |c: Value| plan(&json!({"tools": tools, "tool_choice": c}), None);
        assert_eq!(p(json!("auto")).expect("auto").map(|p| p.choice), Some(Choice::Auto));
        assert_eq!(
            p(json!({"type": "function", "function": {"name": "f"}})).expect("named").map(|p| p.choice),
            Some(Choice::Named("f".into()))
        );
        let e = p(json!({"type": "function", "function": {"name": "g"}})).expect_err("unknown");
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(p(json!("sometimes")).is_err());
        assert!(plan(&json!({"tool_choice": "required"}), None).is_err());
        assert_eq!(plan(&json!({}), None).expect("none"), None);
        let req = p(json!("required")).expect("required").expect("plan");
        assert!(req.constraint().is_some());
    }

    #[test]
    fn enforced_output_becomes_calls() {
        let (text, calls) = ToolParse::Json(String::new())
            .parse_all("[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
        assert_eq!(text, "");
        assert_eq!(calls, vec![ToolCall { name: "f".into(), arguments: "{\"a\":1}".into() }]);
        let (text, calls) = ToolParse::Json(String::new()).parse_all("[{\"name\": \"f\"");
        assert_eq!((text.as_str(), calls.len()), ("[{\"name\": \"f\"", 0));
    }
}

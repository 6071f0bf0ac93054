//! Tool calls over the API: `tools` and `tool_choice` read and checked ([`plan`]), `required`
//! and a named tool enforced with a JSON-schema constraint (vLLM's way), `auto` parsed out of
//! the answer in the model family's format ([`ToolFormat::for_template`]), and the calls in
//! OpenAI's shapes: `message.tool_calls` whole, `delta.tool_calls` streamed.
//!
//! `tool_choice: "none"` renders the tools (as vLLM does) and parses nothing. A named tool's
//! output is its arguments alone (the schema is the tool's `parameters`), so they stream as
//! they are written; `required` writes a JSON list of `{name, arguments}`, read as it streams
//! by [`super::tool_list::CallList`].

use serde_json::{Map, Value, json};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::constraint::Grammar;
use tpslab_engine::text::tool_calls::{
    self, MAX_CALLS, ToolCall, ToolCallParser, ToolDelta, ToolFormat, ToolStep,
};

use super::errors::ApiError;
use super::structured::Asked;
use super::tool_list::CallList;

const F: &str = "tool_choice";
/// OpenAI's limits on a function name: 1 to 64 of `a-z A-Z 0-9 _ -` (dots allowed too, as
/// vLLM and several SDKs send them).
const MAX_NAME: usize = 64;
/// Most tools one request may declare.
pub const MAX_TOOLS: usize = 128;

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

/// A request's tools, checked: the choice, each function's name and parameters schema, and
/// whether several calls may be made at once (`parallel_tool_calls`).
#[derive(Debug, Clone, PartialEq)]
pub struct ToolPlan {
    pub choice: Choice,
    pub functions: Vec<(String, Value)>,
    pub parallel: bool,
}

fn valid_name(n: &str) -> bool {
    (1..=MAX_NAME).contains(&n.len())
        && n.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
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
    if list.len() > MAX_TOOLS {
        return Err(ApiError::over_cap(
            "tools",
            format!(
                "{} tools; this server takes at most {MAX_TOOLS}",
                list.len()
            ),
        ));
    }
    let mut out: Vec<(String, Value)> = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
        if kind != "function" {
            return bad(format!(
                "tools[{i}] has type {kind:.40?}; only function tools are supported"
            ));
        }
        let Some(f) = t.get("function").filter(|f| f.is_object()) else {
            return bad(format!("tools[{i}] needs a function object"));
        };
        let Some(name) = f.get("name").and_then(Value::as_str) else {
            return bad(format!("tools[{i}] needs a function name"));
        };
        if !valid_name(name) {
            return bad(format!(
                "tools[{i}].function.name {name:.80?} must be 1 to {MAX_NAME} letters, digits, \
                 underscores, dashes or dots"
            ));
        }
        if out.iter().any(|(n, _)| n == name) {
            return bad(format!("tools[{i}] repeats the function name {name:?}"));
        }
        let params = match f.get("parameters") {
            None | Some(Value::Null) => json!({"type": "object"}),
            Some(p @ Value::Object(_)) => p.clone(),
            Some(_) => {
                return bad(format!(
                    "tools[{i}].function.parameters must be a JSON schema object"
                ));
            }
        };
        out.push((name.to_string(), params));
    }
    Ok(out)
}

/// Reads `tools`, `tool_choice` and `parallel_tool_calls`; `None` when the request has no tools
/// and no choice. A choice naming an unknown tool, or asking for calls with no tools, is a 400
/// naming `tool_choice`; so is an enforced choice beside another output constraint.
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
                    format!(
                        "tool_choice {other:.40?} is not one of none, auto, required, or a function"
                    ),
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
        return Err(ApiError::bad_param(
            F,
            "tool_choice asks for tool calls but there are no tools",
        ));
    }
    let enforced = matches!(choice, Choice::Required | Choice::Named(_));
    if enforced && let Some(a) = other_constraint {
        return Err(ApiError::bad_param(
            F,
            format!(
                "an enforced tool_choice (required or a named function) is a grammar of its own \
                 and cannot be combined with {}",
                a.field
            ),
        ));
    }
    let parallel = match body.get("parallel_tool_calls") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::bad_param(
                "parallel_tool_calls",
                "parallel_tool_calls must be a boolean",
            ));
        }
    };
    Ok(Some(ToolPlan {
        choice,
        functions,
        parallel,
    }))
}

/// The name in `{"type": "function", "function": {"name": ..}}` (or Responses' flat
/// `{"type": "function", "name": ..}`).
fn named(o: &Map<String, Value>) -> Result<String, ApiError> {
    if o.get("type").and_then(Value::as_str) != Some("function") {
        return Err(ApiError::bad_param(
            F,
            "tool_choice objects must have type \"function\"",
        ));
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
    /// The constraint an enforced choice puts on the output: a named tool's arguments, or a
    /// list of one or more `{name, arguments}` for `required` (one only without parallel calls).
    /// Its field is `tools`: a schema the grammar compiler refuses is the tools' fault.
    pub fn constraint(&self) -> Option<Asked> {
        let schema = match &self.choice {
            Choice::Named(n) => self.functions.iter().find(|(f, _)| f == n)?.1.clone(),
            Choice::Required => {
                let any: Vec<Value> = self
                    .functions
                    .iter()
                    .map(|(n, p)| call_schema(n, p))
                    .collect();
                json!({
                    "type": "array",
                    "items": {"anyOf": any},
                    "minItems": 1,
                    "maxItems": if self.parallel { MAX_CALLS } else { 1 },
                })
            }
            Choice::None | Choice::Auto => return None,
        };
        Some(Asked {
            field: "tools",
            grammar: Grammar::json_schema(schema),
        })
    }
}

/// How one answer's text is read for calls.
#[derive(Debug, Clone)]
pub enum ToolParse {
    /// `auto`: the family's format, as the text streams.
    Auto(ToolCallParser),
    /// A named tool: the whole output is its arguments, streamed as they come.
    Named { name: String, started: bool },
    /// `required`: the whole output is the constrained JSON list, read as it streams.
    Required(CallList),
}

impl ToolParse {
    /// The reader of a request's answer, if its tools ask for one.
    pub fn for_plan(plan: Option<&ToolPlan>, lm: &LoadedModel) -> Option<Self> {
        match &plan?.choice {
            Choice::None => None,
            Choice::Auto => Some(ToolParse::Auto(ToolCallParser::new(
                ToolFormat::for_template(lm.template.source()),
            ))),
            Choice::Named(name) => Some(ToolParse::Named {
                name: name.clone(),
                started: false,
            }),
            Choice::Required => Some(ToolParse::Required(CallList::default())),
        }
    }

    pub fn push(&mut self, content: &str) -> ToolStep {
        match self {
            ToolParse::Auto(p) => p.push(content),
            ToolParse::Named { name, started } => {
                if content.is_empty() {
                    return ToolStep::default();
                }
                let first = !std::mem::replace(started, true);
                ToolStep {
                    content: String::new(),
                    calls: vec![ToolDelta {
                        index: 0,
                        name: first.then(|| name.clone()),
                        arguments: content.to_string(),
                    }],
                }
            }
            ToolParse::Required(list) => list.push(content),
        }
    }

    pub fn finish(&mut self) -> ToolStep {
        match self {
            ToolParse::Auto(p) => p.finish(),
            // An empty answer still names its call.
            ToolParse::Named { name, started } if !*started => {
                *started = true;
                ToolStep {
                    content: String::new(),
                    calls: vec![ToolDelta {
                        index: 0,
                        name: Some(name.clone()),
                        arguments: String::new(),
                    }],
                }
            }
            ToolParse::Named { .. } => ToolStep::default(),
            ToolParse::Required(list) => list.finish(),
        }
    }

    /// A whole answer's text and calls.
    pub fn parse_all(mut self, content: &str) -> (String, Vec<ToolCall>) {
        if let ToolParse::Required(_) = self {
            return CallList::read_all(content);
        }
        let mut step = self.push(content);
        step.extend(self.finish());
        (step.content, tool_calls::collect(step.calls))
    }
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

/// Whole calls as `message.tool_calls`.
pub fn calls_json(calls: &[ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({
                "id": call_id(),
                "type": "function",
                "function": {"name": c.name, "arguments": c.arguments},
            })
        })
        .collect()
}

/// Streamed call pieces as `delta.tool_calls`: a call's first piece carries its id, type and
/// name (and maybe arguments), later ones argument fragments only.
pub fn deltas_json(deltas: Vec<ToolDelta>) -> Value {
    deltas
        .into_iter()
        .map(|d| match d.name {
            Some(name) => json!({"index": d.index, "id": call_id(), "type": "function",
                                 "function": {"name": name, "arguments": d.arguments}}),
            None => json!({"index": d.index, "function": {"arguments": d.arguments}}),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_are_checked_against_tools() {
        let tools = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
        let p = |c: Value| plan(&json!({"tools": tools, "tool_choice": c}), None);
        assert_eq!(
            p(json!("auto")).expect("auto").map(|p| p.choice),
            Some(Choice::Auto)
        );
        assert_eq!(
            p(json!({"type": "function", "function": {"name": "f"}}))
                .expect("named")
                .map(|p| p.choice),
            Some(Choice::Named("f".into()))
        );
        let e = p(json!({"type": "function", "function": {"name": "g"}})).expect_err("unknown");
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(p(json!("sometimes")).is_err());
        assert!(plan(&json!({"tool_choice": "required"}), None).is_err());
        assert_eq!(plan(&json!({}), None).expect("none"), None);
        let req = p(json!("required")).expect("required").expect("plan");
        assert!(req.constraint().is_some());
        let bad_name = json!({"tools": [{"type": "function", "function": {"name": "a b"}}]});
        assert_eq!(
            plan(&bad_name, None).expect_err("name").param.as_deref(),
            Some("tools")
        );
    }

    #[test]
    fn enforced_output_becomes_calls() {
        // The arguments as the model wrote them, as a named tool's stream.
        let (text, calls) = ToolParse::Required(CallList::default())
            .parse_all("[{\"name\": \"f\", \"arguments\": {\"a\": 1}}]");
        assert_eq!(text, "");
        assert_eq!(
            calls,
            vec![ToolCall {
                name: "f".into(),
                arguments: "{\"a\": 1}".into()
            }]
        );
        let mut named = ToolParse::Named {
            name: "f".into(),
            started: false,
        };
        let mut steps = named.push("{\"a\":");
        steps.extend(named.push("1}"));
        steps.extend(named.finish());
        assert_eq!(
            tool_calls::collect(steps.calls),
            vec![ToolCall {
                name: "f".into(),
                arguments: "{\"a\":1}".into()
            }]
        );
    }
}

//! A request's structured-output field, whichever dialect names it: OpenAI's `response_format`
//! (`json_object`, `json_schema`), vLLM's `guided_json` / `guided_regex` / `guided_grammar` /
//! `guided_choice` and `structured_outputs`, llama-server's `json_schema` and `grammar` (GBNF).
//! At most one per request; compiled against the model's vocabulary before the request is
//! queued, so a bad grammar is a 400 naming the field and the problem.

use serde_json::Value;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::serving::constraint::{self, Constraint, Grammar};

use super::errors::ApiError;

/// The constraint a body asks for, with the field that asked (for error messages).
#[derive(Debug, Clone, PartialEq)]
pub struct Asked {
    pub field: &'static str,
    pub grammar: Grammar,
}

fn text<'a>(field: &str, v: &'a Value) -> Result<&'a str, ApiError> {
    v.as_str()
        .ok_or_else(|| ApiError::bad_param(field, format!("{field} must be a string")))
}

/// A schema given as an object (or boolean), or as JSON text (vLLM takes both).
fn schema(field: &str, v: &Value) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(s)
            .map_err(|e| ApiError::bad_param(field, format!("{field} is not valid JSON: {e}"))),
        Value::Object(_) | Value::Bool(_) => Ok(v.clone()),
        _ => Err(ApiError::bad_param(
            field,
            format!("{field} must be a JSON schema (an object)"),
        )),
    }
}

fn strict_schema(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    Ok(Grammar::json_schema(schema(field, v)?))
}

fn regex(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    Ok(Grammar::Regex(text(field, v)?.to_string()))
}

/// llama-server's `grammar` is always GBNF.
fn gbnf(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    Ok(Grammar::Gbnf(text(field, v)?.to_string()))
}

fn grammar_text(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    Ok(Grammar::from_grammar_text(text(field, v)?))
}

/// `guided_choice`: exactly one of the strings.
fn choice(field: &str, v: &Value) -> Result<Grammar, ApiError> {
    let items = v
        .as_array()
        .filter(|a| !a.is_empty())
        .ok_or_else(|| ApiError::bad_param(field, format!("{field} must be a list of strings")))?;
    let mut alts = Vec::with_capacity(items.len());
    for it in items {
        alts.push(regex_escape(text(field, it)?));
    }
    Ok(Grammar::Regex(format!("({})", alts.join("|"))))
}

fn regex_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$#&-~".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// OpenAI's `response_format`; `None` for `{"type": "text"}`.
fn response_format(v: &Value) -> Result<Option<Grammar>, ApiError> {
    const F: &str = "response_format";
    let kind = v.get("type").and_then(Value::as_str).ok_or_else(|| {
        ApiError::bad_param(
            F,
            "response_format needs a type: text, json_object or json_schema",
        )
    })?;
    match kind {
        "text" => Ok(None),
        // llama-server and vLLM read a schema beside `json_object` too.
        "json_object" => Ok(Some(match v.get("schema") {
            Some(s) if !s.is_null() => Grammar::json_schema(schema(F, s)?),
            _ => Grammar::JsonObject,
        })),
        "json_schema" => {
            let js = v
                .get("json_schema")
                .filter(|j| j.is_object())
                .ok_or_else(|| {
                    ApiError::bad_param(F, "response_format json_schema needs a json_schema object")
                })?;
            let s = js.get("schema").filter(|s| !s.is_null()).ok_or_else(|| {
                ApiError::bad_param(F, "response_format.json_schema needs a schema")
            })?;
            let strict = js.get("strict").and_then(Value::as_bool).unwrap_or(false);
            Ok(Some(Grammar::JsonSchema {
                schema: schema(F, s)?,
                strict,
            }))
        }
        other => Err(ApiError::bad_param(
            F,
            format!(
                "response_format type {other:.40?} is not one of text, json_object, json_schema"
            ),
        )),
    }
}

/// vLLM's `structured_outputs` object: one of json, regex, choice, grammar, json_object.
fn structured_outputs(v: &Value) -> Result<Vec<Asked>, ApiError> {
    const F: &str = "structured_outputs";
    let Some(o) = v.as_object() else {
        return Err(ApiError::bad_param(
            F,
            "structured_outputs must be an object",
        ));
    };
    let mut out = Vec::new();
    for (k, v) in o {
        if v.is_null() || v == &Value::Bool(false) {
            continue;
        }
        let grammar = match k.as_str() {
            "json" => strict_schema(F, v)?,
            "regex" => regex(F, v)?,
            "choice" => choice(F, v)?,
            "grammar" => grammar_text(F, v)?,
            "json_object" => Grammar::JsonObject,
            // Options of the backend, not constraints.
            "disable_any_whitespace" | "disable_additional_properties" | "whitespace_pattern" => {
                continue;
            }
            other => {
                return Err(ApiError::bad_param(
                    F,
                    format!("structured_outputs.{other:.40} is not supported"),
                ));
            }
        };
        out.push(Asked { field: F, grammar });
    }
    Ok(out)
}

/// The one constraint of a body, if any; two or more is a 400 naming them.
pub fn asked(body: &Value) -> Result<Option<Asked>, ApiError> {
    let mut found = Vec::new();
    let field = |name: &str| body.get(name).filter(|v| !v.is_null());
    if let Some(v) = field("response_format")
        && let Some(grammar) = response_format(v)?
    {
        found.push(Asked {
            field: "response_format",
            grammar,
        });
    }
    type Reader = fn(&str, &Value) -> Result<Grammar, ApiError>;
    let simple: [(&'static str, Reader); 6] = [
        ("guided_json", strict_schema),
        ("guided_regex", regex),
        ("guided_grammar", grammar_text),
        ("guided_choice", choice),
        ("json_schema", strict_schema),
        ("grammar", gbnf),
    ];
    for (name, read) in simple {
        if let Some(v) = field(name) {
            found.push(Asked {
                field: name,
                grammar: read(name, v)?,
            });
        }
    }
    if let Some(v) = field("structured_outputs") {
        found.extend(structured_outputs(v)?);
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|a| a.field).collect();
        return Err(ApiError::bad_param(
            found[1].field,
            format!(
                "more than one output constraint in one request ({}); send one",
                names.join(", ")
            ),
        ));
    }
    Ok(found.pop())
}

/// Compiles the constraint for the model (a 400 with llguidance's message when it cannot).
pub fn compile(lm: &LoadedModel, a: &Asked) -> Result<Constraint, ApiError> {
    let compiler = constraint::compiler_for(&lm.tokenizer)
        .map_err(|e| ApiError::bad_param(a.field, e.to_string()))?;
    compiler.compile(&a.grammar).map_err(|e| {
        let msg = e.to_string();
        let cut: String = msg.chars().take(600).collect();
        ApiError::bad_param(a.field, format!("{} cannot be used: {cut}", a.field))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_each_dialect_and_refuses_two() {
        let one = |b: Value| asked(&b).expect("parses").map(|a| a.grammar);
        assert_eq!(one(json!({})), None);
        assert_eq!(one(json!({"response_format": {"type": "text"}})), None);
        assert_eq!(
            one(json!({"response_format": {"type": "json_object"}})),
            Some(Grammar::JsonObject)
        );
        assert_eq!(
            one(json!({"grammar": "root ::= \"a\""})),
            Some(Grammar::Gbnf("root ::= \"a\"".into()))
        );
        assert_eq!(
            one(json!({"guided_grammar": "start: \"a\""})),
            Some(Grammar::Lark("start: \"a\"".into()))
        );
        assert_eq!(
            one(json!({"guided_choice": ["a b", "c"]})),
            Some(Grammar::Regex("(a b|c)".into()))
        );
        assert_eq!(
            one(json!({"guided_json": "{\"type\": \"integer\"}"})),
            Some(Grammar::json_schema(json!({"type": "integer"})))
        );
        assert!(asked(&json!({"guided_regex": "a", "json_schema": {}})).is_err());
        assert!(asked(&json!({"response_format": {"type": "xml"}})).is_err());
        assert!(asked(&json!({"response_format": {"type": "json_schema"}})).is_err());
        assert!(asked(&json!({"structured_outputs": {"regex": "a", "choice": ["b"]}})).is_err());
    }
}

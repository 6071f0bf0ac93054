//! Fields of OpenAI's (and vLLM's) request bodies that this server knows but cannot honour
//! (chat and completions in [`check`], chat's own in [`check_chat`], `/v1/responses` in
//! [`check_responses`]): each is
//! answered with a 400 naming it, never silently ignored. Fields that change nothing a
//! client sees (`user`, `metadata`, `store`, `service_tier`) are accepted as they are.

use serde_json::Value;

use super::errors::ApiError;

/// Whether a field is present with a value that asks for something (not null, false, 0, "",
/// an empty list or object).
fn asks(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Bool(true)) => true,
    }
}

fn refuse(field: &str, why: &str) -> ApiError {
    ApiError::bad_param(field, format!("{field}: {why}"))
}

/// The fields of a chat or completion body against what the engine can do.
pub fn check(body: &Value) -> Result<(), ApiError> {
    let get = |k: &str| body.get(k);
    let common: [(&str, &str); 4] = [
        (
            "use_beam_search",
            "beam search is not supported; sample n choices instead",
        ),
        (
            "min_tokens",
            "a minimum length is not supported (the engine stops at EOS)",
        ),
        (
            "truncate_prompt_tokens",
            "prompts are never truncated; send a shorter one",
        ),
        (
            "guided_whitespace_pattern",
            "a whitespace pattern for JSON is not supported",
        ),
    ];
    for (field, why) in common {
        if asks(get(field)) {
            return Err(refuse(field, why));
        }
    }
    if let Some(b) = get("best_of").and_then(Value::as_u64)
        && b > 1
    {
        return Err(refuse(
            "best_of",
            "best_of > 1 is not supported; ask for n choices and rank them yourself",
        ));
    }
    Ok(())
}

/// The fields only a chat body has, against what the engine can do (after [`check`]).
pub fn check_chat(body: &Value) -> Result<(), ApiError> {
    let get = |k: &str| body.get(k);
    let chat: [(&str, &str); 5] = [
        (
            "audio",
            "audio output is not supported: this server generates text",
        ),
        ("prediction", "predicted outputs are not supported"),
        ("web_search_options", "web search is not available"),
        (
            "functions",
            "the legacy functions field is not supported; send tools",
        ),
        (
            "function_call",
            "the legacy function_call field is not supported; send tool_choice",
        ),
    ];
    for (field, why) in chat {
        if asks(get(field)) {
            return Err(refuse(field, why));
        }
    }
    if let Some(Value::Array(m)) = get("modalities")
        && let Some(other) = m.iter().find(|v| v.as_str() != Some("text"))
    {
        let name = other.as_str().unwrap_or("a non-string value");
        return Err(refuse(
            "modalities",
            &format!("only text is generated here, not {name:.40}"),
        ));
    }
    content_parts(get("messages"))
}

/// A `/v1/responses` body's fields that need what this server does not have: a store of past
/// responses and conversations, background runs, and outputs it does not compute.
pub fn check_responses(body: &Value) -> Result<(), ApiError> {
    let fields: [(&str, &str); 5] = [
        (
            "previous_response_id",
            "this server stores no responses; send the whole conversation in input",
        ),
        (
            "conversation",
            "this server stores no conversations; send the whole conversation in input",
        ),
        ("background", "background responses are not supported"),
        (
            "prompt",
            "stored prompt templates are not supported; send instructions and input",
        ),
        (
            "max_tool_calls",
            "a cap on tool calls is not supported; use parallel_tool_calls: false for one",
        ),
    ];
    for (field, why) in fields {
        if asks(body.get(field)) {
            return Err(refuse(field, why));
        }
    }
    if body.get("truncation").and_then(Value::as_str) == Some("auto") {
        return Err(refuse(
            "truncation",
            "prompts are never truncated here (truncation: disabled); send a shorter input",
        ));
    }
    Ok(())
}

/// Message parts other than text (images, audio, files) are refused by position: the model
/// served here reads text only.
fn content_parts(messages: Option<&Value>) -> Result<(), ApiError> {
    let Some(Value::Array(messages)) = messages else {
        return Ok(());
    };
    for (i, m) in messages.iter().enumerate() {
        let Some(Value::Array(parts)) = m.get("content") else {
            continue;
        };
        for (j, p) in parts.iter().enumerate() {
            let kind = p.get("type").and_then(Value::as_str).unwrap_or("");
            if kind != "text" {
                let field = format!("messages[{i}].content[{j}]");
                let what = if kind.is_empty() {
                    "a part without a type".to_string()
                } else {
                    format!("a {kind:.40} part")
                };
                return Err(ApiError::bad_param(
                    &field,
                    format!("{field} is {what}; this model reads text parts only"),
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::openai::Kind;
    use serde_json::json;

    /// The error body, or "" when the body is accepted.
    fn refused(kind: Kind, body: Value) -> String {
        check(&body)
            .and_then(|()| match kind {
                Kind::Chat => check_chat(&body),
                Kind::Completion => Ok(()),
            })
            .err()
            .map(|e| e.body().to_string())
            .unwrap_or_default()
    }

    #[test]
    fn asking_fields_are_refused_by_name_and_empty_ones_pass() {
        let chat = |extra: Value| {
            let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().into_iter().flatten() {
                b[k] = v.clone();
            }
            b
        };
        assert!(refused(Kind::Chat, chat(json!({"audio": {"voice": "x"}}))).contains("audio"));
        assert!(
            refused(Kind::Chat, chat(json!({"modalities": ["text", "audio"]})))
                .contains("modalities")
        );
        assert!(refused(Kind::Chat, chat(json!({"audio": null, "modalities": ["text"], "user": "u", "store": true, "min_tokens": 0}))).is_empty());
        let img = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "what is this"},
            {"type": "image_url", "image_url": {"url": "data:"}}]}]});
        let e = refused(Kind::Chat, img);
        assert!(
            e.contains("messages[0].content[1]") && e.contains("image_url"),
            "{e}"
        );
        assert!(
            refused(Kind::Completion, json!({"prompt": "a", "best_of": 3})).contains("best_of")
        );
        assert!(refused(Kind::Completion, json!({"prompt": "a", "best_of": 1})).is_empty());
    }
}

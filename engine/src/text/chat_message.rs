//! What a chat template renders: the conversation's messages (OpenAI's shape, tool calls and
//! tool results included), the render's options (tools, documents, `add_generation_prompt`,
//! `enable_thinking`, the clock), and the messages as the template sees them.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use minijinja::value::{Enumerator, Object, Value};
use serde::{Deserialize, Serialize};

use crate::text::chat_time::RenderTime;

/// One message of a conversation, in the OpenAI / Hugging Face shape. Only `role` is required in
/// JSON; `content` may be null (an assistant turn that only calls tools), and the other fields
/// are left out of the template's view when absent, as a Python dict without those keys is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    #[serde(default)]
    pub content: Option<String>,
    /// The thinking of an earlier assistant turn (Qwen3's template puts it back in `<think>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    /// An assistant turn's calls, as OpenAI sends them (`{id, type, function: {name,
    /// arguments}}`); passed to the template as given, key order kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<serde_json::Value>>,
    /// A `tool` message: which call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// A `tool` message: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: Some(content.into()),
            reasoning_content: None,
            tool_calls: None,
            tool_call_id: None,
            name: None,
        }
    }

    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }

    /// An assistant turn that calls tools (`content` null, as OpenAI sends it).
    pub fn tool_calls(calls: Vec<serde_json::Value>) -> Self {
        Self {
            content: None,
            tool_calls: Some(calls),
            ..Self::new("assistant", "")
        }
    }

    /// A tool's result, answering the call `tool_call_id`.
    pub fn tool_result(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            tool_call_id: Some(tool_call_id.into()),
            ..Self::new("tool", content)
        }
    }

    /// The text, empty when the content is null.
    pub fn text(&self) -> &str {
        self.content.as_deref().unwrap_or_default()
    }
}

/// How one render is made, besides the messages: what transformers' `apply_chat_template` takes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RenderOptions {
    /// End with the opening of an assistant turn, so the model's next tokens are its answer.
    pub add_generation_prompt: bool,
    /// The OpenAI tool list (`[{type: "function", function: {name, description, parameters}}]`)
    /// as transformers passes it; None is Python's `tools=None`.
    pub tools: Option<Vec<serde_json::Value>>,
    /// Documents for retrieval-augmented templates; None is `documents=None`.
    pub documents: Option<Vec<serde_json::Value>>,
    /// Qwen3's and SmolLM3's switch; None leaves it undefined, as transformers does unless asked.
    pub enable_thinking: Option<bool>,
    /// What `strftime_now` sees as now.
    pub now: RenderTime,
    /// The variables llama-server adds to every render, from the same clock: `date_string`
    /// (`%d %b %Y`, which Llama 3.1's template prints as today's date, else its fixed
    /// "26 Jul 2024") and `datetime` (`%b %d %Y`). On by default; transformers passes neither.
    pub server_dates: bool,
}

impl RenderOptions {
    /// Nothing but `add_generation_prompt`, at this moment.
    pub fn new(add_generation_prompt: bool) -> Self {
        Self {
            add_generation_prompt,
            tools: None,
            documents: None,
            enable_thinking: None,
            now: RenderTime::now(),
            server_dates: true,
        }
    }

    /// A conversation nobody configured: now, with a generation prompt, and `enable_thinking`
    /// true as llama-server passes it (DeepSeek-R1's template otherwise closes `<think>` at
    /// once). What the CLI, the server and the chat window render with by default.
    pub fn conversation() -> Self {
        Self {
            enable_thinking: Some(true),
            ..Self::new(true)
        }
    }
}

/// llama.cpp's rule for a template that does not read a system message (its
/// `system_message_not_supported` workaround, common/chat.cpp): the first message's text, a
/// newline, then the second message's text become the second message; a system message alone is
/// dropped. Only a conversation that starts with a system message changes.
pub fn fold_system(messages: &[ChatMessage]) -> Vec<ChatMessage> {
    match messages {
        [first, second, rest @ ..] if first.role == "system" => {
            let mut merged = second.clone();
            merged.content = Some(format!("{}\n{}", first.text(), second.text()));
            std::iter::once(merged)
                .chain(rest.iter().cloned())
                .collect()
        }
        [first] if first.role == "system" => Vec::new(),
        _ => messages.to_vec(),
    }
}

/// A message as the template sees it: a map with its present keys in Python-dict order (role,
/// content, then the optional fields). When `content_read` is set, reading `content` raises it:
/// that is how the system-role probe tells whether a template uses a system message at all.
#[derive(Debug)]
pub(crate) struct MessageObject {
    pub msg: ChatMessage,
    pub content_read: Option<Arc<AtomicBool>>,
}

impl MessageObject {
    pub fn value(msg: ChatMessage, content_read: Option<Arc<AtomicBool>>) -> Value {
        Value::from_object(Self { msg, content_read })
    }
}

impl Object for MessageObject {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        let m = &self.msg;
        let text = |s: &Option<String>| s.as_deref().map(Value::from);
        match key.as_str()? {
            "role" => Some(Value::from(m.role.as_str())),
            "content" => {
                if let Some(flag) = &self.content_read {
                    flag.store(true, Ordering::Relaxed);
                }
                Some(text(&m.content).unwrap_or(Value::from(())))
            }
            "reasoning_content" => text(&m.reasoning_content),
            "tool_calls" => m.tool_calls.as_ref().map(Value::from_serialize),
            "tool_call_id" => text(&m.tool_call_id),
            "name" => text(&m.name),
            _ => None,
        }
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        let m = &self.msg;
        let mut keys = vec![Value::from("role"), Value::from("content")];
        for (key, present) in [
            ("reasoning_content", m.reasoning_content.is_some()),
            ("tool_calls", m.tool_calls.is_some()),
            ("tool_call_id", m.tool_call_id.is_some()),
            ("name", m.name.is_some()),
        ] {
            if present {
                keys.push(Value::from(key));
            }
        }
        Enumerator::Values(keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn old_json_still_parses_and_null_content_is_none() {
        let m: ChatMessage =
            serde_json::from_str(r#"{"role":"user","content":"hi"}"#).expect("json");
        assert_eq!(m, ChatMessage::user("hi"));
        let m: ChatMessage = serde_json::from_str(
            r#"{"role":"assistant","content":null,"tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        )
        .expect("json");
        assert_eq!(m.content, None);
        assert_eq!(m.tool_calls.as_ref().map(Vec::len), Some(1));
    }

    #[test]
    fn folding_follows_llama_cpp() {
        let conv = [
            ChatMessage::system("Be brief."),
            ChatMessage::user("Hi"),
            ChatMessage::assistant("Hello"),
        ];
        let folded = fold_system(&conv);
        assert_eq!(folded.len(), 2);
        assert_eq!(folded[0], ChatMessage::user("Be brief.\nHi"));
        assert!(fold_system(&conv[..1]).is_empty());
        assert_eq!(fold_system(&conv[1..]), conv[1..].to_vec());
    }
}

//! A chat request's conversation as the chat template gets it: OpenAI's messages (text parts,
//! tool calls, tool results), `tools`, `chat_template_kwargs.enable_thinking` and
//! `reasoning_effort`, translated the way llama-server does; and the prompt built from them with
//! the splitter of the answer's reasoning (shared by the server and the window's chat).

use serde::Deserialize;
use serde_json::{Map, Value};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::loaded::LoadError;
use tpslab_engine::text::chat::{ChatMessage, RenderOptions};
use tpslab_engine::text::reasoning::{ReasoningParser, ReasoningTags};

use super::errors::ApiError;

/// A message's content: a string, or a list of parts of which the text ones are used.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    #[serde(default)]
    pub content: Option<Content>,
    #[serde(default)]
    pub reasoning_content: Option<String>,
    /// OpenAI's shape: `[{id, type: "function", function: {name, arguments}}]`.
    #[serde(default)]
    pub tool_calls: Option<Vec<Map<String, Value>>>,
    #[serde(default)]
    pub tool_call_id: Option<String>,
    #[serde(default)]
    pub name: Option<String>,
}

/// The chat fields of a request body.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatBody {
    messages: Vec<Message>,
    #[serde(default)]
    tools: Option<Vec<Map<String, Value>>>,
    #[serde(default)]
    documents: Option<Vec<Value>>,
    /// vLLM's and llama-server's extra template arguments; `enable_thinking` is the one read.
    #[serde(default)]
    chat_template_kwargs: Option<Map<String, Value>>,
    /// OpenAI's field; `"none"` turns thinking off, as in llama-server.
    #[serde(default)]
    reasoning_effort: Option<String>,
}

/// The render options of a conversation nobody configured ([`RenderOptions::conversation`]).
pub fn default_options() -> RenderOptions {
    RenderOptions::conversation()
}

impl ChatBody {
    /// Bytes of text the conversation and its tools carry (checked against the prompt cap
    /// before anything is rendered).
    pub fn text_len(&self) -> usize {
        let messages = self.messages.iter().fold(0usize, |n, m| {
            let content = match &m.content {
                None => 0,
                Some(Content::Text(t)) => t.len(),
                Some(Content::Parts(p)) => p
                    .iter()
                    .map(|p| p.text.as_ref().map_or(0, String::len))
                    .sum(),
            };
            let opt = |s: &Option<String>| s.as_ref().map_or(0, String::len);
            n.saturating_add(m.role.len() + content)
                .saturating_add(opt(&m.reasoning_content) + opt(&m.tool_call_id) + opt(&m.name))
                .saturating_add(m.tool_calls.as_ref().map_or(0, json_len))
        });
        let tools = self.tools.as_ref().map_or(0, json_len);
        let documents = self.documents.as_ref().map_or(0, json_len);
        messages.saturating_add(tools).saturating_add(documents)
    }

    /// The messages and render options, checked (400 naming the parameter otherwise).
    pub fn into_chat(self) -> Result<(Vec<ChatMessage>, RenderOptions), ApiError> {
        if self.messages.is_empty() {
            return Err(ApiError::bad_param(
                "messages",
                "messages must not be empty",
            ));
        }
        let mut options = default_options();
        if let Some(kwargs) = &self.chat_template_kwargs
            && let Some(v) = kwargs.get("enable_thinking")
        {
            options.enable_thinking = Some(v.as_bool().ok_or_else(|| {
                ApiError::bad_param(
                    "chat_template_kwargs",
                    format!("chat_template_kwargs.enable_thinking must be a boolean, not {v}"),
                )
            })?);
        }
        if self.reasoning_effort.as_deref() == Some("none") {
            options.enable_thinking = Some(false);
        }
        options.tools = self
            .tools
            .map(|t| t.into_iter().map(Value::Object).collect());
        options.documents = self.documents;
        let messages = self
            .messages
            .into_iter()
            .map(to_chat)
            .collect::<Result<_, _>>()?;
        Ok((messages, options))
    }
}

/// One OpenAI message as templates expect it: text parts joined, a null content as "" (as
/// llama-server passes it), and tool-call arguments sent as a JSON string given to the template
/// as the object they encode (transformers' convention, and vLLM's and llama-server's
/// translation; an argument string that is not JSON stays a string).
fn to_chat(m: Message) -> Result<ChatMessage, ApiError> {
    let content = match m.content {
        None => String::new(),
        Some(Content::Text(t)) => t,
        Some(Content::Parts(parts)) => parts
            .into_iter()
            .filter(|p| p.kind == "text")
            .filter_map(|p| p.text)
            .collect::<Vec<_>>()
            .join("\n"),
    };
    let tool_calls = m.tool_calls.map(|calls| {
        calls
            .into_iter()
            .map(|mut call| {
                if let Some(Value::Object(f)) = call.get_mut("function")
                    && let Some(Value::String(args)) = f.get("arguments")
                    && let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(args)
                {
                    f.insert("arguments".into(), parsed);
                }
                Value::Object(call)
            })
            .collect()
    });
    Ok(ChatMessage {
        reasoning_content: m.reasoning_content,
        tool_calls,
        tool_call_id: m.tool_call_id,
        name: m.name,
        ..ChatMessage::new(m.role, content)
    })
}

/// A conversation's prompt: its tokens, and the splitter its answer's text goes through.
pub struct ChatPrompt {
    pub tokens: Vec<u32>,
    pub reasoning: ReasoningParser,
}

/// Renders the conversation with the model's template and tokenizes it
/// ([`LoadedModel::chat_tokens`]: users' and tools' text stays text). Blocking: the render may
/// take up to its time limit.
pub fn chat_prompt(
    lm: &LoadedModel,
    messages: &[ChatMessage],
    options: &RenderOptions,
) -> Result<ChatPrompt, LoadError> {
    let (text, tokens) = lm.chat_tokens(messages, options)?;
    let tags = ReasoningTags::for_template(lm.template.source());
    Ok(ChatPrompt {
        tokens,
        reasoning: ReasoningParser::for_prompt(tags, &text),
    })
}

/// JSON size of a request part, for the prompt cap.
fn json_len<T: serde::Serialize>(v: &T) -> usize {
    serde_json::to_vec(v).map_or(0, |v| v.len())
}

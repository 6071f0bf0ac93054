//! The chat's saved state: conversations with their own system prompt and sampling, their
//! messages, and the figures under each answer.

use serde::{Deserialize, Serialize};
use tpslab_engine::serving::sampler::SamplingParams;

use super::chat_schema::SchemaOption;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    User,
    Assistant,
}

/// What the user sees under an answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AnswerStats {
    pub tokens: usize,
    pub ttft_ms: Option<f64>,
    pub decode_tps: Option<f64>,
    pub finish: String,
    /// Of `tokens`, those the model spent thinking (the token that closes the block included).
    pub reasoning_tokens: usize,
    /// From the answer's first token to its last thinking token.
    pub reasoning_ms: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Message {
    pub role: Role,
    /// The answer (an assistant's), apart from its reasoning.
    pub text: String,
    /// What a thinking model wrote inside `<think>…</think>`, shown folded above the answer.
    pub reasoning: String,
    pub stats: Option<AnswerStats>,
}

impl Default for Message {
    fn default() -> Self {
        Self {
            role: Role::User,
            text: String::new(),
            reasoning: String::new(),
            stats: None,
        }
    }
}

/// One conversation with its own system prompt and sampling settings.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Conversation {
    pub id: u64,
    pub title: String,
    pub system: String,
    pub sampling: SamplingParams,
    pub max_tokens: usize,
    pub messages: Vec<Message>,
    /// The unsent text in the input box.
    pub draft: String,
    /// Structured output.
    #[serde(flatten)]
    pub schema: SchemaOption,
}

impl Default for Conversation {
    fn default() -> Self {
        Self {
            id: 0,
            title: "New chat".into(),
            system: String::new(),
            sampling: SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                repetition_penalty: 1.1,
                ..SamplingParams::default()
            },
            max_tokens: 256,
            messages: Vec::new(),
            draft: String::new(),
            schema: SchemaOption::default(),
        }
    }
}

/// The saved chat state: every conversation and which one is open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatState {
    pub conversations: Vec<Conversation>,
    pub active: u64,
    pub next_id: u64,
    pub show_settings: bool,
}

impl Default for ChatState {
    fn default() -> Self {
        Self {
            conversations: vec![Conversation {
                id: 1,
                title: "Chat 1".into(),
                ..Conversation::default()
            }],
            active: 1,
            next_id: 2,
            show_settings: false,
        }
    }
}

impl ChatState {
    pub fn get_mut(&mut self, id: u64) -> Option<&mut Conversation> {
        self.conversations.iter_mut().find(|c| c.id == id)
    }

    pub fn active_mut(&mut self) -> Option<&mut Conversation> {
        let id = self.active;
        self.get_mut(id)
    }

    pub fn new_conversation(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        self.conversations.push(Conversation {
            id,
            title: format!("Chat {id}"),
            ..Conversation::default()
        });
        self.active = id;
        id
    }

    pub fn delete(&mut self, id: u64) {
        self.conversations.retain(|c| c.id != id);
        if self.conversations.is_empty() {
            self.new_conversation();
        }
        if !self.conversations.iter().any(|c| c.id == self.active) {
            self.active = self.conversations.last().map_or(0, |c| c.id);
        }
    }
}

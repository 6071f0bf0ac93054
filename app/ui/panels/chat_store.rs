//! The chat's saved state: conversations with their own system prompt, sampling and stop
//! sequences, their messages (an answer keeps the others made for its turn, as branches), the
//! figures under each answer, and the named system prompts (presets).
//!
//! The format is versioned ([`CHAT_SCHEMA`]); every field has a default, so a chat saved by an
//! older version loads as it was (version 1: no branches, stop sequences or presets).

use serde::{Deserialize, Serialize};
use tpslab_engine::serving::sampler::SamplingParams;

use super::chat_schema::SchemaOption;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Role {
    User,
    Assistant,
}

/// The version of the saved chat format: 1 had no branches, stop sequences or presets.
pub const CHAT_SCHEMA: u32 = 2;

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
    /// The mean and the most sequences in the engine's batches its tokens were sampled in.
    pub batch_mean: Option<f64>,
    pub batch_max: Option<usize>,
    /// The chat's sampling settings when the answer was asked for.
    pub sampling: Option<SamplingParams>,
}

/// "42 tokens · TTFT 120 ms · 35.1 tok/s · batch 1.5 (max 2) · stop"
pub fn answer_stats_text(s: &AnswerStats) -> String {
    let ttft = s
        .ttft_ms
        .map_or("TTFT –".into(), |t| format!("TTFT {t:.0} ms"));
    let tps = s
        .decode_tps
        .map_or("– tok/s".into(), |t| format!("{t:.1} tok/s"));
    let batch = match (s.batch_mean, s.batch_max) {
        (Some(mean), Some(max)) => format!(" · batch {mean:.1} (max {max})"),
        _ => String::new(),
    };
    format!("{} tokens · {ttft} · {tps}{batch} · {}", s.tokens, s.finish)
}

/// The sampling settings an answer was made with, those that are off left out:
/// "temperature 0.70 · top-p 0.90 · repetition 1.10", or "greedy".
pub fn sampling_text(s: &SamplingParams) -> String {
    if s.temperature <= 0.0 {
        return "greedy".into();
    }
    let mut parts = vec![format!("temperature {:.2}", s.temperature)];
    if s.top_p < 1.0 {
        parts.push(format!("top-p {:.2}", s.top_p));
    }
    if s.top_k > 0 {
        parts.push(format!("top-k {}", s.top_k));
    }
    if s.min_p > 0.0 {
        parts.push(format!("min-p {:.2}", s.min_p));
    }
    if s.repetition_penalty != 1.0 {
        parts.push(format!("repetition {:.2}", s.repetition_penalty));
    }
    parts.join(" · ")
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
    /// An answer's branches: the other answers made for its turn (regenerated), in order, this
    /// one left out; it is number `shown` of them all (0-based).
    pub others: Vec<Message>,
    pub shown: usize,
}

impl Default for Message {
    fn default() -> Self {
        Self {
            role: Role::User,
            text: String::new(),
            reasoning: String::new(),
            stats: None,
            others: Vec::new(),
            shown: 0,
        }
    }
}

impl Message {
    /// How many answers its turn has (itself and its branches).
    pub fn branches(&self) -> usize {
        self.others.len() + 1
    }

    /// Shows answer `k` of its turn (0-based) in its place, keeping this one among the others.
    /// Out of range: nothing changes.
    pub fn show(&mut self, k: usize) {
        if k >= self.branches() || k == self.shown {
            return;
        }
        let mut others = std::mem::take(&mut self.others);
        let shown = self.shown.min(others.len());
        let cur = Message {
            shown: 0,
            ..std::mem::take(self)
        };
        others.insert(shown, cur);
        let mut next = others.remove(k);
        next.others = others;
        next.shown = k;
        *self = next;
    }

    /// A new empty answer for this one's turn, shown last, with this one and its branches kept.
    pub fn regenerated(mut self) -> Self {
        let mut others = std::mem::take(&mut self.others);
        let shown = self.shown.min(others.len());
        others.insert(shown, Message { shown: 0, ..self });
        Self {
            role: Role::Assistant,
            shown: others.len(),
            others,
            ..Self::default()
        }
    }

    /// Whether `query` (lower case) is in its text, its reasoning or a branch's.
    fn mentions(&self, query: &str) -> bool {
        self.text.to_lowercase().contains(query)
            || self.reasoning.to_lowercase().contains(query)
            || self.others.iter().any(|m| m.mentions(query))
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
    /// Strings that end an answer, one a line (the answer is cut before the first).
    pub stop_sequences: String,
    /// The preset whose system prompt was picked last.
    pub preset: Option<String>,
}

impl Conversation {
    /// The stop sequences, one a line, empty lines left out.
    pub fn stop_strings(&self) -> Vec<String> {
        (self.stop_sequences.lines())
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Whether `query` is in its title or its messages, whatever the case; every conversation
    /// matches an empty query.
    pub fn matches(&self, query: &str) -> bool {
        let q = query.trim().to_lowercase();
        q.is_empty()
            || self.title.to_lowercase().contains(&q)
            || self.messages.iter().any(|m| m.mentions(&q))
    }
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
            stop_sequences: String::new(),
            preset: None,
        }
    }
}

/// A named system prompt, picked for a conversation in its settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Preset {
    pub name: String,
    pub system: String,
}

/// The saved chat state: every conversation and which one is open.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ChatState {
    /// The format it was saved in ([`CHAT_SCHEMA`]; absent in version 1); always saved as the
    /// current one.
    #[serde(default = "schema_v1", serialize_with = "current_schema")]
    pub version: u32,
    pub conversations: Vec<Conversation>,
    pub active: u64,
    pub next_id: u64,
    pub show_settings: bool,
    /// The named system prompts.
    pub presets: Vec<Preset>,
}

fn schema_v1() -> u32 {
    1
}

fn current_schema<S: serde::Serializer>(_: &u32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_u32(CHAT_SCHEMA)
}

impl Default for ChatState {
    fn default() -> Self {
        Self {
            version: CHAT_SCHEMA,
            conversations: vec![Conversation {
                id: 1,
                title: "Chat 1".into(),
                ..Conversation::default()
            }],
            active: 1,
            next_id: 2,
            show_settings: false,
            presets: default_presets(),
        }
    }
}

/// The presets a new window starts with.
fn default_presets() -> Vec<Preset> {
    [
        ("Assistant", "You are a helpful assistant."),
        ("Concise", "Answer briefly and to the point."),
        (
            "Code reviewer",
            "You review code: point out bugs, risks and simpler ways, with examples.",
        ),
    ]
    .map(|(name, system)| Preset {
        name: name.into(),
        system: system.into(),
    })
    .into()
}

/// Saves `system` as the preset `name` (trimmed), replacing one of that name.
pub fn save_preset(presets: &mut Vec<Preset>, name: &str, system: &str) {
    let preset = Preset {
        name: name.trim().to_owned(),
        system: system.to_owned(),
    };
    match presets.iter_mut().find(|p| p.name == preset.name) {
        Some(p) => *p = preset,
        None => presets.push(preset),
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

    /// Adds `conv` as a new conversation (a fresh id) and opens it; returns its id.
    pub fn add(&mut self, conv: Conversation) -> u64 {
        let id = self.next_id.max(
            self.conversations
                .iter()
                .map(|c| c.id + 1)
                .max()
                .unwrap_or(1),
        );
        self.next_id = id + 1;
        self.conversations.push(Conversation { id, ..conv });
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

//! The chat panel: conversations (saved), their streaming generations (runtime) and the panel UI.

use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::time::Instant;

use egui::{Key, Modifiers};
use serde::{Deserialize, Serialize};
use tpslab_engine::sched::{ClientId, RequestId};
use tpslab_engine::serving::constraint::compiler_for;
use tpslab_engine::serving::engine::{EngineHandle, Event, Request};
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_engine::text::chat::ChatMessage;
use tpslab_engine::text::reasoning::ReasoningParser;

use super::chat_schema::SchemaOption;
use crate::serve::chat_input::{chat_prompt, default_options};
use crate::ui::command::Command;
use crate::ui::engine_link::EngineLink;

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

/// A generation in flight: its request, its event channel and the timing seen by the UI.
///
/// The prompt is rendered (the model's chat template, which may take up to its time limit) and
/// tokenized on a worker thread, which then submits the request; until it has, `id` is None.
pub struct Generation {
    pub chat: u64,
    id: Option<RequestId>,
    /// The worker's answer: the engine's id for the request and the splitter of its reasoning,
    /// or why it could not be sent.
    prep: Option<Receiver<Result<(RequestId, ReasoningParser), String>>>,
    /// Splits the streamed text into reasoning and answer (from the worker, with the id).
    reasoning: Option<ReasoningParser>,
    reasoning_tokens: usize,
    /// When the last thinking token came.
    reasoning_last: Option<Instant>,
    /// Stop was asked before the request reached the engine.
    stop_asked: bool,
    rx: Receiver<Event>,
    sent: Instant,
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: usize,
}

impl Generation {
    /// Starts submitting the conversation (which must end with an empty assistant message):
    /// the template and tokenizer run on a worker, so a slow or runaway template never holds a
    /// frame.
    pub fn submit(link: &EngineLink, conv: &Conversation) -> Result<Self, String> {
        let mut messages = Vec::new();
        if !conv.system.trim().is_empty() {
            messages.push(ChatMessage::system(conv.system.clone()));
        }
        let history = conv.messages.split_last().map_or(&[][..], |(_, rest)| rest);
        for m in history {
            messages.push(match m.role {
                Role::User => ChatMessage::user(m.text.clone()),
                Role::Assistant => ChatMessage {
                    reasoning_content: (!m.reasoning.is_empty()).then(|| m.reasoning.clone()),
                    ..ChatMessage::assistant(m.text.clone())
                },
            });
        }
        conv.sampling.validate().map_err(|e| e.to_string())?;
        let (tx, rx) = mpsc::channel();
        let (prep_tx, prep) = mpsc::channel();
        let (lm, engine) = (Arc::clone(&link.lm), link.engine.clone());
        let (sampling, max_tokens) = (conv.sampling.clone(), conv.max_tokens.max(1));
        let grammar = conv.schema.grammar()?;
        std::thread::Builder::new()
            .name("chat-prompt".into())
            .spawn(move || {
                // The same prompt as the server builds (thinking on, as llama-server).
                // The schema compiles here too: a big one takes a while, never a frame.
                let constraint = grammar
                    .map(|g| compiler_for(&lm.tokenizer).and_then(|c| c.compile(&g)))
                    .transpose()
                    .map_err(|e| format!("JSON schema: {e}"));
                let sent = constraint.and_then(|constraint| {
                    let prompt = chat_prompt(&lm, &messages, &default_options())
                        .map_err(|e| e.to_string())?;
                    let req = Request {
                        prompt: prompt.tokens,
                        sampling,
                        stop: lm.default_stop(Some(max_tokens)),
                        priority: crate::serve::limits::WINDOW_CHAT_PRIORITY,
                        client: ClientId::LOCAL,
                        constraint,
                        logprobs: None,
                        prompt_logprobs: None,
                    };
                    Ok((engine.submit(req, tx), prompt.reasoning))
                });
                let _ = prep_tx.send(sent);
            })
            .map_err(|e| format!("cannot start the prompt worker: {e}"))?;
        Ok(Self {
            chat: conv.id,
            id: None,
            prep: Some(prep),
            reasoning: None,
            reasoning_tokens: 0,
            reasoning_last: None,
            stop_asked: false,
            rx,
            sent: Instant::now(),
            first: None,
            last: None,
            tokens: 0,
        })
    }

    /// Stops the generation: at once if the engine has it, else as soon as it does.
    pub fn stop(&mut self, engine: &EngineHandle) {
        match self.id {
            Some(id) => engine.cancel(id),
            None => self.stop_asked = true,
        }
    }

    /// Takes the worker's answer when it has come: false (and the reason under the answer) when
    /// the prompt could not be made, e.g. a chat template over its budget.
    fn poll_prep(&mut self, msg: &mut Message, engine: Option<&EngineHandle>) -> bool {
        let Some(prep) = &self.prep else {
            return true;
        };
        match prep.try_recv() {
            Ok(Ok((id, reasoning))) => {
                self.id = Some(id);
                self.reasoning = Some(reasoning);
                self.prep = None;
                if self.stop_asked
                    && let Some(engine) = engine
                {
                    engine.cancel(id);
                }
                true
            }
            Ok(Err(e)) => {
                msg.stats = Some(self.stats(&format!("cannot send: {e}")));
                false
            }
            Err(TryRecvError::Empty) => {
                msg.stats = Some(self.stats("preparing the prompt"));
                true
            }
            Err(TryRecvError::Disconnected) => {
                msg.stats = Some(self.stats("cannot send: the prompt worker stopped"));
                false
            }
        }
    }

    /// Moves every event waiting on the channel into the conversation's last message (tokens are
    /// batched per frame). Returns true when the generation has ended.
    pub fn drain(&mut self, conv: &mut Conversation, engine: Option<&EngineHandle>) -> bool {
        let Some(msg) = conv.messages.last_mut() else {
            return true;
        };
        if !self.poll_prep(msg, engine) {
            return true;
        }
        if self.id.is_none() {
            return false;
        }
        loop {
            match self.rx.try_recv() {
                Ok(Event::Started { .. } | Event::PromptLogprobs { .. }) => {}
                Ok(Event::Token { text, .. }) => {
                    let now = Instant::now();
                    self.first.get_or_insert(now);
                    self.last = Some(now);
                    self.tokens += 1;
                    self.take_text(msg, &text, Some(now));
                }
                Ok(Event::Finished { reason, text, .. }) => {
                    self.take_text(msg, &text, None);
                    if let Some(p) = &mut self.reasoning {
                        let rest = p.finish();
                        msg.reasoning.push_str(&rest.reasoning);
                        msg.text.push_str(&rest.content);
                    }
                    msg.stats = Some(self.stats(reason.as_str()));
                    return true;
                }
                Ok(Event::Refused { reason, .. }) => {
                    msg.stats = Some(self.stats(&format!("refused: {reason}")));
                    return true;
                }
                Err(TryRecvError::Empty) => {
                    msg.stats = Some(self.stats("streaming"));
                    return false;
                }
                Err(TryRecvError::Disconnected) => {
                    msg.stats = Some(self.stats("engine stopped"));
                    return true;
                }
            }
        }
    }

    /// One token's text (`at` its arrival; None for the text that comes with the end), split
    /// into the answer's reasoning and its text; a token seen while thinking counts as thinking.
    fn take_text(&mut self, msg: &mut Message, text: &str, at: Option<Instant>) {
        let Some(p) = &mut self.reasoning else {
            msg.text.push_str(text);
            return;
        };
        let thinking = p.in_reasoning();
        let split = p.push(text);
        if let Some(at) = at
            && (thinking || p.in_reasoning())
        {
            self.reasoning_tokens += 1;
            self.reasoning_last = Some(at);
        }
        msg.reasoning.push_str(&split.reasoning);
        msg.text.push_str(&split.content);
    }

    fn stats(&self, finish: &str) -> AnswerStats {
        let ttft_ms = self.first.map(|f| (f - self.sent).as_secs_f64() * 1e3);
        let decode_tps = match (self.first, self.last) {
            (Some(f), Some(l)) if self.tokens >= 2 && l > f => {
                Some((self.tokens - 1) as f64 / (l - f).as_secs_f64())
            }
            _ => None,
        };
        let reasoning_ms = match (self.first, self.reasoning_last) {
            (Some(f), Some(l)) => Some((l - f).as_secs_f64() * 1e3),
            _ => None,
        };
        AnswerStats {
            tokens: self.tokens,
            ttft_ms,
            decode_tps,
            finish: finish.to_owned(),
            reasoning_tokens: self.reasoning_tokens,
            reasoning_ms,
        }
    }
}

/// What the chat panel needs to know besides the saved state.
pub struct ChatView<'a> {
    pub ready: bool,
    /// Conversations with a generation in flight.
    pub busy: &'a [u64],
}

/// The conversation list (left side).
pub fn list_ui(ui: &mut egui::Ui, state: &mut ChatState, cmds: &mut Vec<Command>) {
    ui.horizontal(|ui| {
        ui.heading("Chats");
        if ui.button("New chat").clicked() {
            cmds.push(Command::NewChat);
        }
    });
    ui.separator();
    egui::ScrollArea::vertical().show(ui, |ui| {
        for c in &state.conversations {
            ui.horizontal(|ui| {
                if ui
                    .selectable_label(c.id == state.active, c.title.as_str())
                    .clicked()
                {
                    cmds.push(Command::SelectChat(c.id));
                }
                if ui
                    .small_button("Delete")
                    .on_hover_text(format!("Delete {}", c.title))
                    .clicked()
                {
                    cmds.push(Command::DeleteChat(c.id));
                }
            });
        }
    });
}

/// The open conversation: settings, messages, the input box.
pub fn conversation_ui(
    ui: &mut egui::Ui,
    state: &mut ChatState,
    view: &ChatView<'_>,
    cmds: &mut Vec<Command>,
) {
    let show_settings = &mut state.show_settings;
    let Some(conv) = state
        .conversations
        .iter_mut()
        .find(|c| c.id == state.active)
    else {
        ui.label("No conversation open.");
        return;
    };
    let busy = view.busy.contains(&conv.id);
    ui.horizontal(|ui| {
        let label = ui.label("Title");
        ui.text_edit_singleline(&mut conv.title)
            .labelled_by(label.id);
        ui.toggle_value(show_settings, "Chat settings");
    });
    if *show_settings {
        settings_ui(ui, conv);
    }
    let id = conv.id;
    conv.schema.ui(ui, id);
    ui.separator();

    // Input box at the bottom, messages fill the rest.
    crate::ui::renderer::panel(egui::Panel::bottom(("chat_input", conv.id)), ui)
        .resizable(false)
        .show(ui, |ui| input_ui(ui, conv, busy, view.ready, cmds));
    crate::ui::renderer::central_panel(ui).show(ui, |ui| {
        egui::ScrollArea::vertical()
            .auto_shrink(false)
            .stick_to_bottom(true)
            .show(ui, |ui| messages_ui(ui, conv, busy, cmds));
    });
}

fn settings_ui(ui: &mut egui::Ui, conv: &mut Conversation) {
    egui::Grid::new(("chat_settings", conv.id))
        .num_columns(2)
        .show(ui, |ui| {
            let l = ui.label("System prompt");
            ui.add(egui::TextEdit::multiline(&mut conv.system).desired_rows(2))
                .labelled_by(l.id);
            ui.end_row();
            let s = &mut conv.sampling;
            let l = ui.label("Temperature");
            ui.add(egui::Slider::new(&mut s.temperature, 0.0..=2.0))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Top-p");
            ui.add(egui::Slider::new(&mut s.top_p, 0.0..=1.0))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Top-k");
            ui.add(egui::Slider::new(&mut s.top_k, 0..=200))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Min-p");
            ui.add(egui::Slider::new(&mut s.min_p, 0.0..=1.0))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Repetition penalty");
            ui.add(egui::Slider::new(&mut s.repetition_penalty, 0.5..=2.0))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Max tokens");
            ui.add(egui::Slider::new(&mut conv.max_tokens, 1..=2048))
                .labelled_by(l.id);
            ui.end_row();
        });
}

/// Every message of `conv`. One scrolled out of sight takes the height it had when last drawn
/// instead of being laid out again: markdown answers are many widgets each, and a long
/// conversation would otherwise cost its whole length every frame. The last message (the one
/// that streams) is always drawn.
fn messages_ui(ui: &mut egui::Ui, conv: &Conversation, busy: bool, cmds: &mut Vec<Command>) {
    let n = conv.messages.len();
    let width = ui.available_width();
    for i in 0..n {
        let id = egui::Id::unique(("message_height", conv.id, i));
        let known: Option<(f32, f32)> = ui.data(|d| d.get_temp(id));
        if let Some((w, h)) = known
            && i + 1 < n
            && (w - width).abs() < 0.5
        {
            let rect = egui::Rect::from_min_size(ui.cursor().min, egui::vec2(width, h));
            if !ui.is_rect_visible(rect) {
                ui.allocate_space(egui::vec2(width, h));
                continue;
            }
        }
        let rect = ui
            .scope(|ui| message_ui(ui, conv, i, busy, cmds))
            .response
            .rect;
        ui.data_mut(|d| d.insert_temp(id, (width, rect.height())));
    }
}

fn message_ui(
    ui: &mut egui::Ui,
    conv: &Conversation,
    i: usize,
    busy: bool,
    cmds: &mut Vec<Command>,
) {
    let m = &conv.messages[i];
    let who = match m.role {
        Role::User => "You",
        Role::Assistant => "Assistant",
    };
    ui.horizontal(|ui| {
        ui.strong(who);
        if ui.small_button("Copy").clicked() {
            ui.ctx().copy_text(m.text.clone());
        }
    });
    if m.role == Role::Assistant && !m.reasoning.is_empty() {
        reasoning_ui(ui, conv.id, i, m);
    }
    // Answers are markdown; the user's own text is shown as typed.
    match m.role {
        Role::Assistant => crate::ui::markdown::ui(ui, &m.text),
        Role::User => {
            ui.add(egui::Label::new(m.text.as_str()).selectable(true).wrap());
        }
    }
    if let Some(s) = &m.stats {
        ui.label(egui::RichText::new(answer_stats_text(s)).small().weak());
    }
    let last_answer = i + 1 == conv.messages.len() && m.role == Role::Assistant;
    if last_answer && !busy && ui.button("Regenerate").clicked() {
        cmds.push(Command::Regenerate { chat: conv.id });
    }
    ui.add_space(6.0);
}

/// The model's thinking, folded under a header with its own token count and time; open, it is
/// shown as plain text, apart from the answer.
fn reasoning_ui(ui: &mut egui::Ui, chat: u64, i: usize, m: &Message) {
    let header = reasoning_header(m.stats.as_ref());
    egui::CollapsingHeader::new(header)
        .id_salt(("reasoning", chat, i))
        .default_open(false)
        .show(ui, |ui| {
            ui.add(
                egui::Label::new(egui::RichText::new(m.reasoning.as_str()).weak().italics())
                    .selectable(true)
                    .wrap(),
            );
        });
}

/// "Thinking · 120 tokens · 3.4 s"
pub fn reasoning_header(stats: Option<&AnswerStats>) -> String {
    match stats {
        Some(s) => {
            let time = s
                .reasoning_ms
                .map_or(String::new(), |ms| format!(" · {:.1} s", ms / 1e3));
            format!("Thinking · {} tokens{time}", s.reasoning_tokens)
        }
        None => "Thinking".into(),
    }
}

/// "42 tokens · TTFT 120 ms · 35.1 tok/s · stop"
pub fn answer_stats_text(s: &AnswerStats) -> String {
    let ttft = s
        .ttft_ms
        .map_or("TTFT –".into(), |t| format!("TTFT {t:.0} ms"));
    let tps = s
        .decode_tps
        .map_or("– tok/s".into(), |t| format!("{t:.1} tok/s"));
    format!("{} tokens · {ttft} · {tps} · {}", s.tokens, s.finish)
}

fn input_ui(
    ui: &mut egui::Ui,
    conv: &mut Conversation,
    busy: bool,
    ready: bool,
    cmds: &mut Vec<Command>,
) {
    let input_id = egui::Id::unique(("chat_draft", conv.id));
    // Enter sends, Shift+Enter is a newline: take the plain Enter before the TextEdit sees it.
    let focused = ui.memory(|m| m.has_focus(input_id));
    let enter = focused
        && ui.input_mut(|i| !i.modifiers.shift && i.consume_key(Modifiers::NONE, Key::Enter));
    if busy && ui.input(|i| i.key_pressed(Key::Escape)) {
        cmds.push(Command::Stop { chat: conv.id });
    }
    ui.add_space(4.0);
    ui.horizontal(|ui| {
        let label = ui.label("Message");
        let edit = egui::TextEdit::multiline(&mut conv.draft)
            .id(input_id)
            .desired_rows(2)
            .desired_width(ui.available_width() - 90.0)
            .hint_text("Type a message (Enter sends, Shift+Enter: new line)");
        ui.add(edit).labelled_by(label.id);
        ui.vertical(|ui| {
            if busy {
                if ui
                    .button("Stop")
                    .on_hover_text("Stop generating (Esc)")
                    .clicked()
                {
                    cmds.push(Command::Stop { chat: conv.id });
                }
            } else {
                let can_send = ready && !conv.draft.trim().is_empty();
                let send = ui.add_enabled(can_send, egui::Button::new("Send"));
                if (send.clicked() || enter) && can_send {
                    cmds.push(Command::Send {
                        chat: conv.id,
                        text: std::mem::take(&mut conv.draft),
                    });
                }
            }
        });
    });
    ui.add_space(4.0);
}

//! The chat panel: the Chat page's runtime ([`ChatPanel`]: the answers
//! being made, and the chat commands applied) and the panel UI over the saved conversations
//! (`chat_store`, re-exported here).

use egui::{Key, Modifiers};
use tpslab_engine::serving::engine::EngineHandle;

pub use super::chat_store::{AnswerStats, ChatState, Conversation, Message, Role};
pub use super::chat_stream::Generation;
use crate::ui::command::Command;
use crate::ui::engine_link::EngineLink;

/// The Chat page: its runtime (the answers being made) over the saved [`ChatState`]. Its frame
/// returns what the user asked for as [`Command`]s, and the chat's own commands come back to
/// [`ChatPanel::apply`] at the end of the frame.
#[derive(Default)]
pub struct ChatPanel {
    gens: Vec<Generation>,
}

impl ChatPanel {
    /// The conversation list and the open conversation; `ready` when the engine runs.
    pub fn ui(&mut self, ui: &mut egui::Ui, state: &mut ChatState, ready: bool) -> Vec<Command> {
        let mut cmds = Vec::new();
        let busy: Vec<u64> = self.gens.iter().map(|g| g.chat).collect();
        crate::ui::renderer::panel(egui::Panel::left("chat_list"), ui)
            .resizable(true)
            .default_size(180.0)
            .show(ui, |ui| list_ui(ui, state, &mut cmds));
        crate::ui::renderer::central_panel(ui).show(ui, |ui| {
            let view = ChatView { ready, busy: &busy };
            conversation_ui(ui, state, &view, &mut cmds);
        });
        cmds
    }

    /// Whether an answer of `chat` is being made.
    pub fn busy(&self, chat: u64) -> bool {
        self.gens.iter().any(|g| g.chat == chat)
    }

    /// Whether any answer is being made.
    pub fn answering(&self) -> bool {
        !self.gens.is_empty()
    }

    /// Applies a chat command (send, regenerate, stop, new, select, delete) over the engine
    /// `link` (if one runs); the others are not the chat's and change nothing.
    pub fn apply(
        &mut self,
        cmd: Command,
        state: &mut ChatState,
        link: Option<&EngineLink>,
    ) -> Result<(), String> {
        match cmd {
            Command::Send { chat, text } => self.send(state, chat, text, link),
            Command::Regenerate { chat } => self.regenerate(state, chat, link),
            Command::Stop { chat } => {
                self.stop(chat, link.map(|l| &l.engine));
                Ok(())
            }
            Command::NewChat => {
                state.new_conversation();
                Ok(())
            }
            Command::SelectChat(id) => {
                state.active = id;
                Ok(())
            }
            Command::DeleteChat(id) => {
                self.stop(id, link.map(|l| &l.engine));
                self.gens.retain(|g| g.chat != id);
                state.delete(id);
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Adds the user's message to `chat` and starts the answer.
    fn send(
        &mut self,
        state: &mut ChatState,
        chat: u64,
        text: String,
        link: Option<&EngineLink>,
    ) -> Result<(), String> {
        let conv = state.get_mut(chat).ok_or("no such conversation")?;
        if conv.messages.is_empty() && conv.title.starts_with("Chat ") {
            conv.title = text.chars().take(32).collect();
        }
        conv.messages.push(Message {
            role: Role::User,
            text,
            ..Message::default()
        });
        self.start_answer(conv, link)
    }

    /// Drops the last answer of `chat` (if the last message is one) and answers again.
    fn regenerate(
        &mut self,
        state: &mut ChatState,
        chat: u64,
        link: Option<&EngineLink>,
    ) -> Result<(), String> {
        if self.busy(chat) {
            return Err("an answer is still being made: stop it first".into());
        }
        let conv = state.get_mut(chat).ok_or("no such conversation")?;
        if (conv.messages.last()).is_some_and(|m| m.role == Role::Assistant) {
            conv.messages.pop();
        }
        self.start_answer(conv, link)
    }

    /// Appends an empty answer to `conv` and submits the conversation.
    fn start_answer(
        &mut self,
        conv: &mut Conversation,
        link: Option<&EngineLink>,
    ) -> Result<(), String> {
        let Some(link) = link else {
            return Err("the model is not loaded yet".into());
        };
        conv.messages.push(Message {
            role: Role::Assistant,
            ..Message::default()
        });
        match Generation::submit(link, conv) {
            Ok(g) => {
                self.gens.push(g);
                Ok(())
            }
            Err(e) => {
                conv.messages.pop();
                Err(format!("cannot send: {e}"))
            }
        }
    }

    /// Moves each answer's new events into its conversation; drops the ended ones.
    pub fn drain(&mut self, state: &mut ChatState, engine: Option<&EngineHandle>) {
        self.gens.retain_mut(|g| match state.get_mut(g.chat) {
            Some(conv) => !g.drain(conv, engine),
            None => false,
        });
    }

    /// Stops the answers of `chat` (one whose prompt is still being made stops once sent).
    pub fn stop(&mut self, chat: u64, engine: Option<&EngineHandle>) {
        let Some(engine) = engine else {
            return;
        };
        for g in self.gens.iter_mut().filter(|g| g.chat == chat) {
            g.stop(engine);
        }
    }
}

/// What the conversation needs to know besides the saved state.
struct ChatView<'a> {
    pub ready: bool,
    /// Conversations with a generation in flight.
    pub busy: &'a [u64],
}

/// The conversation list (left side).
fn list_ui(ui: &mut egui::Ui, state: &mut ChatState, cmds: &mut Vec<Command>) {
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
fn conversation_ui(
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

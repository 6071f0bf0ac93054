//! The Chat page drawn: the conversation list with its search, the open conversation (title,
//! export and import, settings with presets and stop sequences), its messages (a user's message
//! edited in place, an answer's branches as ‹ 1/2 ›, the figures and sampling beside each
//! answer) and the input box. Each draws from the saved state and returns [`ChatCommand`]s.

use egui::{Key, Modifiers};

use super::chat_store::{
    AnswerStats, ChatState, Conversation, Message, Preset, Role, answer_stats_text, sampling_text,
    save_preset,
};
use crate::ui::command::ChatCommand;

/// The keyboard shortcuts, as the help shows them.
pub const SHORTCUTS: &str = "Ctrl+N: new chat\nEsc: stop the answer\nCtrl+R: regenerate the last \
                             answer\nCtrl+L or /: type a message\nEnter: send · Shift+Enter: new line";

/// A user's message being edited, to be sent again in its place.
#[derive(Debug, Clone, PartialEq)]
pub struct Editing {
    pub chat: u64,
    pub index: usize,
    pub text: String,
}

/// What the open conversation needs besides the saved state (the panel's runtime).
pub struct ChatView<'a> {
    pub ready: bool,
    /// Conversations with a generation in flight.
    pub busy: &'a [u64],
    pub editing: &'a mut Option<Editing>,
    pub preset_name: &'a mut String,
    pub show_shortcuts: &'a mut bool,
    pub notice: &'a mut Option<Result<String, String>>,
    /// An export or import is under way.
    pub file_busy: bool,
}

/// The input box of conversation `chat` (the shortcuts focus it).
pub fn input_id(chat: u64) -> egui::Id {
    egui::Id::unique(("chat_draft", chat))
}

/// The conversation list (left side), filtered by the search box.
pub fn list_ui(
    ui: &mut egui::Ui,
    state: &ChatState,
    search: &mut String,
    cmds: &mut Vec<ChatCommand>,
) {
    ui.horizontal(|ui| {
        ui.heading("Chats");
        if ui
            .button("New chat")
            .on_hover_text("New chat (Ctrl+N)")
            .clicked()
        {
            cmds.push(ChatCommand::New);
        }
    });
    let l = ui.label("Search chats");
    ui.add(egui::TextEdit::singleline(search).hint_text("title or text"))
        .labelled_by(l.id);
    ui.separator();
    egui::ScrollArea::vertical().show(ui, |ui| {
        let mut shown = 0;
        for c in state.conversations.iter().filter(|c| c.matches(search)) {
            shown += 1;
            ui.horizontal(|ui| {
                if ui
                    .selectable_label(c.id == state.active, c.title.as_str())
                    .clicked()
                {
                    cmds.push(ChatCommand::Select(c.id));
                }
                if ui
                    .small_button("Delete")
                    .on_hover_text(format!("Delete {}", c.title))
                    .clicked()
                {
                    cmds.push(ChatCommand::Delete(c.id));
                }
            });
        }
        if shown == 0 {
            ui.weak("No chat matches.");
        }
    });
}

/// The open conversation: title, files, settings, messages, the input box.
pub fn conversation_ui(
    ui: &mut egui::Ui,
    state: &mut ChatState,
    view: &mut ChatView<'_>,
    cmds: &mut Vec<ChatCommand>,
) {
    let ChatState {
        conversations,
        active,
        show_settings,
        presets,
        ..
    } = state;
    let Some(conv) = conversations.iter_mut().find(|c| c.id == *active) else {
        ui.label("No conversation open.");
        return;
    };
    let busy = view.busy.contains(&conv.id);
    ui.horizontal(|ui| {
        let label = ui.label("Title");
        ui.text_edit_singleline(&mut conv.title)
            .labelled_by(label.id);
        ui.toggle_value(show_settings, "Chat settings");
        files_ui(ui, conv.id, view.file_busy, cmds);
        ui.toggle_value(view.show_shortcuts, "Shortcuts")
            .on_hover_text(SHORTCUTS);
    });
    if *view.show_shortcuts {
        ui.label(egui::RichText::new(SHORTCUTS).small());
    }
    if view.notice.is_some() {
        ui.horizontal(|ui| {
            super::message_ui(ui, view.notice.as_ref());
            if ui.small_button("Dismiss").clicked() {
                *view.notice = None;
            }
        });
    }
    if *show_settings {
        settings_ui(ui, conv, presets, view.preset_name);
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
            .show(ui, |ui| messages_ui(ui, conv, busy, view.editing, cmds));
    });
}

/// Export (JSON, Markdown) and import buttons.
fn files_ui(ui: &mut egui::Ui, chat: u64, file_busy: bool, cmds: &mut Vec<ChatCommand>) {
    ui.add_enabled_ui(!file_busy, |ui| {
        if ui
            .button("Export JSON")
            .on_hover_text("Save this conversation as JSON (importable)")
            .clicked()
        {
            cmds.push(ChatCommand::Export {
                chat,
                markdown: false,
            });
        }
        if ui.button("Export Markdown").clicked() {
            cmds.push(ChatCommand::Export {
                chat,
                markdown: true,
            });
        }
        if ui
            .button("Import")
            .on_hover_text("Add a conversation from a JSON export")
            .clicked()
        {
            cmds.push(ChatCommand::Import);
        }
    });
}

fn settings_ui(
    ui: &mut egui::Ui,
    conv: &mut Conversation,
    presets: &mut Vec<Preset>,
    preset_name: &mut String,
) {
    presets_ui(ui, conv, presets, preset_name);
    egui::Grid::new(("chat_settings", conv.id))
        .num_columns(2)
        .show(ui, |ui| {
            let l = ui.label("System prompt");
            ui.add(egui::TextEdit::multiline(&mut conv.system).desired_rows(2))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Stop sequences");
            ui.add(
                egui::TextEdit::multiline(&mut conv.stop_sequences)
                    .desired_rows(1)
                    .hint_text("one a line: the answer ends before it"),
            )
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

/// Pick a preset (its system prompt becomes the chat's), save the chat's prompt as one, or
/// delete one by name.
fn presets_ui(
    ui: &mut egui::Ui,
    conv: &mut Conversation,
    presets: &mut Vec<Preset>,
    name: &mut String,
) {
    ui.horizontal(|ui| {
        let l = ui.label("Preset");
        let picked = conv.preset.clone().unwrap_or_else(|| "None".into());
        egui::ComboBox::from_id_salt(("chat_preset", conv.id))
            .selected_text(picked)
            .show_ui(ui, |ui| {
                for p in presets.iter() {
                    let on = conv.preset.as_deref() == Some(p.name.as_str());
                    if ui.selectable_label(on, p.name.as_str()).clicked() {
                        conv.preset = Some(p.name.clone());
                        conv.system = p.system.clone();
                        name.clone_from(&p.name);
                    }
                }
            })
            .response
            .labelled_by(l.id);
        let l = ui.label("Preset name");
        ui.add(egui::TextEdit::singleline(name).desired_width(120.0))
            .labelled_by(l.id);
        let named = !name.trim().is_empty();
        if ui
            .add_enabled(named, egui::Button::new("Save preset"))
            .on_hover_text("Save this chat's system prompt under that name")
            .clicked()
        {
            save_preset(presets, name, &conv.system);
            conv.preset = Some(name.trim().to_owned());
        }
        let known = presets.iter().any(|p| p.name == name.trim());
        if ui
            .add_enabled(known, egui::Button::new("Delete preset"))
            .clicked()
        {
            presets.retain(|p| p.name != name.trim());
        }
    });
}

/// Every message of `conv`. One scrolled out of sight takes the height it had when last drawn
/// instead of being laid out again: markdown answers are many widgets each, and a long
/// conversation would otherwise cost its whole length every frame. The last message (the one
/// that streams) and the one being edited are always drawn.
fn messages_ui(
    ui: &mut egui::Ui,
    conv: &Conversation,
    busy: bool,
    editing: &mut Option<Editing>,
    cmds: &mut Vec<ChatCommand>,
) {
    let n = conv.messages.len();
    let width = ui.available_width();
    for i in 0..n {
        let id = egui::Id::unique(("message_height", conv.id, i));
        let known: Option<(f32, f32)> = ui.data(|d| d.get_temp(id));
        let edited = editing
            .as_ref()
            .is_some_and(|e| e.chat == conv.id && e.index == i);
        if let Some((w, h)) = known
            && i + 1 < n
            && !edited
            && (w - width).abs() < 0.5
        {
            let rect = egui::Rect::from_min_size(ui.cursor().min, egui::vec2(width, h));
            if !ui.is_rect_visible(rect) {
                ui.allocate_space(egui::vec2(width, h));
                continue;
            }
        }
        let rect = ui
            .scope(|ui| message_ui(ui, conv, i, busy, editing, cmds))
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
    editing: &mut Option<Editing>,
    cmds: &mut Vec<ChatCommand>,
) {
    let m = &conv.messages[i];
    let last = i + 1 == conv.messages.len();
    let who = match m.role {
        Role::User => "You",
        Role::Assistant => "Assistant",
    };
    ui.horizontal(|ui| {
        ui.strong(who);
        if ui.small_button("Copy").clicked() {
            ui.ctx().copy_text(m.text.clone());
        }
        if m.role == Role::User
            && !busy
            && editing.is_none()
            && ui
                .small_button("Edit")
                .on_hover_text("Edit and send again (what follows is replaced)")
                .clicked()
        {
            *editing = Some(Editing {
                chat: conv.id,
                index: i,
                text: m.text.clone(),
            });
        }
        if m.branches() > 1 {
            branches_ui(ui, conv.id, i, m, busy && last, cmds);
        }
    });
    if let Some(e) = editing
        .as_mut()
        .filter(|e| e.chat == conv.id && e.index == i)
    {
        edit_ui(ui, e, cmds);
        if cmds
            .iter()
            .any(|c| matches!(c, ChatCommand::EditResend { .. }))
            || ui.input(|inp| inp.key_pressed(Key::Escape))
        {
            *editing = None;
        }
        if ui.button("Cancel").clicked() {
            *editing = None;
        }
        ui.add_space(6.0);
        return;
    }
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
        ui.horizontal_wrapped(|ui| {
            ui.label(egui::RichText::new(answer_stats_text(s)).small().weak());
            if let Some(sampling) = &s.sampling {
                ui.label(egui::RichText::new(sampling_text(sampling)).small().weak())
                    .on_hover_text("The chat's sampling settings when it was asked");
            }
        });
    }
    if last
        && m.role == Role::Assistant
        && !busy
        && ui
            .button("Regenerate")
            .on_hover_text("Answer again; this answer is kept as a branch (Ctrl+R)")
            .clicked()
    {
        cmds.push(ChatCommand::Regenerate { chat: conv.id });
    }
    ui.add_space(6.0);
}

/// ‹ 2/3 ›: the answers of one turn, the one shown among them.
fn branches_ui(
    ui: &mut egui::Ui,
    chat: u64,
    index: usize,
    m: &Message,
    streaming: bool,
    cmds: &mut Vec<ChatCommand>,
) {
    let (k, n) = (m.shown.min(m.branches() - 1), m.branches());
    let mut show = |branch| {
        cmds.push(ChatCommand::ShowBranch {
            chat,
            index,
            branch,
        })
    };
    let prev = ui
        .add_enabled(!streaming && k > 0, egui::Button::new("‹").small())
        .on_hover_text("Previous answer");
    if prev.clicked() {
        show(k - 1);
    }
    ui.label(format!("{}/{n}", k + 1));
    let next = ui
        .add_enabled(!streaming && k + 1 < n, egui::Button::new("›").small())
        .on_hover_text("Next answer");
    if next.clicked() {
        show(k + 1);
    }
}

/// The edit box of a user's message: Send edit answers it again.
fn edit_ui(ui: &mut egui::Ui, e: &mut Editing, cmds: &mut Vec<ChatCommand>) {
    let l = ui.label("Edit message");
    ui.add(
        egui::TextEdit::multiline(&mut e.text)
            .desired_rows(2)
            .desired_width(ui.available_width()),
    )
    .labelled_by(l.id);
    let can = !e.text.trim().is_empty();
    if ui
        .add_enabled(can, egui::Button::new("Send edit"))
        .on_hover_text("Replace this message and what follows it, and answer again")
        .clicked()
    {
        cmds.push(ChatCommand::EditResend {
            chat: e.chat,
            index: e.index,
            text: e.text.clone(),
        });
    }
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

fn input_ui(
    ui: &mut egui::Ui,
    conv: &mut Conversation,
    busy: bool,
    ready: bool,
    cmds: &mut Vec<ChatCommand>,
) {
    let input_id = input_id(conv.id);
    // Enter sends, Shift+Enter is a newline: take the plain Enter before the TextEdit sees it.
    let focused = ui.memory(|m| m.has_focus(input_id));
    let enter = focused
        && ui.input_mut(|i| !i.modifiers.shift && i.consume_key(Modifiers::NONE, Key::Enter));
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
                    cmds.push(ChatCommand::Stop { chat: conv.id });
                }
            } else {
                let can_send = ready && !conv.draft.trim().is_empty();
                let send = ui.add_enabled(can_send, egui::Button::new("Send"));
                if (send.clicked() || enter) && can_send {
                    cmds.push(ChatCommand::Send {
                        chat: conv.id,
                        text: std::mem::take(&mut conv.draft),
                    });
                }
            }
        });
    });
    ui.add_space(4.0);
}

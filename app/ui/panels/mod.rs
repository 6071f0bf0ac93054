//! The window's panels: each draws its part of the frame from its saved settings and a view of
//! the app, and returns what it wants done as [`Command`](crate::ui::command::Command)s. Panels
//! import the UI's infrastructure (`crate::ui::*`) and each other only one way round.
//!
//! Modules:
//! - [`api_server`]: the dashboard's API server section, and the server over the window's engine.
//! - [`chat`]: the Chat page's runtime (answers being made, edits, search, shortcuts) and its
//!   commands applied.
//! - `chat_view`: the Chat page drawn: list and search, messages with edits and branches, input.
//! - `chat_store`: the chat's saved state: conversations, messages and their branches, the
//!   figures under answers, presets; versioned.
//! - [`chat_files`]: a conversation exported (JSON, Markdown) and imported (checked), dialogs on
//!   a worker.
//! - `chat_stream`: one answer being made: the prompt on a worker, its events drained.
//! - [`chat_schema`]: the chat panel's JSON-schema option (structured output).
//! - [`dashboard`]: knobs, cost, load and sweep controls beside the live plots.
//! - [`dashboard_plots`]: the dashboard's live plots laid out, the settings said once.
//! - `hub_panel`: the Models panel's Hugging Face part: search, files, download with progress.
//! - [`kv_knobs`]: the dashboard's KV cache settings (budget, block size, K and V types) and
//!   what they hold.
//! - [`planner`]: the capacity planner: predictions per device as a table and a trade-off plot.
//! - [`models`]: the Models panel: the library, loading a model, import, Hugging Face download.
//! - [`spec_knobs`]: the dashboard's speculative decoding knobs and live figures.
//! - [`status`]: the status bar (model, device, memory) and the device selector.
//! - [`tuner`]: the SLO tuner's tab: objectives, workload, progress, candidates, Apply.
//! - [`wizard`]: the quantization wizard, perplexity and the table of measured models.

pub mod api_server;
pub mod chat;
pub mod chat_files;
pub mod chat_schema;
mod chat_store;
mod chat_stream;
mod chat_view;
pub mod dashboard;
pub mod dashboard_plots;
mod hub_panel;
pub mod kv_knobs;
pub mod models;
pub mod planner;
pub mod spec_knobs;
pub mod status;
pub mod tuner;
pub mod wizard;

/// A notice, or an error in the error colour.
fn message_ui(ui: &mut egui::Ui, m: Option<&Result<String, String>>) {
    match m {
        Some(Ok(n)) => {
            ui.label(n);
        }
        Some(Err(e)) => {
            ui.colored_label(ui.visuals().error_fg_color, format!("Error: {e}"));
        }
        None => {}
    }
}

//! The OpenAI-compatible API server started from the window: `tpslab serve`'s server over the
//! window's own engine, so chat, load generator and API clients are requests of one batch.
//! Loopback only (a server for the world is `tpslab serve --host`). It follows the engine: when
//! the engine restarts (another device or model) the server restarts on the new one; stopping
//! it waits for its streams on a worker thread, never in the frame. Its options are `serve`'s
//! that apply to a loopback server: port, API key, aliases, CORS origins, context size.

use std::net::SocketAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use tpslab_engine::serving::engine::EngineHandle;

use crate::serve::limits::Limits;
use crate::serve::{self, RunningServer, ServerChoices, ServerState};
use crate::ui::command::Command;
use crate::ui::engine_link::EngineLink;

/// What persists: the port, the key file's path, aliases, CORS origins and context size (a typed
/// key does not: secrets stay out of the saved state).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ApiServerSettings {
    pub port: u16,
    /// Bearer token clients must send (empty: none). Not saved.
    #[serde(skip)]
    pub api_key: String,
    /// A file whose first line is the key (`--api-key-file`), used when no key is typed; with
    /// neither, `TPSLAB_API_KEY`, as `tpslab serve` reads it.
    pub api_key_file: String,
    /// More names the model is listed and served under (`--alias`), comma separated.
    pub aliases: String,
    /// Web pages' origins allowed to call it (`--cors-origin`), comma separated.
    pub cors_origins: String,
    /// Tokens one request may hold, prompt and answer (`--ctx-size`); 0: the model's context.
    pub ctx_size: usize,
}

impl Default for ApiServerSettings {
    fn default() -> Self {
        Self {
            port: 8080,
            api_key: String::new(),
            api_key_file: String::new(),
            aliases: String::new(),
            cors_origins: String::new(),
            ctx_size: 0,
        }
    }
}

/// How the window's server runs: `tpslab serve`'s options that apply to a loopback server.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerOptions {
    /// 0: any free port.
    pub port: u16,
    pub api_key: Option<String>,
    pub aliases: Vec<String>,
    pub cors_origins: Vec<String>,
    pub ctx_size: Option<usize>,
}

impl ApiServerSettings {
    /// The options these settings ask for; an alias or a key `tpslab serve` would refuse is
    /// refused here with the same words. The key: the one typed, else the key file's first
    /// line, else `TPSLAB_API_KEY`.
    pub fn options(&self) -> Result<ServerOptions, String> {
        let list = |s: &str| -> Vec<String> {
            (s.split(','))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .map(String::from)
                .collect()
        };
        let aliases = (list(&self.aliases).iter())
            .map(|a| serve::alias_name(a))
            .collect::<Result<Vec<_>, _>>()?;
        let nonempty = |s: &str| Some(s.trim().to_string()).filter(|t| !t.is_empty());
        let key = serve::auth::KeyArgs {
            api_key: nonempty(&self.api_key),
            api_key_file: nonempty(&self.api_key_file).map(std::path::PathBuf::from),
        }
        .key(|k| std::env::var(k).ok())
        .map_err(|e| e.to_string())?;
        Ok(ServerOptions {
            port: self.port,
            api_key: key,
            aliases,
            cors_origins: list(&self.cors_origins),
            ctx_size: (self.ctx_size > 0).then_some(self.ctx_size),
        })
    }
}

struct Running {
    server: RunningServer,
    /// The engine it serves (to notice a restart).
    engine: EngineHandle,
    opts: ServerOptions,
    model_id: String,
}

/// The server, when running.
#[derive(Default)]
pub struct ApiServer {
    running: Option<Running>,
}

impl ApiServer {
    /// Starts serving `b`'s engine on 127.0.0.1:`opts.port` as `opts` says.
    pub fn start(&mut self, b: &EngineLink, opts: ServerOptions) -> Result<(), String> {
        self.stop();
        let choices = ServerChoices {
            listed_aliases: opts.aliases.clone(),
            browser: serve::browser::BrowserArgs {
                cors_origins: opts.cors_origins.clone(),
                allowed_hosts: Vec::new(),
            }
            .policy(),
            limits: Limits {
                ctx_size: opts.ctx_size,
                ..Limits::default()
            },
            pooling: None,
        };
        let key = opts.api_key.clone();
        let state = ServerState::configured(b.engine.clone(), Arc::clone(&b.lm), key, choices);
        let model_id = state.model_id.clone();
        let addr = SocketAddr::from(([127, 0, 0, 1], opts.port));
        let server =
            serve::spawn(Arc::new(state), addr).map_err(|e| format!("API server: {e:#}"))?;
        self.running = Some(Running {
            server,
            engine: b.engine.clone(),
            opts,
            model_id,
        });
        Ok(())
    }

    /// Stops the server (its streams end on a worker thread).
    pub fn stop(&mut self) {
        if let Some(r) = self.running.take() {
            let _ = std::thread::Builder::new()
                .name("tpslab-api-stop".into())
                .spawn(move || drop(r));
        }
    }

    /// Once a frame: a server whose engine was replaced restarts on the new engine (same port
    /// and key); with no engine it stops. `Err` when the restart failed (it is stopped then).
    pub fn follow(&mut self, b: Option<&EngineLink>) -> Result<(), String> {
        let Some(r) = &self.running else {
            return Ok(());
        };
        match b {
            Some(b) if b.engine.same_engine(&r.engine) => Ok(()),
            Some(b) => {
                let opts = ServerOptions {
                    port: r.server.addr.port(),
                    ..r.opts.clone()
                };
                self.start(b, opts)
            }
            None => {
                self.stop();
                Ok(())
            }
        }
    }

    /// "http://127.0.0.1:8080/v1 (model SmolLM2-135M-Instruct.Q4_1)" while running.
    pub fn describe(&self) -> Option<String> {
        self.running.as_ref().map(|r| {
            format!(
                "http://{}/v1 (model {}{})",
                r.server.addr,
                r.model_id,
                if r.opts.api_key.is_some() {
                    ", API key set"
                } else {
                    ""
                }
            )
        })
    }

    pub fn addr(&self) -> Option<SocketAddr> {
        self.running.as_ref().map(|r| r.server.addr)
    }
}

/// The dashboard's API server section: port and key, Start / Stop, and where it serves.
pub fn settings_ui(
    ui: &mut egui::Ui,
    s: &mut ApiServerSettings,
    running: Option<&str>,
    can_start: bool,
    cmds: &mut Vec<Command>,
) {
    ui.heading("API server");
    if let Some(desc) = running {
        ui.label(format!("Serving {desc}"));
        ui.label(
            egui::RichText::new("Its requests join the same batch as the chat and the load.")
                .small(),
        );
        if ui.button("Stop API server").clicked() {
            cmds.push(Command::StopServer);
        }
        return;
    }
    egui::Grid::new("server_grid")
        .num_columns(2)
        .show(ui, |ui| {
            let l = ui.label("Port");
            ui.add(egui::DragValue::new(&mut s.port).range(1..=65535))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("API key (optional)");
            ui.add(egui::TextEdit::singleline(&mut s.api_key).password(true))
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("API key file (its first line)");
            ui.text_edit_singleline(&mut s.api_key_file)
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Aliases (comma separated)");
            ui.text_edit_singleline(&mut s.aliases).labelled_by(l.id);
            ui.end_row();
            let l = ui.label("CORS origins (comma separated)");
            ui.text_edit_singleline(&mut s.cors_origins)
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Context size (0: the model's)");
            ui.add(egui::DragValue::new(&mut s.ctx_size).range(0..=1 << 24))
                .labelled_by(l.id);
            ui.end_row();
        });
    if ui
        .add_enabled(can_start, egui::Button::new("Start API server"))
        .clicked()
    {
        cmds.push(Command::StartServer);
    }
}

//! The Models panel: the library's models (the loaded one marked), loading one into the engine,
//! importing a GGUF (file dialog or typed path) and downloading from the Hugging Face Hub (its
//! part in `hub_panel`). Every long step (scan, import, search, listing, download) runs
//! on a worker; the frame never waits.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::hub_panel::{HubFields, HubPanel};
use super::message_ui;
use crate::ui::catalog::{self, Library, params_text, same_file, size_text};
use crate::ui::command::Command;
use crate::ui::files::{DialogAnswer, DialogRequest, Dialogs, FileDialog, PendingOpen};
use crate::ui::task::Task;

/// What the Models panel keeps across restarts (never the Hub token).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct ModelsSettings {
    /// The path typed (or last picked) for an import.
    pub import_path: String,
    pub hf_repo: String,
    /// The last Hub search typed.
    pub hf_query: String,
    /// Empty: the Hub itself.
    pub hf_endpoint: String,
}

/// What the panel needs from the app this frame.
pub struct ModelsView<'a> {
    /// The model the engine runs, if one is up.
    pub loaded: Option<&'a Path>,
    /// The model being loaded now.
    pub loading: Option<&'a Path>,
    /// Why the engine cannot switch models now.
    pub load_locked: Option<&'static str>,
    pub dialogs: &'a Dialogs,
    /// Total VRAM of the GPU the engine runs on (`None` on the CPU): what the Hub files' fit
    /// verdicts hold a model's needs against, with the RAM.
    pub vram: Option<u64>,
}

/// The panel's runtime state.
#[derive(Default)]
pub struct ModelsPanel {
    selected: Option<PathBuf>,
    import: Option<Task<PathBuf>>,
    /// A file dialog open on a worker.
    browse: Option<PendingOpen>,
    /// The outcome of the last import (Ok: a notice, Err: an error), shown under the import row.
    message: Option<Result<String, String>>,
    hub: HubPanel,
}

impl ModelsPanel {
    /// Reads the workers' results (called every frame, whichever page shows).
    pub fn poll(&mut self, settings: &mut ModelsSettings, lib: &mut Library, ctx: &egui::Context) {
        if let Some(r) = self.import.as_mut().and_then(Task::poll) {
            self.import = None;
            self.message = Some(r.map(|p| {
                self.selected = Some(p.clone());
                format!("Imported {}", catalog::file_name(&p))
            }));
            // A folder holding one GGUF imports as that file: select what is listed.
            lib.rescan(ctx);
        }
        if let Some(answer) = self.browse.as_ref().and_then(PendingOpen::poll) {
            self.browse = None;
            match answer {
                DialogAnswer::Chosen(p) => {
                    settings.import_path = p.display().to_string();
                    self.start_import(&p, lib, ctx);
                }
                DialogAnswer::Cancelled => {}
                DialogAnswer::Unavailable(why) => {
                    self.message = Some(Err(format!("no file dialog ({why}): type the path")));
                }
            }
        }
        self.hub.poll(lib, ctx);
    }

    /// Whether a worker of this panel is running (the app keeps repainting while one is).
    pub fn busy(&self) -> bool {
        self.import.is_some() || self.hub.busy()
    }

    fn start_import(&mut self, src: &Path, lib: &Library, ctx: &egui::Context) {
        if self.import.is_some() {
            return;
        }
        let (src, dir) = (src.to_path_buf(), lib.dir.clone());
        let what = format!("Importing {}", catalog::file_name(&src));
        self.message = None;
        match Task::spawn("import", what, ctx, move |r| {
            let cancel = r.cancel_flag();
            catalog::import(&src, &dir, &cancel, &mut |done, total| {
                r.report(done, total, "copying");
            })
        }) {
            Ok(t) => self.import = Some(t),
            Err(e) => self.message = Some(Err(e)),
        }
    }

    fn browse(&mut self, dialogs: &Dialogs, dir: &Path, folder: bool, ctx: &egui::Context) {
        let mut req = DialogRequest::for_path("Import a model", &dir.join(""));
        if !folder {
            req.filters = vec![("GGUF".into(), vec!["gguf".into()])];
        }
        let ask = move |d: &dyn FileDialog| {
            if folder {
                d.open_folder(&req)
            } else {
                d.open_path(&req)
            }
        };
        match PendingOpen::start(dialogs, ctx, ask) {
            Ok(p) => self.browse = Some(p),
            Err(e) => self.message = Some(Err(e)),
        }
    }

    pub fn ui(
        &mut self,
        ui: &mut egui::Ui,
        settings: &mut ModelsSettings,
        lib: &mut Library,
        view: &ModelsView<'_>,
        cmds: &mut Vec<Command>,
    ) {
        ui.horizontal(|ui| {
            ui.label(format!("Library folder: {}", lib.dir.display()));
            if ui
                .add_enabled(!lib.scanning(), egui::Button::new("Rescan"))
                .clicked()
            {
                lib.rescan(ui.ctx());
            }
            ui.add_visible(lib.scanning(), egui::Spinner::new());
        });
        if let Some(e) = &lib.error {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        // Each part under its own id, so widgets that come and go above (a spinner, an error)
        // never shift the ids of those below between two frames (a click would be lost).
        ui.push_id("table", |ui| self.table_ui(ui, lib, view));
        for u in &lib.unreadable {
            ui.colored_label(
                ui.visuals().warn_fg_color,
                format!("Not a usable model: {u}"),
            );
        }
        ui.push_id("load", |ui| self.load_ui(ui, view, cmds));
        ui.separator();
        ui.push_id("import", |ui| self.import_ui(ui, settings, lib, view));
        ui.separator();
        egui::CollapsingHeader::new("Download from Hugging Face")
            .default_open(true)
            .show(ui, |ui| {
                let mut hub = HubFields {
                    repo: &mut settings.hf_repo,
                    query: &mut settings.hf_query,
                    endpoint: &mut settings.hf_endpoint,
                };
                self.hub.ui(ui, &mut hub, lib, view.vram);
            });
    }

    fn table_ui(&mut self, ui: &mut egui::Ui, lib: &Library, view: &ModelsView<'_>) {
        if lib.models.is_empty() {
            ui.label(if lib.scanning() {
                "Reading the library…"
            } else {
                "No models in the library yet: import one or download one."
            });
            return;
        }
        egui::ScrollArea::both()
            .max_height(220.0)
            .auto_shrink([false, true])
            .show(ui, |ui| {
                egui::Grid::new("models_table")
                    .striped(true)
                    .num_columns(9)
                    .show(ui, |ui| {
                        for h in [
                            "Model",
                            "",
                            "Source",
                            "Arch",
                            "Params",
                            "Precision",
                            "Size",
                            "Context",
                            "sha256",
                        ] {
                            ui.strong(h);
                        }
                        ui.end_row();
                        for m in &lib.models {
                            let sel = self.selected.as_deref() == Some(m.path.as_path());
                            let r = ui.push_id(&m.name, |ui| ui.selectable_label(sel, &m.name));
                            if r.inner.clicked() {
                                self.selected = Some(m.path.clone());
                            }
                            if view.loaded.is_some_and(|p| same_file(p, &m.path)) {
                                ui.colored_label(ui.visuals().selection.bg_fill, "loaded");
                            } else if view.loading.is_some_and(|p| same_file(p, &m.path)) {
                                ui.label("loading…");
                            } else {
                                ui.label("");
                            }
                            ui.label(m.source.to_string());
                            ui.label(&m.arch);
                            ui.label(params_text(m.params));
                            ui.label(m.precision.to_string());
                            ui.label(size_text(m.size));
                            ui.label(m.context_len.map_or("–".into(), |c| c.to_string()));
                            if m.is_indexed() {
                                ui.monospace(m.sha_short()).on_hover_text(&m.sha256);
                            } else {
                                ui.weak("hashing…");
                            }
                            ui.end_row();
                        }
                    });
            });
    }

    fn load_ui(&mut self, ui: &mut egui::Ui, view: &ModelsView<'_>, cmds: &mut Vec<Command>) {
        let sel = self.selected.as_deref();
        let already = sel.is_some_and(|s| view.loaded.is_some_and(|l| same_file(s, l)));
        let why_not = if sel.is_none() {
            Some("Select a model in the list first")
        } else if already {
            Some("This model is the one loaded")
        } else {
            view.load_locked
        };
        ui.horizontal(|ui| {
            let r = ui.add_enabled(why_not.is_none(), egui::Button::new("Load"));
            if let Some(why) = why_not {
                r.on_disabled_hover_text(why);
            } else if r
                .on_hover_text("Restart the engine on this model (the chats stay)")
                .clicked()
                && let Some(p) = sel
            {
                cmds.push(Command::LoadModel(p.to_path_buf()));
            }
            if let Some(p) = sel {
                ui.label(format!("Selected: {}", catalog::file_name(p)));
            }
        });
    }

    fn import_ui(
        &mut self,
        ui: &mut egui::Ui,
        settings: &mut ModelsSettings,
        lib: &Library,
        view: &ModelsView<'_>,
    ) {
        ui.strong("Import a model");
        let idle = self.import.is_none() && self.browse.is_none();
        ui.horizontal(|ui| {
            let l = ui.label("Model path");
            ui.add(
                egui::TextEdit::singleline(&mut settings.import_path)
                    .hint_text("a .gguf file or a safetensors folder")
                    .desired_width(360.0),
            )
            .labelled_by(l.id);
            let typed = !settings.import_path.trim().is_empty();
            if ui
                .add_enabled(idle && typed, egui::Button::new("Import"))
                .clicked()
            {
                let p = PathBuf::from(settings.import_path.trim());
                self.start_import(&p, lib, ui.ctx());
            }
            if ui
                .add_enabled(idle, egui::Button::new("Browse file…"))
                .clicked()
            {
                self.browse(view.dialogs, &lib.dir, false, ui.ctx());
            }
            if ui
                .add_enabled(idle, egui::Button::new("Browse folder…"))
                .clicked()
            {
                self.browse(view.dialogs, &lib.dir, true, ui.ctx());
            }
        });
        if self.browse.is_some() {
            ui.label("Waiting for the file dialog…");
        }
        if let Some(t) = &self.import {
            t.progress_ui(ui, true, Some("Cancel import"));
        }
        message_ui(ui, self.message.as_ref());
    }
}

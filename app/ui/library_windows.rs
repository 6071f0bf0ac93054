//! The app's model-library side: the Models panel and the quantization wizard as windows,
//! loading another model, the speeds the wizard's table records, and the API server's start.

use std::path::PathBuf;

use super::TpsApp;
use super::catalog::Library;
use super::command::Command;
use super::engine_link::ModelSlot;
use super::panels::models::ModelsView;
use super::panels::wizard::WizardView;

impl TpsApp {
    /// The Models panel and the quantization wizard, as windows over the tab when open.
    pub(super) fn library_windows_ui(&mut self, ctx: &egui::Context, cmds: &mut Vec<Command>) {
        let locked = self.device_locked();
        let loaded = self.link().map(|b| b.path.clone());
        let loading = match &self.rt.model {
            Some(ModelSlot::Loading { .. }) => Some(PathBuf::from(&self.options.model)),
            _ => None,
        };
        let lib = self
            .rt
            .library
            .get_or_insert_with(|| Library::new(Library::default_dir()));
        // The GPU the engine runs on, for the Hub files' fit verdicts.
        let vram_total = (self.rt.snapshot.as_ref()).and_then(|s| s.memory.device_total);
        let mut open = self.state.models.open;
        egui::Window::new("Model library")
            .open(&mut open)
            .default_pos([20.0, 60.0])
            .default_size([900.0, 520.0])
            .show(ctx, |ui| {
                let view = ModelsView {
                    loaded: loaded.as_deref(),
                    loading: loading.as_deref(),
                    load_locked: locked,
                    dialogs: &self.dialogs,
                    vram: vram_total,
                };
                // Search results, a repo's files and a download's progress make it tall.
                egui::ScrollArea::vertical().show(ui, |ui| {
                    self.rt
                        .models
                        .ui(ui, &mut self.state.models, lib, &view, cmds);
                });
            });
        self.state.models.open = open;
        let mut open = self.state.wizard.open;
        egui::Window::new("Quantization wizard")
            .open(&mut open)
            .default_pos([360.0, 80.0])
            .default_size([760.0, 620.0])
            .show(ctx, |ui| {
                let view = WizardView {
                    loaded: loaded.as_deref(),
                    kv_budget: self.state.dash.knobs.kv.budget_bytes,
                    threads: self.options.threads,
                };
                egui::ScrollArea::vertical().show(ui, |ui| {
                    self.rt.wizard.ui(ui, &mut self.state.wizard, lib, &view);
                });
            });
        self.state.wizard.open = open;
    }

    /// Restarts the engine on the model at `path`, on a worker: the running engine stays until
    /// the new one is up, and runs on if the new model fails to load.
    pub(super) fn load_model(&mut self, path: PathBuf, ctx: &egui::Context) -> Result<(), String> {
        if let Some(why) = self.device_locked() {
            return Err(format!("cannot switch the model now: {why}"));
        }
        let spec = path.display().to_string();
        self.rt.model_before = Some(std::mem::replace(&mut self.options.model, spec.clone()));
        let previous = match self.rt.model.take() {
            Some(ModelSlot::Ready(b)) => Some(b),
            _ => None,
        };
        let knobs = previous
            .as_ref()
            .map_or_else(|| self.state.dash.knobs.clone(), |b| b.engine.stats().knobs);
        self.rt.model = Some(ModelSlot::load_over(
            previous,
            spec,
            self.options.threads,
            self.state.placement(),
            knobs,
            ctx.clone(),
        ));
        self.rt.snapshot = None;
        Ok(())
    }

    /// Notes the decode speed a finished run measured on the loaded model, for the wizard's table.
    pub(super) fn record_speed(&mut self, run: &str, tps: Option<f64>) {
        let (Some(tps), Some(path)) = (tps, self.link().map(|b| b.path.clone())) else {
            return;
        };
        self.rt
            .wizard
            .record_speed(&mut self.state.wizard, &path, tps, run.to_string());
    }

    /// Starts the API server over this window's engine, on the dashboard's port and key.
    pub(super) fn start_server(&mut self) -> Result<(), String> {
        let key = Some(self.state.dash.server.api_key.trim().to_string()).filter(|k| !k.is_empty());
        let port = self.state.dash.server.port;
        let mut server = std::mem::take(&mut self.rt.server);
        let r = match self.link() {
            Some(b) => server.start(b, port, key),
            None => Err("the model is not loaded yet".into()),
        };
        self.rt.server = server;
        r
    }
}

//! The app's model-library side: the Models and Quantize pages (the library panel and the
//! quantization wizard, each a page of its own like Chat or Dashboard), loading another model,
//! the speeds the wizard's table records, and the API server's start.

use std::path::PathBuf;

use super::catalog::Library;
use super::command::Command;
use super::engine_link::ModelSlot;
use super::panels::models::ModelsView;
use super::panels::wizard::WizardView;
use super::{TpsApp, renderer};

impl TpsApp {
    /// The library, scanned on first use.
    fn library_mut(&mut self) -> &mut Library {
        self.rt
            .library
            .get_or_insert_with(|| Library::new(Library::default_dir()))
    }

    /// The Models page: the library, loading a model, import, Hugging Face download.
    pub(super) fn models_page_ui(&mut self, ui: &mut egui::Ui, cmds: &mut Vec<Command>) {
        let locked = self.device_locked();
        let loaded = self.link().map(|b| b.path.clone());
        let loading = match &self.rt.model {
            Some(ModelSlot::Loading { .. }) => Some(PathBuf::from(&self.options.model)),
            _ => None,
        };
        // The GPU the engine runs on, for the Hub files' fit verdicts.
        let vram = (self.rt.snapshot.as_ref()).and_then(|s| s.memory.device_total);
        self.library_mut();
        let Some(lib) = self.rt.library.as_mut() else {
            return;
        };
        let view = ModelsView {
            loaded: loaded.as_deref(),
            loading: loading.as_deref(),
            load_locked: locked,
            dialogs: &self.dialogs,
            vram,
        };
        let (panel, settings) = (&mut self.rt.models, &mut self.state.models);
        renderer::central_panel(ui).show(ui, |ui| {
            // Search results, a repo's files and a download's progress make it tall.
            egui::ScrollArea::vertical()
                .auto_shrink(false)
                .show(ui, |ui| panel.ui(ui, settings, lib, &view, cmds));
        });
    }

    /// The Quantize page: the quantization wizard, perplexity, the table of measured models.
    pub(super) fn quantize_page_ui(&mut self, ui: &mut egui::Ui) {
        let loaded = self.link().map(|b| b.path.clone());
        let view = WizardView {
            loaded: loaded.as_deref(),
            kv_budget: self.state.dash.knobs.kv.budget_bytes,
            threads: self.options.threads,
        };
        self.library_mut();
        let Some(lib) = self.rt.library.as_mut() else {
            return;
        };
        let (wizard, settings) = (&mut self.rt.wizard, &mut self.state.wizard);
        renderer::central_panel(ui).show(ui, |ui| {
            egui::ScrollArea::vertical()
                .auto_shrink(false)
                .show(ui, |ui| wizard.ui(ui, settings, lib, &view));
        });
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
        let opts = self.state.dash.server.options()?;
        let mut server = std::mem::take(&mut self.rt.server);
        let r = match self.link() {
            Some(b) => server.start(b, opts),
            None => Err("the model is not loaded yet".into()),
        };
        self.rt.server = server;
        r
    }
}

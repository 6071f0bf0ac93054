//! The desktop window's app: its saved state and runtime handles, the frame loop (top bar,
//! status bar, errors, the page the top bar chose), and the commands the panels return,
//! applied once per frame.
//!
//! Modules:
//! - [`panels`]: the panels (chat, dashboard, models, wizard, status, API server).
//! - [`command`]: what the panels ask the app for (a leaf: it names no panel).
//! - [`engine_link`]: the link to the engine (model slot, engine handle) and the saved device.
//! - `library_pages`: the Models and Quantize pages, and loading another model.
//! - `draft_pick`: a draft model for speculative decoding, loaded on a worker for the engine.
//! - [`window`]: the native window (`tpslab` with no subcommand) and its eframe hooks.
//! - `frame_bench`: the real window timing its own frames under load (`TPSLAB_FRAME_BENCH`).
//! - `chat_bench`: the real window answering one chat message, timed (`TPSLAB_CHAT_BENCH`).
//! - `dashboard_runs`: the dashboard's runs (load, sweep, tuner, KV quality) as the app drives
//!   them.
//! - [`pacing`]: how often news draws a frame (the display's rate; fewer on a CPU painter).
//! - [`planner_table`]: the planner tab's device table and the jobs on it (workers, polled).
//! - `planner_run`: starts those jobs: a table opened, this CPU calibrated here, a table saved.
//! - [`catalog`]: the library as the window lists it (over the engine's library index); import.
//! - [`files`]: the file-dialog seam (rfd on a worker thread; fixed answers in tests).
//! - [`hub_adapter`]: the Models panel's seam to the Hugging Face Hub client (search, list,
//!   download).
//! - [`load`]: the load generator and the concurrency sweep, each on its own thread.
//! - [`markdown`]: chat answers as markdown (code blocks with a copy button), parsed once per text.
//! - [`plot_png`]: the sweep's plot drawn to a PNG on the CPU (no GPU, no window).
//! - [`plots`]: the live plots and their history (decimated per pixel column), the sweep plot.
//! - [`plot_tradeoff`]: the live trade-off view (per-request vs aggregate TPS per batch size).
//! - [`renderer`]: `--renderer`: wgpu on a GPU, OpenGL where wgpu would rasterize on the CPU.
//! - [`state_file`]: the saved state written whole or not at all (a crash loses no chat).
//! - [`sweep_file`]: a sweep saved as JSON, CSV and its plot as PNG.
//! - [`task`]: a long job on a worker thread with progress, cancel and one result.
//! - [`tune_run`]: a tuning run on its own thread over the window's engine.
//! - `tuner_tab`: the Tuner tab over that run, and the checks before one starts.
//!
//! This module imports the others; of them only `window`, `frame_bench`, `chat_bench`,
//! `library_pages`, `dashboard_runs` and `planner_run` (which add to the app) import this one,
//! and this one imports none of them.

pub mod catalog;
mod chat_bench;
pub mod command;
mod dashboard_runs;
mod draft_pick;
pub mod engine_link;
pub mod files;
mod frame_bench;
pub mod hub_adapter;
mod library_pages;
pub mod load;
pub mod markdown;
pub mod pacing;
pub mod panels;
mod planner_run;
pub mod planner_table;
pub mod plot_png;
pub mod plot_tradeoff;
pub mod plots;
pub mod renderer;
pub mod state_file;
pub mod sweep_file;
pub mod task;
pub mod tune_run;
mod tuner_tab;
pub mod window;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::precision::Precision;
use tpslab_engine::serving::engine::EngineSnapshot;
use tpslab_engine::spec::SpecMethod;

use catalog::Library;
use command::Command;
use draft_pick::DraftLoad;
use engine_link::{DevicePref, EngineLink, ModelSlot, Placement, SlotNews};
use files::{DialogTask, Dialogs, RfdDialog};
use load::{LoadOutcome, LoadRun, SweepPoint, SweepRun, TargetSpec};
use panels::chat::{ChatPanel, ChatState};
use panels::dashboard::{self, DashSettings, DashView, describe_knob_change};
use panels::models::{ModelsPanel, ModelsSettings};
use panels::wizard::{Wizard, WizardSettings};
use panels::{api_server, planner, spec_knobs, status, tuner};
use plots::History;

/// The window's pages: one shows at a time, chosen in the top bar.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum Tab {
    #[default]
    Chat,
    Dashboard,
    Planner,
    Tuner,
    /// The model library: load, import, download.
    Models,
    /// The quantization wizard and the table of measured models.
    Quantize,
}

impl Tab {
    /// Every page, in the top bar's order.
    pub const ALL: [Tab; 6] = [
        Tab::Chat,
        Tab::Dashboard,
        Tab::Planner,
        Tab::Tuner,
        Tab::Models,
        Tab::Quantize,
    ];

    /// The page's name in the top bar.
    pub fn label(self) -> &'static str {
        match self {
            Tab::Chat => "Chat",
            Tab::Dashboard => "Dashboard",
            Tab::Planner => "Planner",
            Tab::Tuner => "Tuner",
            Tab::Models => "Models",
            Tab::Quantize => "Quantize",
        }
    }
}

/// Everything that persists across restarts (eframe storage). `#[serde(default)]` everywhere, so
/// state saved by an older version still loads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AppState {
    pub tab: Tab,
    pub chat: ChatState,
    pub dash: DashSettings,
    /// The device the engine runs on, as last chosen (command line or the top bar).
    pub device: DevicePref,
    /// On a GPU: the blocks of a mixture of experts whose experts stay in host memory and run on
    /// the CPU (the top bar's "Experts on CPU", as `--n-cpu-moe`).
    pub cpu_moe_layers: usize,
    /// The Models page's fields.
    pub models: ModelsSettings,
    /// The quantization wizard (its choices, the measured table).
    pub wizard: WizardSettings,
    pub planner: planner::PlannerSettings,
    pub tuner: tuner::TunerSettings,
}

impl AppState {
    /// Where the engine runs, as chosen.
    pub fn placement(&self) -> Placement {
        Placement {
            device: self.device.into(),
            cpu_moe_layers: self.cpu_moe_layers,
        }
    }
}

/// Where the model comes from and what runs it (not saved: command line).
#[derive(Debug, Clone)]
pub struct AppOptions {
    /// A GGUF path, or `default`.
    pub model: String,
    /// Compute threads (0 = one per core).
    pub threads: usize,
    /// `--device`: overrides (and replaces) the saved choice; `None` keeps the saved one.
    pub device: Option<DeviceChoice>,
}

impl Default for AppOptions {
    fn default() -> Self {
        Self {
            model: "default".into(),
            threads: 0,
            device: None,
        }
    }
}

/// Runtime handles: never saved.
#[derive(Default)]
struct Runtime {
    model: Option<ModelSlot>,
    /// The Chat page: the answers being made.
    chat: ChatPanel,
    history: History,
    load: Option<LoadRun>,
    last_load: Option<LoadOutcome>,
    sweep: Option<SweepRun>,
    sweep_points: Vec<SweepPoint>,
    /// A sweep save in progress (its dialog open, or writing): the JSON, CSV and PNG paths.
    saving: Option<DialogTask<[PathBuf; 3]>>,
    errors: Vec<String>,
    notice: Option<String>,
    snapshot: Option<EngineSnapshot>,
    /// While the engine (re)starts on a newly chosen device: the device chosen before, for the
    /// plot marker, and to go back to if the running engine stays because the new one failed.
    device_before: Option<(DevicePref, usize)>,
    /// The top bar's "Experts on CPU" as edited, before it is applied.
    cpu_moe_draft: Option<usize>,
    /// While another model loads: the model spec before, to go back to if it fails.
    model_before: Option<String>,
    library: Option<Library>,
    /// A draft model loading for speculative decoding.
    draft: Option<DraftLoad>,
    models: ModelsPanel,
    wizard: Wizard,
    server: api_server::ApiServer,
    /// The planner's device table and the jobs on it.
    planner: planner_table::PlannerTable,
    /// The tuning run in progress, or the last one, and the trace dialog.
    tuner: tune_run::Tuner,
    /// How often news draws a frame (the painter, set by the window).
    pacing: pacing::Pacing,
    /// The dashboard's KV quality run (its KV types against f16 KV).
    kv_quality: panels::kv_knobs::KvQuality,
}

/// The app: saved state plus runtime handles.
pub struct TpsApp {
    pub state: AppState,
    options: AppOptions,
    rt: Runtime,
    /// Where save (and later import) paths come from.
    dialogs: Dialogs,
}

const STATE_KEY: &str = eframe::APP_KEY;

impl TpsApp {
    /// A fresh app; the model starts loading on the first frame.
    pub fn new(mut state: AppState, options: AppOptions) -> Self {
        if let Some(d) = options.device {
            state.device = d.into();
        }
        Self {
            state,
            options,
            rt: Runtime::default(),
            dialogs: Arc::new(RfdDialog),
        }
    }

    /// Uses `dir` as the model library folder instead of `TPSLAB_HOME/models` (tests).
    pub fn set_library_dir(&mut self, dir: PathBuf) {
        self.rt.library = Some(Library::new(dir));
    }

    /// The file of the model the engine runs.
    pub fn loaded_model(&self) -> Option<&std::path::Path> {
        self.link().map(|b| b.path.as_path())
    }

    /// The dashboard's history of live figures, as the plots draw it.
    pub fn history(&self) -> &History {
        &self.rt.history
    }

    /// The model library as last scanned.
    pub fn library(&self) -> Option<&Library> {
        self.rt.library.as_ref()
    }

    /// Replaces the file dialogs (tests answer with fixed paths; no dialog is ever shown).
    pub fn set_file_dialog(&mut self, dialogs: Dialogs) {
        self.dialogs = dialogs;
    }

    /// The app restored from its state file ([`state_file`]), else from eframe's storage, else
    /// fresh.
    pub fn from_creation_context(cc: &eframe::CreationContext<'_>, options: AppOptions) -> Self {
        let state = state_file::default_path()
            .and_then(|p| state_file::load::<AppState>(&p))
            .or_else(|| {
                cc.storage
                    .and_then(|s| eframe::get_value::<AppState>(s, STATE_KEY))
            })
            .unwrap_or_default();
        Self::new(state, options)
    }

    /// The running engine, once the model is loaded.
    pub fn engine(&self) -> Option<&tpslab_engine::serving::engine::EngineHandle> {
        self.link().map(|b| &b.engine)
    }

    fn link(&self) -> Option<&EngineLink> {
        self.rt.model.as_ref().and_then(ModelSlot::link)
    }

    /// Errors shown in the window.
    pub fn errors(&self) -> &[String] {
        &self.rt.errors
    }

    /// Whether a conversation changed since last asked ([`ChatPanel::take_changed`]).
    pub fn take_chat_changed(&mut self) -> bool {
        self.rt.chat.take_changed()
    }

    /// After a frame: the state saved through `saver` (its worker writes) when a conversation
    /// changed in it (a message sent, an answer ended), so a crash or a kill loses at most the
    /// answer being written.
    pub fn autosave(&mut self, saver: &mut state_file::Saver) -> std::io::Result<()> {
        if self.take_chat_changed() {
            saver.save_later(&self.state)?;
        }
        Ok(())
    }

    /// One frame of the whole window.
    pub fn app_ui(&mut self, ui: &mut egui::Ui) {
        self.poll(ui.ctx());
        // News (the engine's steps above all) draws at most one frame per interval; on a CPU
        // rasterizer fewer while the engine computes, and the status bar says so.
        let busy = self.engine_busy();
        self.rt.pacing.apply(ui.ctx(), busy);
        let mut cmds = Vec::new();
        renderer::panel(egui::Panel::top("top_bar"), ui)
            .show(ui, |ui| self.top_bar_ui(ui, &mut cmds));
        renderer::panel(egui::Panel::bottom("status_bar"), ui)
            .show(ui, |ui| status::ui(ui, &self.status_view()));
        if !self.rt.errors.is_empty() || self.rt.notice.is_some() {
            renderer::panel(egui::Panel::top("errors"), ui)
                .show(ui, |ui| self.errors_ui(ui, &mut cmds));
        }
        match self.state.tab {
            Tab::Chat => {
                let ready = self.link().is_some();
                cmds.extend(self.rt.chat.ui(ui, &mut self.state.chat, ready));
            }
            Tab::Dashboard => self.dashboard_tab_ui(ui, &mut cmds),
            Tab::Planner => self.planner_tab_ui(ui),
            Tab::Tuner => self.tuner_tab_ui(ui, &mut cmds),
            Tab::Models => self.models_page_ui(ui, &mut cmds),
            Tab::Quantize => self.quantize_page_ui(ui),
        }
        for cmd in cmds {
            self.apply(cmd, ui.ctx());
        }
        // Live plots move while anything runs (the engine's own callback also wakes us per
        // step); an idle dashboard only scrolls its time axis, once a second, so an open window
        // costs next to nothing when nothing runs.
        let running = (self.rt.snapshot.as_ref()).is_some_and(|s| s.running + s.waiting > 0);
        if self.rt.load.is_some() || self.rt.sweep.is_some() || self.rt.tuner.running() {
            ui.ctx().request_repaint_after(Duration::from_millis(100));
        } else if self.state.tab == Tab::Dashboard {
            let every = if running { 100 } else { 1000 };
            ui.ctx().request_repaint_after(Duration::from_millis(every));
        }
    }

    /// Whether the engine has work: an answer, a request, a load run, a sweep or a tuning run.
    fn engine_busy(&self) -> bool {
        (self.rt.snapshot.as_ref()).is_some_and(|s| s.running + s.waiting > 0)
            || self.rt.chat.answering()
            || self.rt.load.is_some()
            || self.rt.sweep.is_some()
            || self.rt.tuner.running()
    }

    /// Reads every worker's news without waiting: model load, token events, load and sweep runs,
    /// and samples the engine's stats into the plot history.
    fn poll(&mut self, ctx: &egui::Context) {
        let slot = self.rt.model.get_or_insert_with(|| {
            ModelSlot::start_loading(
                self.options.model.clone(),
                self.options.threads,
                self.state.placement(),
                self.state.dash.knobs.clone(),
                ctx.clone(),
            )
        });
        match slot.poll() {
            SlotNews::Nothing => {}
            SlotNews::Ready => {
                // The new engine started without a draft model (see `start_engine`).
                let spec = &mut self.state.dash.knobs.spec;
                if spec.method == SpecMethod::Draft {
                    spec.method = SpecMethod::Off;
                }
                if self.rt.model_before.take().is_some() {
                    let name = self.link().map(EngineLink::model_name);
                    let name = name.unwrap_or_default();
                    self.rt.history.mark(format!("model {name}"));
                }
                if let Some((before, moe)) = self.rt.device_before.take() {
                    let now = self.state.device;
                    if before != now {
                        self.rt.history.mark(format!("device {before} -> {now}"));
                    }
                    let now = self.state.cpu_moe_layers;
                    if moe != now {
                        let m = format!("experts of {moe} -> {now} blocks on the CPU");
                        self.rt.history.mark(m);
                    }
                }
            }
            // Shown in the status bar; the choice stays, to retry or change.
            SlotNews::Failed => {
                self.rt.device_before = None;
                self.rt.model_before = None;
            }
            SlotNews::RestartFailed(e) if self.rt.model_before.is_some() => {
                self.options.model = self.rt.model_before.take().unwrap_or_default();
                self.rt
                    .errors
                    .push(format!("{e}; the engine runs on with the model it had"));
            }
            SlotNews::RestartFailed(e) => {
                let (back, moe) = self.rt.device_before.take().unwrap_or_default();
                self.rt
                    .errors
                    .push(format!("{e}; the engine runs on as before ({back})"));
                self.state.device = back;
                self.state.cpu_moe_layers = moe;
            }
        }
        let engine = self.rt.model.as_ref().and_then(ModelSlot::link);
        (self.rt.chat).drain(&mut self.state.chat, engine.map(|l| &l.engine));
        self.poll_runs();
        if let Some(done) = self.rt.draft.as_mut().and_then(DraftLoad::poll) {
            self.rt.draft = None;
            match done {
                // After the model (the engine takes commands in order): the draft method, if
                // it is the one chosen.
                Ok(engine) if self.state.dash.knobs.spec.method == SpecMethod::Draft => {
                    engine.set_knobs(self.state.dash.knobs.clone());
                }
                Ok(_) => {}
                Err(e) => self.rt.errors.push(e),
            }
        }
        if let Some(outcome) = self.rt.saving.as_ref().and_then(DialogTask::poll) {
            self.rt.saving = None;
            self.saved(outcome);
        }
        let lib = self
            .rt
            .library
            .get_or_insert_with(|| Library::new(Library::default_dir()));
        lib.poll(ctx);
        self.rt.models.poll(&mut self.state.models, lib, ctx);
        self.rt.wizard.poll(&mut self.state.wizard, lib, ctx);
        let mut server = std::mem::take(&mut self.rt.server);
        if let Err(e) = server.follow(self.link()) {
            self.rt.errors.push(e);
        }
        self.rt.server = server;
        let snap = self.link().map(|b| b.engine.stats());
        // A remote load run: the plots show its figures, measured here, not the idle engine's.
        let remote = self.rt.load.as_ref().and_then(|l| l.client_live.as_ref());
        if let Some(r) = remote.and_then(|l| l.snapshot()) {
            self.rt.history.sample(&r);
        } else if let Some(s) = &snap {
            self.rt.history.sample(s);
        }
        if let Some(s) = &snap {
            let old = self.rt.snapshot.as_ref().and_then(|o| o.precision);
            if old.is_some_and(|o| Some(o) != s.precision) {
                self.rt.history.mark(dashboard::precision_change_text(s));
            }
            // The speculation policy's switches, where the plots show what they did.
            let old = self.rt.snapshot.as_ref();
            if let Some(m) = old.and_then(|o| spec_knobs::switch_mark(o, s)) {
                self.rt.history.mark(m);
            }
        }
        self.rt.snapshot = snap;
    }

    fn top_bar_ui(&mut self, ui: &mut egui::Ui, cmds: &mut Vec<Command>) {
        ui.horizontal(|ui| {
            ui.strong("TPS Lab");
            ui.separator();
            for tab in Tab::ALL {
                ui.selectable_value(&mut self.state.tab, tab, tab.label());
            }
            ui.separator();
            // Text buttons: the icon buttons need glyphs the bundled fonts lack.
            let mut pref = ui.options(|o| o.theme_preference);
            ui.label("Theme");
            ui.selectable_value(&mut pref, egui::ThemePreference::Dark, "Dark");
            ui.selectable_value(&mut pref, egui::ThemePreference::Light, "Light");
            ui.selectable_value(&mut pref, egui::ThemePreference::System, "System");
            ui.ctx().set_theme(pref);
            ui.separator();
            let blocks = (self.link())
                .filter(|b| b.lm.model.cfg.extras.moe.is_some())
                .map(|b| b.lm.model.cfg.n_layers);
            let mut draft = self.rt.cpu_moe_draft.unwrap_or(self.state.cpu_moe_layers);
            let view = self.status_view();
            status::device_ui(ui, &view, cmds);
            if let Some(blocks) = blocks {
                status::cpu_moe_ui(ui, &view, blocks, &mut draft, cmds);
                self.rt.cpu_moe_draft = Some(draft);
            }
        });
    }

    fn status_view(&self) -> status::StatusView<'_> {
        status::StatusView {
            model: self.rt.model.as_ref(),
            snapshot: self.rt.snapshot.as_ref(),
            device: self.state.device,
            device_locked: self.device_locked(),
            cpu_moe_layers: self.state.cpu_moe_layers,
            frames: self.rt.pacing.note(self.engine_busy()),
        }
    }

    /// Why the engine cannot be restarted on another device now: a restart would end what runs.
    fn device_locked(&self) -> Option<&'static str> {
        if matches!(self.rt.model, Some(ModelSlot::Loading { .. })) {
            Some("The engine is starting")
        } else if self.rt.chat.answering()
            || self.rt.load.is_some()
            || self.rt.sweep.is_some()
            || self.rt.tuner.running()
        {
            Some(
                "Stop the running answers, load, sweep or tuning first: switching restarts the engine",
            )
        } else {
            None
        }
    }

    /// The precision the engine serves at now (the live knob may have changed the file's).
    fn precision_now(&self) -> Option<Precision> {
        (self.rt.snapshot.as_ref().and_then(|s| s.precision))
            .or_else(|| self.link().map(|b| b.lm.precision))
    }

    /// [`Self::precision_now`] as the labels write it.
    fn precision(&self) -> String {
        self.precision_now()
            .map_or_else(|| "–".into(), |p| p.to_string())
    }

    fn errors_ui(&self, ui: &mut egui::Ui, cmds: &mut Vec<Command>) {
        for (i, e) in self.rt.errors.iter().enumerate() {
            ui.horizontal(|ui| {
                ui.colored_label(ui.visuals().error_fg_color, format!("Error: {e}"));
                if ui.small_button("Dismiss").clicked() {
                    cmds.push(Command::DismissError(i));
                }
            });
        }
        if let Some(n) = &self.rt.notice {
            ui.label(n);
        }
    }

    fn dashboard_tab_ui(&mut self, ui: &mut egui::Ui, cmds: &mut Vec<Command>) {
        // During a remote load run the plots are the remote server's: labelled as such.
        let remote = (self.rt.load.as_ref())
            .and_then(|l| l.client_live.as_ref())
            .and_then(|l| l.device.get());
        let precision = match remote {
            Some(_) => "remote".to_string(),
            None => self.precision(),
        };
        let device = match remote {
            Some(d) => d.as_str(),
            None => self.rt.snapshot.as_ref().map_or("–", |s| s.device.as_str()),
        };
        let view = DashView {
            snapshot: self.rt.snapshot.as_ref(),
            precision: &precision,
            device,
            history: &self.rt.history,
            load_running: self
                .rt
                .load
                .as_ref()
                .map(|l| (l.label.as_str(), l.done(), l.stopping())),
            last_load: self.rt.last_load.as_ref(),
            sweep_running: self.rt.sweep.is_some(),
            sweep_levels: self.rt.sweep.as_ref().map_or(&[][..], |s| &s.levels),
            sweep_points: &self.rt.sweep_points,
            saving: self.rt.saving.is_some(),
            server: self.rt.server.describe(),
            models: self.rt.library.as_ref().map_or(&[][..], |l| &l.models),
            model_cfg: self
                .rt
                .model
                .as_ref()
                .and_then(ModelSlot::link)
                .map(|b| &b.lm.model.cfg),
            kv_quality: &self.rt.kv_quality,
        };
        renderer::central_panel(ui).show(ui, |ui| {
            dashboard::ui(ui, &mut self.state.dash, &view, cmds);
        });
    }

    /// Applies one command; failures become errors shown in the window.
    pub fn apply(&mut self, cmd: Command, ctx: &egui::Context) {
        if let Err(e) = self.try_apply(cmd, ctx) {
            self.rt.errors.push(e);
        }
    }

    fn try_apply(&mut self, cmd: Command, ctx: &egui::Context) -> Result<(), String> {
        match cmd {
            Command::Chat(cmd) => {
                let link = self.rt.model.as_ref().and_then(ModelSlot::link);
                (self.rt.chat).apply(cmd, &mut self.state.chat, link, &self.dialogs, ctx)
            }
            Command::SetKnobs(knobs) => {
                let engine = self.engine().ok_or("the model is not loaded yet")?;
                let old = engine.stats().knobs;
                engine.set_knobs(knobs.clone());
                self.rt.history.mark(describe_knob_change(&old, &knobs));
                Ok(())
            }
            Command::SetPrecision(ty) => {
                let engine = self.engine().ok_or("the model is not loaded yet")?;
                engine.set_precision(ty);
                Ok(())
            }
            Command::ResetMetrics => {
                self.engine()
                    .ok_or("the model is not loaded yet")?
                    .reset_metrics();
                Ok(())
            }
            Command::StartLoad => {
                self.not_tuning()?;
                let b = self.link().ok_or("the model is not loaded yet")?;
                let target = TargetSpec::of(&b.engine, &self.state.dash.load);
                let run = LoadRun::start(target, &b.prompts, &self.state.dash.load, ctx)?;
                self.rt.history.mark(format!("load started: {}", run.label));
                self.rt.load = Some(run);
                Ok(())
            }
            Command::StopLoad => {
                if let Some(l) = &self.rt.load {
                    l.stop();
                    self.rt.history.mark("load stopped".into());
                }
                Ok(())
            }
            Command::StartSweep => self.start_sweep(ctx),
            Command::StopSweep => {
                if let Some(s) = &self.rt.sweep {
                    s.stop();
                }
                Ok(())
            }
            Command::SaveSweep => self.save_sweep(ctx),
            Command::DismissError(i) => {
                if i < self.rt.errors.len() {
                    self.rt.errors.remove(i);
                }
                Ok(())
            }
            Command::SetDevice(pref) => self.set_device(pref, ctx),
            Command::SetCpuMoe(n) => self.restart_on(self.state.device, n, ctx),
            Command::LoadModel(path) => self.load_model(path, ctx),
            Command::SetDraftModel(path) => {
                let engine = self.engine().ok_or("the model is not loaded yet")?.clone();
                self.rt.draft = Some(DraftLoad::start(path, engine, ctx)?);
                Ok(())
            }
            Command::StartServer => self.start_server(),
            Command::StopServer => {
                self.rt.server.stop();
                Ok(())
            }
            Command::StartTune => self.start_tune(ctx),
            Command::StopTune => {
                self.rt.tuner.stop();
                Ok(())
            }
            Command::ChooseTrace => self.choose_trace(ctx),
            Command::MeasureKvQuality(types) => self.start_kv_quality(types, ctx),
            Command::CancelKvQuality => {
                self.rt.kv_quality.cancel();
                Ok(())
            }
        }
    }

    /// Restarts the engine on `pref` on a worker: the running engine (if any) keeps its model
    /// and runs until the new one is up; from a failed start, the model loads afresh.
    fn set_device(&mut self, pref: DevicePref, ctx: &egui::Context) -> Result<(), String> {
        self.restart_on(pref, self.state.cpu_moe_layers, ctx)
    }

    /// [`Self::set_device`] with `cpu_moe_layers` blocks' experts in host memory on a GPU.
    fn restart_on(
        &mut self,
        pref: DevicePref,
        cpu_moe_layers: usize,
        ctx: &egui::Context,
    ) -> Result<(), String> {
        if let Some(why) = self.device_locked() {
            return Err(format!("cannot switch the device now: {why}"));
        }
        self.rt.device_before = Some((self.state.device, self.state.cpu_moe_layers));
        self.state.device = pref;
        self.state.cpu_moe_layers = cpu_moe_layers;
        self.rt.cpu_moe_draft = None;
        let place = self.state.placement();
        let slot = match self.rt.model.take() {
            Some(ModelSlot::Ready(b)) => {
                // The engine's knobs as applied (an unapplied KV draft stays a draft).
                let knobs = b.engine.stats().knobs;
                ModelSlot::restart(b, place, knobs, ctx.clone())
            }
            _ => ModelSlot::start_loading(
                self.options.model.clone(),
                self.options.threads,
                place,
                self.state.dash.knobs.clone(),
                ctx.clone(),
            ),
        };
        self.rt.model = Some(slot);
        self.rt.snapshot = None;
        Ok(())
    }
}

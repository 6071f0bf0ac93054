//! The Models panel's Hugging Face part: search the Hub (or a server that speaks its API), pick a
//! result or type a repo id, list its files with sizes, choose a GGUF file or the safetensors set,
//! download it into the library with progress, speed, ETA and cancel. Before a download, each
//! GGUF file's header is read (range requests) for its quant type, architecture (whether this
//! build runs it) and the memory it needs at a chosen context and batch, with fits / does not fit
//! against this machine's RAM and VRAM, as LM Studio shows. Search, listing, headers and download
//! each run on a worker; the frame never waits.

use std::path::PathBuf;

use super::message_ui;
use crate::hub::{Choice, GgufFit, Machine, RepoListing, SearchHit, human_bytes};
use crate::ui::catalog::{self, Library};
use crate::ui::hub_adapter::{self, HubRequest};
use crate::ui::task::Task;
use tpslab_engine::library::fit::Verdict;

/// How many search results are asked for.
const SEARCH_LIMIT: usize = 20;

/// The Hub fields of the Models panel's saved settings, borrowed for one frame: this part edits
/// them, and they are saved with the rest of the panel's settings.
pub(super) struct HubFields<'a> {
    pub repo: &'a mut String,
    pub query: &'a mut String,
    /// Empty: the Hub itself.
    pub endpoint: &'a mut String,
}

/// The answer to one search.
struct Found {
    query: String,
    hits: Vec<SearchHit>,
}

/// The Hub part's runtime state (the token is never saved).
#[derive(Default)]
pub(super) struct HubPanel {
    token: String,
    search: Option<Task<Found>>,
    /// The last search's results, offered to pick from.
    found: Option<Found>,
    /// Why the last search failed (or that it found nothing).
    search_message: Option<Result<String, String>>,
    listing: Option<Task<RepoListing>>,
    /// The request the last listing was made with (its headers are read with the same).
    listed_req: Option<HubRequest>,
    /// Reading the GGUF headers of the last listing.
    fits: Option<Task<Vec<GgufFit>>>,
    /// Each GGUF model of the last listing, from its header (or why not).
    fitted: Vec<GgufFit>,
    fit_error: Option<String>,
    /// Context and batch the memory need is shown at (0: not set yet, the defaults).
    fit_ctx: usize,
    fit_batch: usize,
    /// The last listing, whose files are offered below.
    listed: Option<RepoListing>,
    choice: Option<Choice>,
    download: Option<Task<PathBuf>>,
    message: Option<Result<String, String>>,
}

impl HubPanel {
    /// Reads the workers' results.
    pub(super) fn poll(&mut self, lib: &mut Library, ctx: &egui::Context) {
        if let Some(r) = self.search.as_mut().and_then(Task::poll) {
            self.search = None;
            match r {
                Ok(found) if found.hits.is_empty() => {
                    self.search_message = Some(Ok(format!(
                        "No model repository matches \"{}\"",
                        found.query
                    )));
                    self.found = None;
                }
                Ok(found) => {
                    let n = found.hits.len();
                    let s = if n == 1 { "" } else { "s" };
                    self.search_message = Some(Ok(format!(
                        "{n} result{s} for \"{}\": click one to list its files",
                        found.query
                    )));
                    self.found = Some(found);
                }
                Err(e) => {
                    self.search_message = Some(Err(e));
                    self.found = None;
                }
            }
        }
        if let Some(r) = self.listing.as_mut().and_then(Task::poll) {
            self.listing = None;
            match r {
                Ok(listing) => {
                    self.start_fits(&listing, ctx);
                    self.choice = hub_adapter::default_choice(&listing);
                    let gated = if listing.gated { ", gated" } else { "" };
                    let n = listing.files.len();
                    self.message = Some(Ok(format!("{}: {n} files{gated}", listing.repo)));
                    self.listed = Some(listing);
                }
                Err(e) => self.message = Some(Err(e)),
            }
        }
        if let Some(r) = self.fits.as_mut().and_then(Task::poll) {
            self.fits = None;
            match r {
                Ok(fits) => self.fitted = fits,
                Err(e) => self.fit_error = Some(e),
            }
        }
        if let Some(r) = self.download.as_mut().and_then(Task::poll) {
            self.download = None;
            self.message = Some(r.map(|p| format!("Downloaded {}", catalog::file_name(&p))));
            lib.rescan(ctx);
        }
    }

    /// Whether a worker of this part is running (the app keeps repainting while one is).
    pub(super) fn busy(&self) -> bool {
        self.locked() || self.fits.is_some()
    }

    /// Whether a worker that holds the buttons is running. Reading the headers (read-only, on
    /// its own worker) never holds up a search, a listing or a download.
    fn locked(&self) -> bool {
        self.search.is_some() || self.listing.is_some() || self.download.is_some()
    }

    fn request(&self, f: &HubFields<'_>) -> HubRequest {
        HubRequest {
            repo: f.repo.trim().to_string(),
            endpoint: Some(f.endpoint.trim().to_string()).filter(|e| !e.is_empty()),
            token: Some(self.token.trim().to_string()).filter(|t| !t.is_empty()),
        }
    }

    fn start_search(&mut self, req: HubRequest, query: String, ctx: &egui::Context) {
        self.search_message = None;
        let what = format!("Searching for \"{query}\"");
        match Task::spawn("hub-search", what, ctx, move |_| {
            let hits = hub_adapter::search(&req, &query, SEARCH_LIMIT)?;
            Ok(Found { query, hits })
        }) {
            Ok(t) => self.search = Some(t),
            Err(e) => self.search_message = Some(Err(e)),
        }
    }

    /// Reads the headers of the listing's GGUF files on a worker.
    fn start_fits(&mut self, listing: &RepoListing, ctx: &egui::Context) {
        let Some(req) = self.listed_req.clone() else {
            return;
        };
        if listing.ggufs().is_empty() {
            return;
        }
        let listing = listing.clone();
        let what = format!("Reading the GGUF headers of {}", listing.repo);
        match Task::spawn("hub-fit", what, ctx, move |_| {
            hub_adapter::read_ggufs(&req, &listing)
        }) {
            Ok(t) => self.fits = Some(t),
            Err(e) => self.fit_error = Some(e),
        }
    }

    fn start_listing(&mut self, req: HubRequest, ctx: &egui::Context) {
        self.listed = None;
        self.choice = None;
        self.message = None;
        // The headers of an earlier listing are not this one's: its task is dropped unread.
        self.fits = None;
        self.fitted.clear();
        self.fit_error = None;
        self.listed_req = Some(req.clone());
        let what = format!("Listing {}", req.repo);
        match Task::spawn("hub-list", what, ctx, move |_| {
            hub_adapter::list_files(&req)
        }) {
            Ok(t) => self.listing = Some(t),
            Err(e) => self.message = Some(Err(e)),
        }
    }

    fn start_download(
        &mut self,
        req: HubRequest,
        choice: Choice,
        lib: &Library,
        ctx: &egui::Context,
    ) {
        let dir = lib.dir.clone();
        let what = format!("Downloading from {}", req.repo);
        self.message = None;
        match Task::spawn("hub-download", what, ctx, move |rep| {
            hub_adapter::download(&req, choice, &dir, rep)
        }) {
            Ok(t) => self.download = Some(t),
            Err(e) => self.message = Some(Err(e)),
        }
    }

    pub(super) fn ui(
        &mut self,
        ui: &mut egui::Ui,
        f: &mut HubFields<'_>,
        lib: &Library,
        vram: Option<u64>,
    ) {
        egui::Grid::new("hub_fields").num_columns(2).show(ui, |ui| {
            let l = ui.label("Endpoint");
            ui.add(
                egui::TextEdit::singleline(&mut *f.endpoint)
                    .hint_text("https://huggingface.co (optional)"),
            )
            .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Token");
            ui.add(
                egui::TextEdit::singleline(&mut self.token)
                    .password(true)
                    .hint_text("for gated repos (optional, not saved)"),
            )
            .labelled_by(l.id);
            ui.end_row();
        });
        ui.push_id("search", |ui| self.search_ui(ui, f));
        ui.push_id("repo", |ui| self.repo_ui(ui, f, lib, vram));
    }

    fn search_ui(&mut self, ui: &mut egui::Ui, f: &mut HubFields<'_>) {
        let idle = !self.locked();
        ui.horizontal(|ui| {
            let l = ui.label("Search the Hub");
            let r = ui
                .add(
                    egui::TextEdit::singleline(&mut *f.query)
                        .hint_text("SmolLM2 GGUF")
                        .desired_width(260.0),
                )
                .labelled_by(l.id);
            let query = f.query.trim().to_string();
            let enter = r.lost_focus() && ui.input(|i| i.key_pressed(egui::Key::Enter));
            let can = idle && !query.is_empty();
            let clicked = ui.add_enabled(can, egui::Button::new("Search")).clicked();
            if can && (clicked || enter) {
                self.start_search(self.request(f), query, ui.ctx());
            }
            ui.add_visible(self.search.is_some(), egui::Spinner::new());
        });
        message_ui(ui, self.search_message.as_ref());
        let Some(found) = &self.found else {
            return;
        };
        let mut picked = None;
        egui::ScrollArea::vertical()
            .id_salt("hub_hits")
            .max_height(140.0)
            .show(ui, |ui| {
                egui::Grid::new("hub_hits_grid")
                    .striped(true)
                    .num_columns(3)
                    .show(ui, |ui| {
                        for hit in &found.hits {
                            let sel = f.repo.trim() == hit.id;
                            let b = egui::Button::selectable(sel, hit.id.as_str());
                            if ui.add_enabled(idle, b).clicked() {
                                picked = Some(hit.id.clone());
                            }
                            ui.weak(format!("{} downloads", hit.downloads));
                            ui.weak(format!("{} likes", hit.likes));
                            ui.end_row();
                        }
                    });
            });
        if let Some(id) = picked {
            *f.repo = id;
            self.start_listing(self.request(f), ui.ctx());
        }
    }

    fn repo_ui(
        &mut self,
        ui: &mut egui::Ui,
        f: &mut HubFields<'_>,
        lib: &Library,
        vram: Option<u64>,
    ) {
        let idle = !self.locked();
        ui.horizontal(|ui| {
            let l = ui.label("Repo id");
            ui.add(
                egui::TextEdit::singleline(&mut *f.repo)
                    .hint_text("HuggingFaceTB/SmolLM2-135M-Instruct")
                    .desired_width(260.0),
            )
            .labelled_by(l.id);
            let req = self.request(f);
            let can = idle && !req.repo.is_empty();
            if ui
                .add_enabled(can, egui::Button::new("List files"))
                .clicked()
            {
                self.start_listing(req, ui.ctx());
            }
        });
        if self.listing.is_some() {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label("Listing the repo's files…");
            });
        }
        let mut start = None;
        if self.listed.as_ref().is_some_and(|l| !l.ggufs().is_empty()) {
            ui.push_id("fit", |ui| self.fit_ui(ui));
        }
        if let Some(listing) = &self.listed {
            let fit = FitView {
                fits: &self.fitted,
                machine: Machine::this(vram),
                ctx: self.fit_ctx,
                batch: self.fit_batch,
            };
            files_ui(ui, listing, &mut self.choice, &fit);
            let can = idle && self.choice.is_some();
            if ui.add_enabled(can, egui::Button::new("Download")).clicked()
                && let Some(choice) = self.choice.clone()
            {
                start = Some((listing.repo.clone(), choice));
            }
        }
        if let Some((repo, choice)) = start {
            // The repo listed, whatever the field says now.
            let req = HubRequest {
                repo,
                ..self.request(f)
            };
            self.start_download(req, choice, lib, ui.ctx());
        }
        if let Some(t) = &self.download {
            t.progress_ui(ui, true, Some("Cancel download"));
        }
        message_ui(ui, self.message.as_ref());
    }
}

/// Default context and batch of the memory need (LM Studio's default context is 4096).
const FIT_CTX: usize = 4096;
const FIT_BATCH: usize = 1;

/// What the file rows show of each GGUF's fit, for one frame.
struct FitView<'a> {
    fits: &'a [GgufFit],
    machine: Machine,
    ctx: usize,
    batch: usize,
}

/// The columns after a GGUF's radio button.
const FIT_COLUMNS: [&str; 5] = ["Type", "Architecture", "Needs", "RAM", "VRAM"];

impl HubPanel {
    /// The context and batch the memory need is shown at, and the headers' progress.
    fn fit_ui(&mut self, ui: &mut egui::Ui) {
        if self.fit_ctx == 0 {
            (self.fit_ctx, self.fit_batch) = (FIT_CTX, FIT_BATCH);
        }
        ui.horizontal(|ui| {
            let l = ui.label("Memory at context");
            ui.add(egui::DragValue::new(&mut self.fit_ctx).range(1..=1 << 20))
                .labelled_by(l.id);
            let l = ui.label("batch");
            ui.add(egui::DragValue::new(&mut self.fit_batch).range(1..=1024))
                .labelled_by(l.id);
            ui.weak("(weights + KV cache, read from each GGUF's header)");
        });
        if self.fits.is_some() {
            ui.horizontal(|ui| {
                ui.spinner();
                ui.label("Reading the GGUF headers…");
            });
        }
        if let Some(e) = &self.fit_error {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
    }
}

/// A GGUF's fit cells: type, architecture, need, RAM and VRAM verdicts.
fn fit_row_ui(ui: &mut egui::Ui, fit: &GgufFit, m: &Machine, ctx: usize, batch: usize) {
    let needs = match &fit.needs {
        Ok(n) => n,
        Err(e) => {
            ui.label("—");
            ui.colored_label(ui.visuals().error_fg_color, format!("unreadable: {e}"));
            return;
        }
    };
    ui.label(&needs.quant);
    if needs.runs() {
        ui.label(format!("{} (runs here)", needs.arch));
    } else {
        ui.colored_label(
            ui.visuals().warn_fg_color,
            format!("{} (not run by this build)", needs.arch),
        );
    }
    match (needs.need_bytes(ctx, batch), needs.kv_bytes(ctx, batch)) {
        (Some(need), Some(kv)) => ui.label(format!(
            "{} ({} weights + {} KV)",
            human_bytes(need),
            human_bytes(needs.weights),
            human_bytes(kv)
        )),
        _ => ui.label(format!("{} weights", human_bytes(needs.weights))),
    };
    let (ram, vram) = fit.verdict(m, ctx, batch);
    for (what, v) in [("RAM", ram), ("VRAM", vram)] {
        let text = match v {
            Verdict::Unknown if what == "VRAM" && m.vram.is_none() => "no GPU".to_string(),
            v => format!("{what}: {}", v.text()),
        };
        match v {
            Verdict::Fits => ui.colored_label(egui::Color32::from_rgb(60, 160, 60), text),
            Verdict::DoesNotFit => ui.colored_label(ui.visuals().error_fg_color, text),
            Verdict::Unknown => ui.weak(text),
        };
    }
}

/// The repo's files with sizes: each GGUF (with its fit, once its header is read) and the
/// safetensors set to choose from, the rest greyed.
fn files_ui(
    ui: &mut egui::Ui,
    listing: &RepoListing,
    choice: &mut Option<Choice>,
    fit: &FitView<'_>,
) {
    ui.label(format!("Files of {} ({}):", listing.repo, listing.revision));
    if !fit.fits.is_empty() {
        let have = |b: Option<u64>| b.map_or("none".to_string(), human_bytes);
        ui.label(format!(
            "This machine: RAM {}, VRAM {}",
            have(fit.machine.ram),
            have(fit.machine.vram)
        ));
    }
    egui::ScrollArea::vertical()
        .id_salt("hub_files")
        .max_height(220.0)
        .show(ui, |ui| {
            let ggufs = listing.ggufs();
            egui::Grid::new("hub_gguf_grid")
                .striped(true)
                .num_columns(1 + FIT_COLUMNS.len())
                .show(ui, |ui| {
                    if !fit.fits.is_empty() {
                        ui.strong("File");
                        for h in FIT_COLUMNS {
                            ui.strong(h);
                        }
                        ui.end_row();
                    }
                    for f in &ggufs {
                        let text = format!("{} ({})", f.name, human_bytes(f.size));
                        ui.radio_value(choice, Some(Choice::File(f.name.clone())), text);
                        if let Some(row) = fit.fits.iter().find(|r| r.file == f.name) {
                            fit_row_ui(ui, row, &fit.machine, fit.ctx, fit.batch);
                        }
                        ui.end_row();
                    }
                });
            let set = listing.safetensors_set();
            if let Some(set) = &set {
                let bytes: u64 = set.iter().map(|f| f.size).sum();
                let text = format!(
                    "Safetensors set: {} files ({})",
                    set.len(),
                    human_bytes(bytes)
                );
                ui.radio_value(choice, Some(Choice::Safetensors), text);
            }
            let offered = |n: &str| {
                ggufs.iter().any(|f| f.name == n)
                    || set.as_ref().is_some_and(|s| s.iter().any(|f| f.name == n))
            };
            for f in listing.files.iter().filter(|f| !offered(&f.name)) {
                ui.weak(format!("{} ({})", f.name, human_bytes(f.size)));
            }
        });
}

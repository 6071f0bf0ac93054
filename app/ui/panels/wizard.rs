//! The quantization wizard: a source model from the library, a target type with a note on each,
//! the predicted file size and memory (from the quantizer's own plan) before starting, the
//! conversion on a worker with progress and cancel, the output written into the library; then
//! perplexity over the bundled text on a worker with progress and cancel (and the KL divergence
//! from the source model, both run side by side, when the measured model is another file), and a
//! table of the models measured: precision, size, perplexity, KL and top-1 agreement against the
//! source, and the decode speed the dashboard last measured
//! on each.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use serde::{Deserialize, Serialize};
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::kv::KvTypes;
use tpslab_engine::library::entry::StoredType;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::quant::preset::Preset;
use tpslab_engine::quant::quantize::{QuantizeOptions, plan, quantize_file};
use tpslab_engine::serving::kl::kl_divergence;
use tpslab_engine::serving::perplexity::{
    BUNDLED_TEXT, BUNDLED_TEXT_NAME, PerplexityReport, perplexity,
};

use super::message_ui;
use crate::ui::catalog::{self, Library, same_file, size_text};
use crate::ui::task::Task;

/// What the wizard keeps across restarts: its choices and the measured table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WizardSettings {
    /// The target type.
    pub target: Preset,
    /// Perplexity window (tokens); the second half of each is scored.
    pub ppl_ctx: usize,
    pub measured: Vec<Measured>,
}

impl Default for WizardSettings {
    fn default() -> Self {
        Self {
            target: Preset::Q8_0,
            ppl_ctx: 512,
            measured: Vec::new(),
        }
    }
}

/// KL divergence figures of one measured model against its source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct KlFigures {
    pub mean: f64,
    pub p99: f64,
    pub same_top: f64,
}

/// What a quality run measured: the model's perplexity, and its KL against the source when one
/// is chosen and it is another file.
pub struct Quality {
    pub ppl: PerplexityReport,
    pub kl: Option<KlFigures>,
}

/// One row of the measured table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Measured {
    pub path: PathBuf,
    /// The type the file stores (the library's label), unknown for a file the library lost.
    pub precision: StoredType,
    pub size_bytes: u64,
    pub perplexity: f64,
    pub ctx: usize,
    /// Against the model it was quantized from (the wizard's source), llama.cpp's
    /// `--kl-divergence` figures: mean and P99 KL (nats), top-1 agreement (0..1).
    pub kl: Option<KlFigures>,
    /// Per-request decode tok/s from the dashboard's last run on this model, and that run's shape.
    pub decode_tps: Option<f64>,
    pub decode_run: String,
}

/// The plan's figures, as the wizard shows them.
#[derive(Debug, Clone)]
struct PlanInfo {
    summary: String,
    input_bytes: u64,
    output_bytes: u64,
    /// Tensor bytes (what the weights take in memory once loaded).
    weights_bytes: u64,
    /// The largest tensor's source plus output bytes: what a conversion holds at once.
    peak_bytes: u64,
}

type PlanKey = (PathBuf, Preset);

/// What the wizard needs from the app this frame.
pub struct WizardView<'a> {
    pub loaded: Option<&'a Path>,
    /// The dashboard's KV pool budget, for the memory estimate.
    pub kv_budget: usize,
    /// Compute threads (0 = one per core).
    pub threads: usize,
}

/// The wizard's runtime state.
#[derive(Default)]
pub struct Wizard {
    source: Option<PathBuf>,
    output_name: String,
    /// The output name was typed by the user (not derived from the source and target).
    output_edited: bool,
    planning: Option<(PlanKey, Task<PlanInfo>)>,
    plan: Option<(PlanKey, Result<PlanInfo, String>)>,
    quantize: Option<Task<PathBuf>>,
    /// The model to measure (the last output once there is one).
    measure: Option<PathBuf>,
    ppl: Option<(PathBuf, Task<Quality>)>,
    message: Option<Result<String, String>>,
    ppl_message: Option<Result<String, String>>,
    /// Decode speeds the dashboard measured, by model path (runtime: figures of this session).
    speeds: HashMap<PathBuf, (f64, String)>,
}

/// The presets offered (every one but F32, from the most bits to the fewest), with their notes.
pub fn targets() -> Vec<(Preset, &'static str, &'static str)> {
    Preset::ALL
        .into_iter()
        .filter(|&p| p != Preset::F32)
        .map(|p| (p, p.name(), p.note()))
        .collect()
}

/// "SmolLM2-135M-Instruct.Q8_0.gguf" from "SmolLM2-135M-Instruct.Q4_1.gguf": the source's name
/// without its precision suffix, then the target's.
pub fn output_name(source: &Path, source_precision: &str, target: Preset) -> String {
    let stem = source
        .file_stem()
        .map_or_else(|| "model".into(), |s| s.to_string_lossy().into_owned());
    let lower = stem.to_ascii_lowercase();
    let p = source_precision.to_ascii_lowercase();
    let base = [".", "-", "_"]
        .iter()
        .find_map(|sep| lower.strip_suffix(&format!("{sep}{p}")).map(str::len))
        .map_or(stem.as_str(), |n| &stem[..n]);
    format!("{base}.{target}.gguf")
}

impl Wizard {
    /// Records the decode speed the dashboard measured on `path` (shown in the table).
    pub fn record_speed(
        &mut self,
        settings: &mut WizardSettings,
        path: &Path,
        tps: f64,
        run: String,
    ) {
        for m in settings
            .measured
            .iter_mut()
            .filter(|m| same_file(&m.path, path))
        {
            m.decode_tps = Some(tps);
            m.decode_run = run.clone();
        }
        self.speeds.insert(path.to_path_buf(), (tps, run));
    }

    pub fn busy(&self) -> bool {
        self.planning.is_some() || self.quantize.is_some() || self.ppl.is_some()
    }

    /// Reads the workers' results.
    pub fn poll(&mut self, settings: &mut WizardSettings, lib: &mut Library, ctx: &egui::Context) {
        if let Some((key, t)) = &mut self.planning
            && let Some(r) = t.poll()
        {
            self.plan = Some((key.clone(), r));
            self.planning = None;
        }
        if let Some(r) = self.quantize.as_mut().and_then(Task::poll) {
            self.quantize = None;
            self.message = Some(match r {
                Ok(p) => {
                    let size = std::fs::metadata(&p).map_or(0, |m| m.len());
                    let msg = format!("Wrote {} ({})", catalog::file_name(&p), size_text(size));
                    self.measure = Some(p);
                    Ok(msg)
                }
                Err(e) => Err(e),
            });
            lib.rescan(ctx);
        }
        if let Some((path, t)) = &mut self.ppl
            && let Some(r) = t.poll()
        {
            let path = std::mem::take(path);
            self.ppl = None;
            self.ppl_message = Some(r.map(|q| {
                self.add_row(settings, lib, &path, &q);
                let rep = &q.ppl;
                let kl = q.kl.map_or_else(String::new, |k| {
                    format!(
                        "; KL {:.4} (P99 {:.4}), same top token {:.1}% vs the source",
                        k.mean,
                        k.p99,
                        100.0 * k.same_top
                    )
                });
                format!(
                    "{}: perplexity {:.3} over {} tokens ({} windows of {}) in {:.1} s{kl}",
                    catalog::file_name(&path),
                    rep.perplexity,
                    rep.tokens_scored,
                    rep.windows,
                    rep.ctx,
                    rep.seconds
                )
            }));
        }
    }

    fn add_row(&self, s: &mut WizardSettings, lib: &Library, path: &Path, q: &Quality) {
        let rep = &q.ppl;
        let entry = lib.find(path);
        let speed = self.speeds.iter().find(|(p, _)| same_file(p, path));
        let row = Measured {
            path: path.to_path_buf(),
            precision: entry.map_or(StoredType::Unknown, |e| e.precision.clone()),
            size_bytes: entry.map_or_else(
                || std::fs::metadata(path).map_or(0, |m| m.len()),
                |e| e.size,
            ),
            perplexity: rep.perplexity,
            ctx: rep.ctx,
            kl: q.kl,
            decode_tps: speed.map(|(_, (t, _))| *t),
            decode_run: speed.map_or_else(String::new, |(_, (_, r))| r.clone()),
        };
        // One row per model and window: a new measurement replaces the old one.
        s.measured
            .retain(|m| !(same_file(&m.path, path) && m.ctx == rep.ctx));
        s.measured.push(row);
    }

    pub fn ui(
        &mut self,
        ui: &mut egui::Ui,
        s: &mut WizardSettings,
        lib: &Library,
        view: &WizardView<'_>,
    ) {
        let ctx = ui.ctx().clone();
        self.source_ui(ui, lib, view);
        ui.separator();
        let target = s.target;
        let mut chosen = target;
        ui.strong("Target type");
        // 16 presets: wrapped in a few rows (each with its note on hover, the chosen one's
        // below), so the run and measure parts stay in view.
        ui.horizontal_wrapped(|ui| {
            for (t, name, note) in targets() {
                ui.radio_value(&mut chosen, t, name).on_hover_text(note);
            }
        });
        ui.label(format!("{chosen}: {}", chosen.note()));
        if chosen != target {
            s.target = chosen;
        }
        let src = self.source.clone().and_then(|p| lib.find(&p).cloned());
        if let Some(src) = &src
            && !self.output_edited
        {
            self.output_name = output_name(&src.path, &src.precision.to_string(), chosen);
        }
        ui.separator();
        let Some(src) = src else {
            ui.label("Pick a source model (import or download one on the Models page).");
            return;
        };
        // Parts under their own ids: lines that come and go above never shift the ids below.
        ui.push_id("plan", |ui| self.plan_ui(ui, &src.path, chosen, view, &ctx));
        ui.push_id("run", |ui| {
            self.run_ui(ui, lib, &src.path, chosen, view, &ctx)
        });
        ui.separator();
        ui.push_id("measure", |ui| self.measure_ui(ui, s, lib, view, &ctx));
    }

    fn source_ui(&mut self, ui: &mut egui::Ui, lib: &Library, view: &WizardView<'_>) {
        let valid = |p: &Option<PathBuf>| p.as_ref().is_some_and(|p| lib.find(p).is_some());
        if !valid(&self.source) {
            // The loaded model if the library has it, else the first.
            self.source = view
                .loaded
                .and_then(|l| lib.find(l))
                .or(lib.models.first())
                .map(|m| m.path.clone());
        }
        ui.horizontal(|ui| {
            let l = ui.label("Source model");
            let text = self
                .source
                .as_deref()
                .map_or_else(|| "(none)".into(), catalog::file_name);
            egui::ComboBox::from_id_salt("wizard_source")
                .selected_text(text)
                .show_ui(ui, |ui| {
                    for m in &lib.models {
                        let label = format!("{} ({}, {})", m.name, m.precision, size_text(m.size));
                        ui.selectable_value(&mut self.source, Some(m.path.clone()), label);
                    }
                })
                .response
                .labelled_by(l.id);
        });
    }

    /// The predicted size and memory, from the quantizer's plan (computed on a worker).
    fn plan_ui(
        &mut self,
        ui: &mut egui::Ui,
        src: &Path,
        target: Preset,
        view: &WizardView<'_>,
        ctx: &egui::Context,
    ) {
        let key: PlanKey = (src.to_path_buf(), target);
        let have = self.plan.as_ref().is_some_and(|(k, _)| *k == key);
        let asked = self.planning.as_ref().is_some_and(|(k, _)| *k == key);
        if !have && !asked && self.planning.is_none() {
            let k = key.clone();
            match Task::spawn("plan", "Planning".into(), ctx, move |_| {
                plan_info(&k.0, k.1)
            }) {
                Ok(t) => self.planning = Some((key.clone(), t)),
                Err(e) => self.plan = Some((key.clone(), Err(e))),
            }
        }
        match self.plan.as_ref().filter(|(k, _)| *k == key) {
            None => {
                ui.horizontal(|ui| {
                    ui.spinner();
                    ui.label("Working out the sizes…");
                });
            }
            Some((_, Err(e))) => {
                ui.colored_label(ui.visuals().error_fg_color, format!("Error: {e}"));
            }
            Some((_, Ok(p))) => {
                let change = (p.output_bytes as f64 / p.input_bytes.max(1) as f64 - 1.0) * 100.0;
                ui.label(format!(
                    "Predicted file: {} ({change:+.0}% vs the source's {}), tensors {}",
                    size_text(p.output_bytes),
                    size_text(p.input_bytes),
                    p.summary
                ));
                ui.label(format!(
                    "Memory to run it: weights {} + KV pool {} (the dashboard's budget) = {}",
                    size_text(p.weights_bytes),
                    size_text(view.kv_budget as u64),
                    size_text(p.weights_bytes + view.kv_budget as u64)
                ));
                ui.label(format!(
                    "While converting: one tensor at a time, up to {} beyond the app",
                    size_text(p.peak_bytes)
                ));
            }
        }
    }

    fn run_ui(
        &mut self,
        ui: &mut egui::Ui,
        lib: &Library,
        src: &Path,
        target: Preset,
        view: &WizardView<'_>,
        ctx: &egui::Context,
    ) {
        let out = lib.dir.join(self.output_name.trim());
        ui.horizontal(|ui| {
            let l = ui.label("Output file");
            let r = ui
                .add(egui::TextEdit::singleline(&mut self.output_name).desired_width(320.0))
                .labelled_by(l.id);
            if r.changed() {
                self.output_edited = true;
            }
            if self.output_edited && ui.small_button("Reset name").clicked() {
                self.output_edited = false;
            }
        });
        let why_not = if self.quantize.is_some() {
            Some("A conversion is running".to_string())
        } else if !self
            .output_name
            .trim()
            .to_ascii_lowercase()
            .ends_with(".gguf")
            || self.output_name.contains(['/', '\\'])
        {
            Some("The output needs a file name ending in .gguf".into())
        } else if out.exists() {
            Some(format!(
                "{} is already in the library",
                self.output_name.trim()
            ))
        } else if !self
            .plan
            .as_ref()
            .is_some_and(|(k, r)| k.0 == src && k.1 == target && r.is_ok())
        {
            Some("The plan is not ready".into())
        } else {
            None
        };
        ui.horizontal(|ui| {
            let b = ui.add_enabled(why_not.is_none(), egui::Button::new("Start quantization"));
            if b.clicked() {
                self.start(src, target, &out, view.threads, ctx);
            }
            if let Some(w) = &why_not
                && self.quantize.is_none()
            {
                ui.weak(w);
            }
        });
        if let Some(t) = &self.quantize {
            t.progress_ui(ui, true, Some("Cancel quantization"));
        }
        message_ui(ui, self.message.as_ref());
    }

    fn start(
        &mut self,
        src: &Path,
        target: Preset,
        out: &Path,
        threads: usize,
        ctx: &egui::Context,
    ) {
        let (src, out) = (src.to_path_buf(), out.to_path_buf());
        let what = format!("Quantizing to {target}");
        self.message = None;
        let job = Task::spawn("quantize", what, ctx, move |rep| {
            let f = GgufFile::open(&src).map_err(|e| e.to_string())?;
            let p = plan(&f, target).map_err(|e| e.to_string())?;
            let cancel = rep.cancel_flag();
            let opts = QuantizeOptions {
                threads,
                cancel: Some(&*cancel as &AtomicBool),
            };
            quantize_file(&f, &p, &out, opts, &mut |pr| {
                rep.report(pr.bytes_done, pr.total_bytes, pr.name);
            })
            .map_err(|e| e.to_string())?;
            // Its source in the index (hashing it too); the file is whole and loads either way.
            rep.report(1, 1, "indexing");
            let dir = out.parent().unwrap_or(Path::new("."));
            let _ = catalog::register_quantized(dir, &out, &src, target);
            Ok(out)
        });
        match job {
            Ok(t) => self.quantize = Some(t),
            Err(e) => self.message = Some(Err(e)),
        }
    }

    fn measure_ui(
        &mut self,
        ui: &mut egui::Ui,
        s: &mut WizardSettings,
        lib: &Library,
        view: &WizardView<'_>,
        ctx: &egui::Context,
    ) {
        ui.strong("Quality: perplexity over the bundled text");
        ui.weak(format!("{BUNDLED_TEXT_NAME}; lower is better"));
        // The last output stays chosen while the library rescans to list it.
        let gone = !lib.scanning() && self.measure.as_ref().is_none_or(|p| lib.find(p).is_none());
        if self.measure.is_none() || gone {
            self.measure = self.source.clone();
        }
        ui.horizontal(|ui| {
            let l = ui.label("Model to measure");
            let text = self
                .measure
                .as_deref()
                .map_or_else(|| "(none)".into(), catalog::file_name);
            egui::ComboBox::from_id_salt("wizard_measure")
                .selected_text(text)
                .show_ui(ui, |ui| {
                    for m in &lib.models {
                        ui.selectable_value(&mut self.measure, Some(m.path.clone()), &m.name);
                    }
                })
                .response
                .labelled_by(l.id);
            let l = ui.label("Window");
            ui.add(
                egui::DragValue::new(&mut s.ppl_ctx)
                    .range(8..=8192)
                    .suffix(" tok"),
            )
            .labelled_by(l.id);
            let can = self.ppl.is_none() && self.measure.is_some();
            if ui
                .add_enabled(can, egui::Button::new("Measure perplexity"))
                .clicked()
                && let Some(p) = self.measure.clone()
            {
                let base = self.source.clone().filter(|b| !same_file(b, &p));
                self.start_ppl(&p, base, s.ppl_ctx, view.threads, ctx);
            }
        });
        if let Some((_, t)) = &self.ppl {
            t.progress_ui(ui, false, Some("Cancel perplexity"));
        }
        message_ui(ui, self.ppl_message.as_ref());
        table_ui(ui, s);
    }

    /// Perplexity of `path`, and with a `base` (the source it was quantized from) its KL
    /// divergence from it, both models side by side (`serving::kl`).
    fn start_ppl(
        &mut self,
        path: &Path,
        base: Option<PathBuf>,
        ctx_len: usize,
        threads: usize,
        ctx: &egui::Context,
    ) {
        let p = path.to_path_buf();
        let what = format!("Measuring {}", catalog::file_name(path));
        self.ppl_message = None;
        let job = Task::spawn("perplexity", what, ctx, move |rep| {
            rep.report(0, 1, "loading the model");
            let lm =
                LoadedModel::load(&p).map_err(|e| format!("cannot load {}: {e}", p.display()))?;
            let base_lm = match base {
                Some(b) => {
                    rep.report(0, 1, "loading the source model");
                    Some(
                        LoadedModel::load(&b)
                            .map_err(|e| format!("cannot load {}: {e}", b.display()))?,
                    )
                }
                None => None,
            };
            let cancel = rep.cancel_flag();
            rep.report(0, 1, "scoring the first window");
            let progress = &mut |done: usize, total: usize| {
                let text = format!("window {done} of {total}");
                rep.report(done as u64, total as u64, &text);
            };
            let Some(base_lm) = base_lm else {
                let ppl = perplexity(&lm, BUNDLED_TEXT, ctx_len, threads, Some(&cancel), progress)
                    .map_err(|e| e.to_string())?;
                return Ok(Quality { ppl, kl: None });
            };
            let k = kl_divergence(
                &lm,
                &base_lm,
                BUNDLED_TEXT,
                ctx_len,
                threads,
                KvTypes::F16,
                Some(&cancel),
                progress,
            )
            .map_err(|e| e.to_string())?;
            let ppl = PerplexityReport {
                perplexity: k.ppl.value,
                nll: k.ppl.value.ln(),
                tokens_scored: k.tokens_scored,
                text_tokens: k.text_tokens,
                windows: k.windows,
                ctx: k.ctx,
                seconds: k.seconds,
            };
            let kl = Some(KlFigures {
                mean: k.kld.value,
                p99: k.kld_spread.p99,
                same_top: k.same_top.value,
            });
            Ok(Quality { ppl, kl })
        });
        match job {
            Ok(t) => self.ppl = Some((path.to_path_buf(), t)),
            Err(e) => self.ppl_message = Some(Err(e)),
        }
    }
}

/// The measured models, side by side.
fn table_ui(ui: &mut egui::Ui, s: &mut WizardSettings) {
    if s.measured.is_empty() {
        return;
    }
    let mut remove = None;
    egui::Grid::new("wizard_measured")
        .striped(true)
        .num_columns(8)
        .show(ui, |ui| {
            for h in [
                "Model",
                "Precision",
                "Size",
                "Perplexity",
                "KL vs source (P99)",
                "Same top",
                "Decode tok/s",
                "",
            ] {
                ui.strong(h);
            }
            ui.end_row();
            for (i, m) in s.measured.iter().enumerate() {
                ui.label(catalog::file_name(&m.path));
                ui.label(m.precision.to_string());
                ui.label(size_text(m.size_bytes));
                ui.label(format!("{:.3} (ctx {})", m.perplexity, m.ctx));
                match m.kl {
                    Some(k) => {
                        ui.label(format!("{:.4} ({:.4})", k.mean, k.p99));
                        ui.label(format!("{:.1}%", 100.0 * k.same_top));
                    }
                    None => {
                        ui.weak("–")
                            .on_hover_text("The source model itself, or measured without one");
                        ui.weak("–");
                    }
                }
                match m.decode_tps {
                    Some(t) => ui.label(format!("{t:.1}")).on_hover_text(format!(
                        "per-request decode speed of the dashboard's last run on it: {}",
                        m.decode_run
                    )),
                    None => ui.weak("–").on_hover_text(
                        "Not measured: load this model and run the load generator or a sweep",
                    ),
                };
                if ui.small_button("Forget").clicked() {
                    remove = Some(i);
                }
                ui.end_row();
            }
        });
    if let Some(i) = remove {
        s.measured.remove(i);
    }
}

fn plan_info(src: &Path, target: Preset) -> Result<PlanInfo, String> {
    let f = GgufFile::open(src).map_err(|e| e.to_string())?;
    let p = plan(&f, target).map_err(|e| e.to_string())?;
    let sizes = p.tensors.iter().map(|t| (t.info.size, t.desc().size()));
    Ok(PlanInfo {
        summary: p.summary(),
        input_bytes: p.input_bytes,
        output_bytes: p.output_bytes,
        weights_bytes: p.tensors.iter().map(|t| t.desc().size()).sum(),
        peak_bytes: sizes.map(|(a, b)| a + b).max().unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_names_swap_the_precision_suffix() {
        let p = Path::new("/lib/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert_eq!(
            output_name(p, "Q4_1", Preset::Q8_0),
            "SmolLM2-135M-Instruct.Q8_0.gguf"
        );
        let p = Path::new("/lib/llama-3-8b-f16.gguf");
        assert_eq!(
            output_name(p, "F16", Preset::Q4KM),
            "llama-3-8b.Q4_K_M.gguf"
        );
        let p = Path::new("/lib/model.gguf");
        assert_eq!(output_name(p, "Q4_1", Preset::BF16), "model.BF16.gguf");
    }

    #[test]
    fn the_presets_come_in_order_with_notes_and_without_f32() {
        let t = targets();
        let names: Vec<&str> = t.iter().map(|(_, n, _)| *n).collect();
        assert_eq!(names.first(), Some(&"F16"));
        assert!(!names.contains(&"F32"));
        for want in [
            "F16", "BF16", "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_M",
            "Q2_K", "IQ4_XS", "Q4_0", "Q4_1",
        ] {
            assert!(names.contains(&want), "{want} missing from {names:?}");
        }
        assert!(t.iter().all(|(_, _, note)| !note.is_empty()));
    }
}

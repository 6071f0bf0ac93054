//! The Tuner tab: objectives, a workload and a time budget; a tuning run over the window's
//! engine (started and stopped through commands, run on its own thread), its progress, every
//! measured rung as a table, goodput against per-request TPS as a plot with the Pareto
//! frontier, the verified winner beside the defaults, and Apply (the winner's knobs, through
//! the knob-change command).

use std::path::PathBuf;

use egui_plot::{Legend, Line, Plot, PlotPoints, Points};
use serde::{Deserialize, Serialize};
use tpslab_engine::serving::engine::Knobs;
use tpslab_engine::tune::run::{frontier, last_runs};
use tpslab_engine::tune::workload::{PRESETS, preset};
use tpslab_engine::tune::{CandidateRun, Space, TuneConfig, TuneSlo, Workload};

/// The workload choice that means the two fixed lengths.
const FIXED: &str = "fixed lengths";

use crate::ui::command::Command;
use crate::ui::plots::{outline, styled};
use crate::ui::tune_run::TuneRun;

/// The tuner's form (saved). Objectives of 0 are not set; a rate of 0 is a closed loop.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct TunerSettings {
    pub ttft_p99_ms: f64,
    pub itl_p99_ms: f64,
    pub tpot_p99_ms: f64,
    pub e2e_p99_ms: f64,
    pub min_tps: f64,
    pub prompt_len: usize,
    pub output_len: usize,
    /// A workload preset's name (its length ranges replace the two lengths), or empty for the
    /// fixed lengths.
    pub preset: String,
    /// A recorded trace of a server's requests: its lengths replace the preset's or the fixed
    /// ones, and its mean arrival rate applies when `rate` is 0 (read when a run starts).
    pub trace: Option<PathBuf>,
    pub concurrency: usize,
    pub rate: f64,
    pub budget_s: f64,
    /// The shortest run of the first rung.
    pub min_run_s: f64,
}

impl Default for TunerSettings {
    fn default() -> Self {
        Self {
            ttft_p99_ms: 2000.0,
            itl_p99_ms: 200.0,
            tpot_p99_ms: 0.0,
            e2e_p99_ms: 0.0,
            min_tps: 0.0,
            prompt_len: 128,
            output_len: 64,
            preset: String::new(),
            trace: None,
            concurrency: 8,
            rate: 0.0,
            budget_s: 60.0,
            min_run_s: 1.0,
        }
    }
}

impl TunerSettings {
    /// The objectives that are set.
    pub fn slo(&self) -> Result<TuneSlo, String> {
        let set = |v: f64| (v > 0.0 && v.is_finite()).then_some(v);
        let slo = TuneSlo {
            ttft_p99_ms: set(self.ttft_p99_ms),
            itl_p99_ms: set(self.itl_p99_ms),
            tpot_p99_ms: set(self.tpot_p99_ms),
            e2e_p99_ms: set(self.e2e_p99_ms),
            min_tps: set(self.min_tps),
        };
        if slo == TuneSlo::default() {
            return Err("set at least one objective".into());
        }
        Ok(slo)
    }

    /// The session these settings ask for.
    pub fn config(&self) -> Result<TuneConfig, String> {
        let mut workload = Workload::fixed(
            self.prompt_len,
            self.output_len,
            Some(self.concurrency.max(1)),
            (self.rate > 0.0).then_some(self.rate),
        );
        if !self.preset.is_empty() && self.trace.is_none() {
            (workload.prompt_len, workload.output_len) =
                preset(&self.preset).map_err(|e| e.to_string())?;
        }
        workload.check().map_err(|e| e.to_string())?;
        if !(self.budget_s > 0.0 && self.min_run_s > 0.0) {
            return Err("the budget and the shortest run must be positive".into());
        }
        Ok(TuneConfig {
            slo: self.slo()?,
            workload,
            budget_s: self.budget_s,
            min_run_s: self.min_run_s,
            max_candidates: 32,
            space: Space::default_for(self.concurrency),
            seed: 0,
        })
    }
}

/// What the tuner shows of the app.
pub struct TunerView<'a> {
    /// The run in progress, or the last one.
    pub run: Option<&'a TuneRun>,
    /// The engine's knobs now (`None` before the model is loaded).
    pub engine_knobs: Option<&'a Knobs>,
    /// The trace dialog is open.
    pub choosing_trace: bool,
}

fn form_ui(
    ui: &mut egui::Ui,
    s: &mut TunerSettings,
    enabled: bool,
    choosing: bool,
    cmds: &mut Vec<Command>,
) {
    ui.add_enabled_ui(enabled, |ui| {
        egui::Grid::new("tuner_form").num_columns(2).show(ui, |ui| {
            for (name, v, max) in [
                ("TTFT P99 (ms)", &mut s.ttft_p99_ms, 1e7),
                ("ITL P99 (ms)", &mut s.itl_p99_ms, 1e6),
                ("TPOT P99 (ms)", &mut s.tpot_p99_ms, 1e6),
                ("E2E P99 (ms)", &mut s.e2e_p99_ms, 1e8),
                ("Min per-request TPS", &mut s.min_tps, 1e6),
                ("Arrival rate (req/s)", &mut s.rate, 1e5),
                ("Budget (s)", &mut s.budget_s, 86_400.0),
                ("Shortest run (s)", &mut s.min_run_s, 3600.0),
            ] {
                let l = ui.label(name);
                ui.add(egui::DragValue::new(v).range(0.0..=max).speed(1.0))
                    .labelled_by(l.id);
                ui.end_row();
            }
            let l = ui.label("Trace");
            ui.horizontal(|ui| {
                let shown = s
                    .trace
                    .as_ref()
                    .map_or("none".into(), |p| p.display().to_string());
                ui.label(shown).labelled_by(l.id);
                let choose = ui.add_enabled(!choosing, egui::Button::new("Choose trace…"));
                if choose
                    .on_hover_text("a file `tpslab serve --record-trace` wrote")
                    .clicked()
                {
                    cmds.push(Command::ChooseTrace);
                }
                if s.trace.is_some() && ui.button("Clear trace").clicked() {
                    s.trace = None;
                }
            });
            ui.end_row();
            let traced = s.trace.is_some();
            let l = ui.label("Workload");
            let shown = if s.preset.is_empty() {
                FIXED
            } else {
                s.preset.as_str()
            }
            .to_string();
            ui.add_enabled_ui(!traced, |ui| {
                egui::ComboBox::from_id_salt("tuner_workload")
                    .selected_text(shown)
                    .show_ui(ui, |ui| {
                        ui.selectable_value(&mut s.preset, String::new(), FIXED);
                        for p in PRESETS {
                            let ((p0, p1), (o0, o1)) = (p.prompt, p.output);
                            ui.selectable_value(&mut s.preset, p.name.to_string(), p.name)
                                .on_hover_text(format!(
                                    "prompt {p0}-{p1}, output {o0}-{o1} tokens"
                                ));
                        }
                    })
                    .response
                    .labelled_by(l.id);
            });
            ui.end_row();
            let fixed = s.preset.is_empty() && !traced;
            for (name, v, max, on) in [
                ("Prompt length", &mut s.prompt_len, 1 << 20, fixed),
                ("Output length", &mut s.output_len, 1 << 20, fixed),
                ("Concurrency", &mut s.concurrency, 4096, true),
            ] {
                let l = ui.label(name);
                ui.add_enabled(on, egui::DragValue::new(v).range(1..=max))
                    .labelled_by(l.id);
                ui.end_row();
            }
        });
        ui.label(
            egui::RichText::new(
                "Objectives of 0 are not set; an arrival rate of 0 is a closed loop at the \
                 concurrency, or with a trace the trace's own rate (the concurrency then caps \
                 what is in flight).",
            )
            .small(),
        );
    });
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"))
}

fn table_ui(ui: &mut egui::Ui, runs: &[CandidateRun]) {
    egui::Grid::new("tuner_rows")
        .striped(true)
        .num_columns(10)
        .show(ui, |ui| {
            for h in [
                "#",
                "rung",
                "knobs",
                "good / done",
                "goodput req/s",
                "attainment",
                "TTFT P99 ms",
                "ITL P99 ms",
                "per-request tok/s",
                "meets SLO",
            ] {
                ui.strong(h);
            }
            ui.end_row();
            for r in runs {
                let m = &r.measured;
                ui.label(format!("#{}", r.candidate));
                ui.label(r.rung.to_string());
                ui.label(r.knobs.label());
                if let Some(e) = &r.error {
                    ui.colored_label(ui.visuals().error_fg_color, format!("failed: {e}"));
                    ui.end_row();
                    continue;
                }
                ui.label(format!("{} / {}", m.good, m.requests));
                ui.label(format!("{:.2}", m.goodput));
                ui.label(format!("{:.0}%", m.slo_attainment * 100.0));
                ui.label(format!("{:.0}", m.ttft_p99_ms));
                ui.label(format!("{:.0}", m.itl_p99_ms));
                ui.label(fmt(m.per_request_tps_mean, 1));
                ui.label(if m.meets_slo { "yes" } else { "no" });
                ui.end_row();
            }
        });
}

/// Goodput against mean per-request TPS: every candidate at its last rung, and the frontier.
fn plot_ui(ui: &mut egui::Ui, run: &TuneRun, n: usize) {
    let last = last_runs(n, &run.runs);
    let xy = |r: &CandidateRun| -> Option<[f64; 2]> {
        let m = &r.measured;
        Some([m.per_request_tps_mean?, m.goodput])
    };
    let all: Vec<[f64; 2]> = last.iter().flatten().filter_map(|r| xy(r)).collect();
    let front: Vec<[f64; 2]> = (frontier(n, &run.runs).into_iter())
        .filter_map(|i| last[i].and_then(&xy))
        .collect();
    ui.strong(format!(
        "Goodput vs per-request TPS: {} candidates, {} on the frontier",
        all.len(),
        front.len()
    ));
    let shown = styled(Plot::new("plot_tuner"))
        .height(260.0)
        .x_axis_label("mean per-request TPS (tok/s)")
        .y_axis_label("goodput (req/s)")
        .include_x(0.0)
        .include_y(0.0)
        .legend(Legend::default().position(egui_plot::Corner::RightTop))
        .show(ui, |p| {
            p.points(Points::new("candidates", PlotPoints::from(all)).radius(3.0));
            p.line(Line::new(
                "Pareto frontier",
                PlotPoints::from(front.clone()),
            ));
            p.points(Points::new("Pareto frontier", PlotPoints::from(front)).radius(5.0));
        });
    outline(ui, shown.response.rect);
}

/// The tab. `dash_knobs` are the dashboard's knobs: Apply sets them too, so the dashboard
/// shows what runs.
pub fn ui(
    ui: &mut egui::Ui,
    s: &mut TunerSettings,
    dash_knobs: &mut Knobs,
    view: &TunerView<'_>,
    cmds: &mut Vec<Command>,
) {
    ui.heading("SLO tuner");
    let running = view.run.is_some_and(TuneRun::running);
    form_ui(ui, s, !running, view.choosing_trace, cmds);
    ui.horizontal(|ui| {
        if running {
            if ui.button("Stop tuning").clicked() {
                cmds.push(Command::StopTune);
            }
        } else {
            let ready = view.engine_knobs.is_some();
            let start = ui.add_enabled(ready, egui::Button::new("Start tuning"));
            if start.clicked() {
                cmds.push(Command::StartTune);
            }
        }
        if let Err(e) = s.config() {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
    });
    let Some(run) = view.run else {
        ui.label("No tuning run yet.");
        return;
    };
    let planned = run.planned.map_or(String::new(), |(c, n)| {
        format!(" · {c} candidates, {n} runs planned")
    });
    ui.label(format!("Workload: {}", run.workload));
    ui.label(format!(
        "Progress: {} runs measured{planned} · {}",
        run.runs.len(),
        run.phase
    ));
    match &run.outcome {
        Some(Ok(rep)) => {
            ui.label(format!("Best knobs: {}", rep.best.label()));
            ui.label(format!("Best (fresh run): {}", rep.verified.describe()));
            ui.label(format!(
                "Default (fresh run; {}): {}",
                rep.default.knobs.label(),
                rep.default.measured.describe()
            ));
            let apply = ui.add_enabled(
                view.engine_knobs.is_some() && !rep.stopped,
                egui::Button::new("Apply best knobs"),
            );
            if apply.clicked()
                && let Some(base) = view.engine_knobs
            {
                let knobs = rep
                    .best
                    .knobs(base, rep.slo.itl_p99_ms.or(rep.slo.tpot_p99_ms));
                dash_knobs.scheduler = knobs.scheduler.clone();
                dash_knobs.spec = knobs.spec.clone();
                cmds.push(Command::SetKnobs(knobs));
                if let Some(ty) = rep.best.precision.as_deref().and_then(|p| p.parse().ok()) {
                    cmds.push(Command::SetPrecision(ty));
                }
            }
        }
        Some(Err(e)) => {
            ui.colored_label(ui.visuals().error_fg_color, format!("Tuning failed: {e}"));
        }
        None => {}
    }
    let n = run.runs.iter().map(|r| r.candidate + 1).max().unwrap_or(0);
    egui::ScrollArea::vertical().show(ui, |ui| {
        plot_ui(ui, run, n);
        ui.separator();
        table_ui(ui, &run.runs);
    });
}

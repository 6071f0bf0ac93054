//! The tuning dashboard: knobs, load generator and sweep controls, live plots from a UI-owned
//! history of engine snapshots, and cost per million output tokens.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use egui_plot::{Corner, Legend, Line, Plot, PlotPoints, Points, Text, VLine};
use serde::{Deserialize, Serialize};
use tpslab_engine::engine::{EngineSnapshot, Knobs};
use tpslab_engine::metrics::cost_per_million_output_tokens;
use tpslab_engine::requant::{LIVE_TYPES, type_name};
use tpslab_engine::scheduler::Policy;

const MIB: f64 = (1u64 << 20) as f64;

use super::Command;
use super::api_server::ApiServerSettings;
use super::load::{LoadOutcome, LoadSettings, SweepPoint};

/// Dashboard settings (saved).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct DashSettings {
    /// The knobs as the user set them; sent to the engine on change and at start.
    pub knobs: Knobs,
    pub load: LoadSettings,
    /// The user's machine price, $ per hour.
    pub price_per_hour: f64,
    pub server: ApiServerSettings,
}

impl Default for DashSettings {
    fn default() -> Self {
        Self {
            knobs: Knobs::default(),
            load: LoadSettings::default(),
            price_per_hour: 1.0,
            server: ApiServerSettings::default(),
        }
    }
}

/// One sample of the live figures, taken by the UI.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds since the history started.
    pub t: f64,
    pub output_tps: f64,
    pub per_req_mean: Option<f64>,
    pub per_req_p10: Option<f64>,
    pub ttft_p50: Option<f64>,
    pub ttft_p99: Option<f64>,
    pub batch: usize,
    pub queue: usize,
    pub kv_used: usize,
    pub kv_total: usize,
    pub rss_mib: Option<f64>,
    /// Device memory in use (on a GPU).
    pub vram_mib: Option<f64>,
}

/// A knob change, drawn as a vertical line.
#[derive(Debug, Clone)]
pub struct Mark {
    pub t: f64,
    pub text: String,
}

/// The UI's own bounded history of engine snapshots (the engine keeps no plot history for us).
pub struct History {
    origin: Instant,
    last: Option<Instant>,
    pub samples: VecDeque<Sample>,
    pub marks: VecDeque<Mark>,
}

/// 10 samples a second for 10 minutes.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const MAX_SAMPLES: usize = 6000;
const MAX_MARKS: usize = 200;

impl Default for History {
    fn default() -> Self {
        Self {
            origin: Instant::now(),
            last: None,
            samples: VecDeque::new(),
            marks: VecDeque::new(),
        }
    }
}

impl History {
    pub fn now(&self) -> f64 {
        self.origin.elapsed().as_secs_f64()
    }

    /// Records `snap` if ~100 ms have passed since the last sample.
    pub fn sample(&mut self, snap: &EngineSnapshot) {
        let now = Instant::now();
        if self.last.is_some_and(|l| now - l < SAMPLE_EVERY) {
            return;
        }
        self.last = Some(now);
        let live = &snap.live;
        let step = live.latest_step.as_ref();
        let rss = step
            .and_then(|s| s.rss_bytes)
            .or_else(|| crate::mem::rss_bytes().map(|(cur, _)| cur));
        self.samples.push_back(Sample {
            t: self.now(),
            output_tps: live.output_tps,
            per_req_mean: live.per_request_tps_mean,
            per_req_p10: live.per_request_tps_p10,
            ttft_p50: live.ttft_p50_ms,
            ttft_p99: live.ttft_p99_ms,
            batch: step.map_or(0, |s| s.batch_size),
            queue: snap.waiting,
            kv_used: snap.kv_used_blocks,
            kv_total: snap.kv_total_blocks,
            rss_mib: rss.map(|b| b as f64 / (1 << 20) as f64),
            vram_mib: snap.memory.device_used.map(|b| b as f64 / (1 << 20) as f64),
        });
        while self.samples.len() > MAX_SAMPLES {
            self.samples.pop_front();
        }
    }

    pub fn mark(&mut self, text: String) {
        self.marks.push_back(Mark {
            t: self.now(),
            text,
        });
        while self.marks.len() > MAX_MARKS {
            self.marks.pop_front();
        }
    }

    fn series(&self, f: impl Fn(&Sample) -> Option<f64>) -> Vec<[f64; 2]> {
        self.samples
            .iter()
            .filter_map(|s| f(s).map(|y| [s.t, y]))
            .collect()
    }
}

/// What the dashboard shows besides its settings.
pub struct DashView<'a> {
    pub snapshot: Option<&'a EngineSnapshot>,
    pub precision: &'a str,
    /// The backend the engine reports ("CPU, 2 threads").
    pub device: &'a str,
    pub history: &'a History,
    pub load_running: Option<(&'a str, usize, bool)>,
    pub last_load: Option<&'a LoadOutcome>,
    pub sweep_running: bool,
    pub sweep_levels: &'a [usize],
    pub sweep_points: &'a [SweepPoint],
    /// A save is in progress (its dialog may be open).
    pub saving: bool,
    /// The API server's address and model while it runs.
    pub server: Option<String>,
}

/// "batch cap 64 · budget 2048 tok · 8 concurrent, prompt 128 -> output 64 tok · Q4_1 · CPU, 2
/// threads"
pub fn settings_label(knobs: &Knobs, load: &str, precision: &str, device: &str) -> String {
    format!(
        "batch cap {} · budget {} tok · {load} · {precision} · {device}",
        knobs.scheduler.max_num_seqs, knobs.scheduler.max_num_batched_tokens
    )
}

pub fn ui(ui: &mut egui::Ui, s: &mut DashSettings, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    egui::Panel::left("dash_controls")
        .resizable(true)
        .default_size(300.0)
        .show(ui, |ui| {
            egui::ScrollArea::vertical().show(ui, |ui| {
                knobs_ui(ui, s, view, cmds);
                ui.separator();
                super::api_server::settings_ui(
                    ui,
                    &mut s.server,
                    view.server.as_deref(),
                    view.snapshot.is_some(),
                    cmds,
                );
                ui.separator();
                load_ui(ui, s, view, cmds);
                ui.separator();
                cost_ui(ui, s, view);
                ui.separator();
                sweep_ui(ui, s, view, cmds);
            });
        });
    egui::CentralPanel::default().show(ui, |ui| {
        egui::ScrollArea::vertical().show(ui, |ui| plots_ui(ui, s, view));
    });
}

fn knobs_ui(ui: &mut egui::Ui, s: &mut DashSettings, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    ui.heading("Knobs");
    let before = s.knobs.clone();
    let k = &mut s.knobs.scheduler;
    let mut commit = false;
    egui::Grid::new("knobs_grid").num_columns(2).show(ui, |ui| {
        let l = ui.label("Max batch size");
        let r = ui
            .add(egui::DragValue::new(&mut k.max_num_seqs).range(1..=512))
            .labelled_by(l.id);
        commit |= r.changed() && !r.dragged();
        commit |= r.drag_stopped();
        ui.end_row();
        let l = ui.label("Token budget");
        let r = ui
            .add(
                egui::DragValue::new(&mut k.max_num_batched_tokens)
                    .range(16..=65536)
                    .speed(16),
            )
            .labelled_by(l.id);
        commit |= r.changed() && !r.dragged();
        commit |= r.drag_stopped();
        ui.end_row();
        commit |= ui
            .checkbox(&mut k.chunked_prefill, "Chunked prefill")
            .changed();
        ui.end_row();
        commit |= ui
            .checkbox(&mut k.prefix_caching, "Prefix caching")
            .changed();
        ui.end_row();
        ui.label("Policy");
        ui.horizontal(|ui| {
            commit |= ui
                .radio_value(&mut k.policy, Policy::Fcfs, "FCFS")
                .changed();
            commit |= ui
                .radio_value(&mut k.policy, Policy::Priority, "Priority")
                .changed();
        });
        ui.end_row();
    });
    precision_ui(ui, view, cmds);
    // KV settings rebuild the pool: edited freely, applied with a button.
    ui.label("KV cache (applying rebuilds the pool)");
    let kv = &mut s.knobs.kv;
    let mut mib = (kv.budget_bytes >> 20).max(1);
    egui::Grid::new("kv_grid").num_columns(2).show(ui, |ui| {
        let l = ui.label("KV budget (MiB)");
        if ui
            .add(egui::DragValue::new(&mut mib).range(1..=65536))
            .labelled_by(l.id)
            .changed()
        {
            kv.budget_bytes = mib << 20;
        }
        ui.end_row();
        let l = ui.label("Block size");
        egui::ComboBox::from_id_salt("kv_block_size")
            .selected_text(kv.block_size.to_string())
            .show_ui(ui, |ui| {
                for b in [8usize, 16, 32, 64] {
                    ui.selectable_value(&mut kv.block_size, b, b.to_string());
                }
            })
            .response
            .labelled_by(l.id);
        ui.end_row();
    });
    let engine_kv = view.snapshot.map(|sn| sn.knobs.kv.clone());
    let kv_pending = engine_kv.as_ref().is_some_and(|e| *e != s.knobs.kv);
    if ui
        .add_enabled(kv_pending, egui::Button::new("Apply KV settings"))
        .clicked()
    {
        cmds.push(Command::SetKnobs(s.knobs.clone()));
    } else if commit && s.knobs.scheduler != before.scheduler {
        // Scheduler knobs apply at once; an unapplied KV edit stays a draft.
        cmds.push(Command::SetKnobs(Knobs {
            scheduler: s.knobs.scheduler.clone(),
            kv: engine_kv.unwrap_or_else(|| s.knobs.kv.clone()),
        }));
    }
    if let Some(sn) = view.snapshot {
        ui.label(
            egui::RichText::new(format!(
                "engine: batch cap {}, budget {}, KV {} blocks × {} tok",
                sn.knobs.scheduler.max_num_seqs,
                sn.knobs.scheduler.max_num_batched_tokens,
                sn.kv_total_blocks,
                sn.knobs.kv.block_size
            ))
            .small(),
        );
    }
    if let Some(e) = view.snapshot.and_then(|sn| sn.last_error.as_ref()) {
        ui.colored_label(ui.visuals().error_fg_color, format!("Engine: {e}"));
    }
    if ui.button("Reset metrics").clicked() {
        cmds.push(Command::ResetMetrics);
    }
}

/// The weight precision knob: picking a type re-quantizes the loaded weights in memory while
/// the engine serves on (see `EngineHandle::set_precision`).
fn precision_ui(ui: &mut egui::Ui, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    let Some(sn) = view.snapshot else {
        return;
    };
    ui.horizontal(|ui| {
        let l = ui.label("Weight precision");
        let busy = sn.requantizing.is_some();
        ui.add_enabled_ui(!busy, |ui| {
            egui::ComboBox::from_id_salt("weight_precision")
                .selected_text(&sn.precision)
                .show_ui(ui, |ui| {
                    for ty in LIVE_TYPES {
                        let name = type_name(ty);
                        let chosen = sn.precision == name;
                        if ui.selectable_label(chosen, name).clicked() && !chosen {
                            cmds.push(Command::SetPrecision(name.to_string()));
                        }
                    }
                })
                .response
                .labelled_by(l.id);
        });
        if let Some(to) = &sn.requantizing {
            ui.spinner();
            ui.label(format!("re-quantizing to {to}…"));
        }
    });
    if let Some((from, to, b0, b1, secs)) = &sn.last_requant {
        ui.label(
            egui::RichText::new(format!(
                "last change {from} -> {to}: weights {:.0} -> {:.0} MiB in {secs:.1} s",
                *b0 as f64 / MIB,
                *b1 as f64 / MIB
            ))
            .small(),
        );
    }
}

/// The plot mark for a precision change the engine has made.
pub fn precision_change_text(sn: &EngineSnapshot) -> String {
    match &sn.last_requant {
        Some((from, to, b0, b1, _)) if *to == sn.precision => format!(
            "precision {from} -> {to} (weights {:.0} -> {:.0} MiB)",
            *b0 as f64 / MIB,
            *b1 as f64 / MIB
        ),
        _ => format!("precision -> {}", sn.precision),
    }
}

fn load_ui(ui: &mut egui::Ui, s: &mut DashSettings, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    ui.heading("Load generator");
    let l = &mut s.load;
    let idle = view.load_running.is_none() && !view.sweep_running;
    ui.add_enabled_ui(idle, |ui| {
        egui::Grid::new("load_grid").num_columns(2).show(ui, |ui| {
            let lb = ui.label("Concurrency");
            ui.add(egui::DragValue::new(&mut l.concurrency).range(1..=256))
                .labelled_by(lb.id);
            ui.end_row();
            let lb = ui.label("Rate (req/s, 0 = closed loop)");
            ui.add(
                egui::DragValue::new(&mut l.rate)
                    .range(0.0..=1000.0)
                    .speed(0.1),
            )
            .labelled_by(lb.id);
            ui.end_row();
            let lb = ui.label("Prompt length");
            ui.add(egui::DragValue::new(&mut l.prompt_len).range(1..=4096))
                .labelled_by(lb.id);
            ui.end_row();
            let lb = ui.label("Output length");
            ui.add(egui::DragValue::new(&mut l.output_len).range(1..=4096))
                .labelled_by(lb.id);
            ui.end_row();
        });
        // Folded by default: most runs need no objectives, and the panel stays short.
        egui::CollapsingHeader::new("Goodput objectives").show(ui, |ui| {
            slo_grid(ui, l);
        });
        super::load::remote_ui(ui, &mut l.remote);
    });
    load_controls_ui(ui, view, cmds);
}

fn slo_grid(ui: &mut egui::Ui, l: &mut LoadSettings) {
    egui::Grid::new("slo_grid").num_columns(2).show(ui, |ui| {
        let lb = ui.label("Goodput TTFT objective (ms, 0 = off)");
        ui.add(egui::DragValue::new(&mut l.slo_ttft_ms).range(0.0..=600_000.0))
            .labelled_by(lb.id);
        ui.end_row();
        let lb = ui.label("Goodput TPOT objective (ms, 0 = off)");
        ui.add(egui::DragValue::new(&mut l.slo_tpot_ms).range(0.0..=60_000.0))
            .labelled_by(lb.id);
        ui.end_row();
    });
}

/// Start / Stop, the live line and the last run's summary.
fn load_controls_ui(ui: &mut egui::Ui, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    match view.load_running {
        Some((label, done, stopping)) => {
            ui.horizontal(|ui| {
                if ui
                    .add_enabled(!stopping, egui::Button::new("Stop load"))
                    .clicked()
                {
                    cmds.push(Command::StopLoad);
                }
                ui.spinner();
            });
            let what = if stopping { "stopping" } else { "running" };
            ui.label(format!("Load {what}: {label}; {done} requests done"));
        }
        None => {
            let can = view.snapshot.is_some() && !view.sweep_running;
            if ui
                .add_enabled(can, egui::Button::new("Start load"))
                .clicked()
            {
                cmds.push(Command::StartLoad);
            }
        }
    }
    if let Some(sn) = view.snapshot {
        let live = &sn.live;
        ui.label(format!(
            "Live: {:.1} tok/s aggregate · per request {} · {} running, {} waiting",
            live.output_tps,
            fmt_opt(live.per_request_tps_mean, "tok/s"),
            sn.running,
            sn.waiting
        ));
    }
    if let Some(o) = view.last_load {
        let sm = &o.summary;
        ui.label(format!(
            "Last load ({}): {} requests in {:.1} s, {:.1} tok/s aggregate, per request mean {} / P10 {}, TTFT P50 {:.0} ms; {} aborted, {} refused",
            o.label,
            sm.completed,
            sm.duration,
            sm.output_throughput,
            fmt_opt(sm.mean_per_request_tps, "tok/s"),
            fmt_opt(sm.p10_per_request_tps, "tok/s"),
            sm.median_ttft_ms,
            o.aborted,
            o.refused
        ));
        if let Some(g) = sm.request_goodput {
            ui.label(format!(
                "Goodput: {g:.2} req/s of {:.2} req/s met the objectives",
                sm.request_throughput
            ));
        }
    }
}

fn fmt_opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "–".to_string(), |v| format!("{v:.1} {unit}"))
}

fn cost_ui(ui: &mut egui::Ui, s: &mut DashSettings, view: &DashView<'_>) {
    ui.heading("Cost");
    ui.horizontal(|ui| {
        let l = ui.label("Price per hour ($)");
        ui.add(
            egui::DragValue::new(&mut s.price_per_hour)
                .range(0.0..=10000.0)
                .speed(0.01),
        )
        .labelled_by(l.id);
    });
    let rate = view.snapshot.map_or(0.0, |sn| sn.live.output_tps);
    match cost_per_million_output_tokens(s.price_per_hour, rate) {
        Some(c) => ui.label(format!("${c:.2} per 1M output tokens at {rate:.1} tok/s")),
        None => ui.label("Cost per 1M output tokens: – (nothing generated in the window)"),
    };
}

fn sweep_ui(ui: &mut egui::Ui, s: &mut DashSettings, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    ui.heading("Sweep");
    let l = &mut s.load;
    let idle = view.load_running.is_none() && !view.sweep_running;
    ui.add_enabled_ui(idle, |ui| {
        egui::Grid::new("sweep_grid").num_columns(2).show(ui, |ui| {
            let lb = ui.label("Max concurrency");
            ui.add(egui::DragValue::new(&mut l.sweep_max).range(1..=256))
                .labelled_by(lb.id);
            ui.end_row();
            let lb = ui.label("Requests per slot");
            ui.add(egui::DragValue::new(&mut l.sweep_requests_per_slot).range(1..=32))
                .labelled_by(lb.id);
            ui.end_row();
        });
    });
    if view.sweep_running {
        ui.horizontal(|ui| {
            if ui.button("Stop sweep").clicked() {
                cmds.push(Command::StopSweep);
            }
            ui.spinner();
            ui.label(format!(
                "level {} of {}",
                (view.sweep_points.len() + 1).min(view.sweep_levels.len()),
                view.sweep_levels.len()
            ));
        });
    } else if ui
        .add_enabled(
            idle && view.snapshot.is_some(),
            egui::Button::new("Run sweep"),
        )
        .clicked()
    {
        cmds.push(Command::StartSweep);
    }
    ui.horizontal(|ui| {
        let lb = ui.label("Default save path").on_hover_text(
            "Where the dialog starts, and where the sweep goes when no dialog can open",
        );
        ui.text_edit_singleline(&mut l.sweep_path)
            .labelled_by(lb.id);
    });
    ui.horizontal(|ui| {
        if ui
            .add_enabled(
                !view.sweep_points.is_empty() && !view.saving,
                egui::Button::new("Save JSON + CSV + PNG"),
            )
            .on_hover_text("Asks where; the three files go side by side")
            .clicked()
        {
            cmds.push(Command::SaveSweep);
        }
        if view.saving {
            ui.spinner();
        }
    });
    for p in view.sweep_points {
        ui.label(format!(
            "c={}: {:.1} tok/s aggregate, {} per request (P10 {})",
            p.concurrency,
            p.output_throughput,
            fmt_opt(p.mean_per_request_tps, "tok/s"),
            fmt_opt(p.p10_per_request_tps, "tok/s")
        ));
    }
}

/// Knob changes as unnamed vertical lines (a named line would join the legend, one entry per
/// change), each with its text at the foot of the line.
fn marks(plot_ui: &mut egui_plot::PlotUi<'_>, history: &History) {
    for m in &history.marks {
        plot_ui.vline(VLine::new("", m.t).color(egui::Color32::GRAY));
        plot_ui.text(
            Text::new("", egui_plot::PlotPoint::new(m.t, 0.0), m.text.as_str())
                .color(egui::Color32::GRAY)
                .anchor(egui::Align2::LEFT_BOTTOM),
        );
    }
}

/// Height of one legend row and the legend's padding, in points (small text).
const LEGEND_ROW: f32 = 15.0;
const LEGEND_PAD: f32 = 12.0;

/// A time plot whose legend sits in its top-left corner above the curves: the y range is
/// stretched so the highest point stays below the band the legend's `entries` rows take.
fn plot_with_legend<'a>(id: &str, height: f32, entries: usize, y_max: f64) -> Plot<'a> {
    let band = ((entries as f32 * LEGEND_ROW + LEGEND_PAD) / height).clamp(0.0, 0.6);
    let mut plot = Plot::new(id)
        .height(height)
        .legend(
            Legend::default()
                .position(Corner::LeftTop)
                .text_style(egui::TextStyle::Small)
                .follow_insertion_order(true),
        )
        .include_y(0.0);
    if y_max > 0.0 {
        plot = plot.include_y(y_max / f64::from(1.0 - band));
    }
    plot
}

/// The largest y over `series`.
fn y_max(series: &[&[[f64; 2]]]) -> f64 {
    series
        .iter()
        .flat_map(|s| s.iter().map(|p| p[1]))
        .fold(0.0, f64::max)
}

fn plots_ui(ui: &mut egui::Ui, s: &DashSettings, view: &DashView<'_>) {
    let h = view.history;
    let knobs = view.snapshot.map_or(&s.knobs, |sn| &sn.knobs);
    let load = view
        .load_running
        .map_or("no load generator", |(label, _, _)| label);
    let label = settings_label(knobs, load, view.precision, view.device);
    let height = 170.0;
    ui.label(egui::RichText::new(format!("Taken under: {label}")).small());
    if let Some(last) = h.marks.back() {
        ui.label(
            egui::RichText::new(format!("Last change: {}", last.text))
                .small()
                .weak(),
        );
    }

    ui.strong(format!("Tokens per second — {label}"));
    let agg = h.series(|s| Some(s.output_tps));
    let mean = h.series(|s| s.per_req_mean);
    let p10 = h.series(|s| s.per_req_p10);
    plot_with_legend("plot_tps", height, 3, y_max(&[&agg, &mean, &p10]))
        .y_axis_label("tok/s")
        .show(ui, |p| {
            p.line(Line::new("aggregate output TPS", PlotPoints::from(agg)));
            p.line(Line::new("per-request TPS (mean)", PlotPoints::from(mean)));
            p.line(Line::new("per-request TPS (P10)", PlotPoints::from(p10)));
            marks(p, h);
        });

    ui.strong(format!("Time to first token — {label}"));
    let p50 = h.series(|s| s.ttft_p50);
    let p99 = h.series(|s| s.ttft_p99);
    plot_with_legend("plot_ttft", height, 2, y_max(&[&p50, &p99]))
        .y_axis_label("ms")
        .show(ui, |p| {
            p.line(Line::new("TTFT P50", PlotPoints::from(p50)));
            p.line(Line::new("TTFT P99", PlotPoints::from(p99)));
            marks(p, h);
        });

    ui.strong(format!("Batch size and queue depth — {label}"));
    let batch = h.series(|s| Some(s.batch as f64));
    let queue = h.series(|s| Some(s.queue as f64));
    plot_with_legend("plot_batch", height, 2, y_max(&[&batch, &queue])).show(ui, |p| {
        p.line(Line::new("batch size", PlotPoints::from(batch)));
        p.line(Line::new("queue depth", PlotPoints::from(queue)));
        marks(p, h);
    });

    memory_plot_ui(ui, h, &label, height);

    if !view.sweep_points.is_empty() {
        sweep_plot_ui(ui, view.sweep_points, 260.0);
    }
}

/// KV blocks and memory: process RSS, and on a GPU the device's memory in use (the title says
/// which memory is drawn).
fn memory_plot_ui(ui: &mut egui::Ui, h: &History, label: &str, height: f32) {
    let vram = h.series(|s| s.vram_mib);
    let memory = if vram.is_empty() {
        "process RSS (MiB)"
    } else {
        "process RSS and VRAM used (MiB)"
    };
    ui.strong(format!("KV blocks and memory: {memory} — {label}"));
    let used = h.series(|s| Some(s.kv_used as f64));
    let total = h.series(|s| Some(s.kv_total as f64));
    let rss = h.series(|s| s.rss_mib);
    let entries = if vram.is_empty() { 3 } else { 4 };
    let top = y_max(&[&used, &total, &rss, &vram]);
    plot_with_legend("plot_kv", height, entries, top)
        .y_axis_label("blocks / MiB")
        .show(ui, |p| {
            p.line(Line::new("KV blocks used", PlotPoints::from(used)));
            p.line(Line::new("KV blocks total", PlotPoints::from(total)));
            p.line(Line::new("process RSS (MiB)", PlotPoints::from(rss)));
            if !vram.is_empty() {
                p.line(Line::new("VRAM used (MiB)", PlotPoints::from(vram)));
            }
            marks(p, h);
        });
}

/// "batch cap 64 · prompt 128 -> output 64 tok · Q4_1 · CPU, 2 threads": the settings a sweep ran
/// under (its first level's; they don't change during a sweep).
pub fn sweep_settings(points: &[SweepPoint]) -> String {
    points.first().map_or_else(String::new, point_settings)
}

/// The settings label of one sweep point.
fn point_settings(p: &SweepPoint) -> String {
    let mut s = String::new();
    if p.max_batch > 0 {
        s.push_str(&format!("batch cap {} · ", p.max_batch));
    }
    s.push_str(&format!(
        "prompt {} -> output {} tok · {}",
        p.prompt_len, p.output_len, p.precision
    ));
    if !p.device.is_empty() {
        s.push_str(&format!(" · {}", p.device));
    }
    s
}

/// The sweep's points by target (the engine's device, or a remote server), in first-seen order.
fn by_target(points: &[SweepPoint]) -> Vec<(&str, Vec<&SweepPoint>)> {
    let mut groups: Vec<(&str, Vec<&SweepPoint>)> = Vec::new();
    for p in points {
        match groups.iter_mut().find(|(d, _)| *d == p.device) {
            Some((_, g)) => g.push(p),
            None => groups.push((&p.device, vec![p])),
        }
    }
    groups
}

/// The trade-off plot (also drawn into the saved PNG, see [`super::plot_png`]): one curve per
/// target, so this engine and a remote server compare side by side.
pub(super) fn sweep_plot_ui(ui: &mut egui::Ui, points: &[SweepPoint], height: f32) {
    let groups = by_target(points);
    ui.strong(format!(
        "Sweep: aggregate vs per-request TPS, one point per concurrency level — {}",
        groups
            .iter()
            .map(|(_, g)| point_settings(g[0]))
            .collect::<Vec<_>>()
            .join("  vs  ")
    ));
    Plot::new("plot_sweep")
        .height(height)
        .x_axis_label("per-request TPS, mean (tok/s)")
        .y_axis_label("aggregate TPS (tok/s)")
        .include_y(0.0)
        .include_x(0.0)
        .legend(Legend::default().position(Corner::RightTop))
        .show(ui, |p| {
            for (device, g) in &groups {
                let xy: Vec<[f64; 2]> = g
                    .iter()
                    .filter_map(|p| p.mean_per_request_tps.map(|x| [x, p.output_throughput]))
                    .collect();
                let name = if device.is_empty() {
                    "trade-off"
                } else {
                    device
                };
                p.line(Line::new(name, PlotPoints::from(xy.clone())));
                p.points(Points::new(name, PlotPoints::from(xy)).radius(4.0));
            }
            for pt in points {
                if let Some(x) = pt.mean_per_request_tps {
                    p.text(
                        Text::new(
                            format!("c={}", pt.concurrency),
                            egui_plot::PlotPoint::new(x, pt.output_throughput),
                            format!("  c={}", pt.concurrency),
                        )
                        .anchor(egui::Align2::LEFT_BOTTOM),
                    );
                }
            }
        });
}

//! The tuning dashboard: knobs, load generator and sweep controls, cost per million output
//! tokens, and the live plots beside them ([`crate::ui::plots`]).

use serde::{Deserialize, Serialize};
use tpslab_engine::library::entry::ModelEntry;
use tpslab_engine::model::config::ModelConfig;
use tpslab_engine::sched::Policy;
use tpslab_engine::serving::engine::{EngineSnapshot, Knobs};
use tpslab_engine::serving::metrics::cost_per_million_output_tokens;
use tpslab_engine::serving::requant::LIVE_TYPES;

const MIB: f64 = (1u64 << 20) as f64;

use super::api_server::ApiServerSettings;
use crate::ui::command::Command;
use crate::ui::load::{LoadOutcome, LoadSettings, RemoteSettings, SweepPoint};
use crate::ui::plots::History;

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
    /// The library's models (draft model choices).
    pub models: &'a [ModelEntry],
    /// The loaded model's configuration (what a KV budget holds of it).
    pub model_cfg: Option<&'a ModelConfig>,
    /// The KV quality run (what the drafted KV types cost against f16 KV).
    pub kv_quality: &'a super::kv_knobs::KvQuality,
}

/// "batch cap 64 · budget 2048 tok · 8 concurrent, prompt 128 -> output 64 tok · Q4_1 · CPU, 2
/// threads"
pub fn settings_label(knobs: &Knobs, load: &str, precision: &str, device: &str) -> String {
    let spec = match knobs.spec.method {
        tpslab_engine::spec::SpecMethod::Off => String::new(),
        m => format!(" · spec {m} k={}", knobs.spec.num_tokens),
    };
    format!(
        "batch cap {} · budget {} tok · {load} · {precision} · {device}{spec}",
        knobs.scheduler.max_num_seqs, knobs.scheduler.max_num_batched_tokens
    )
}

pub fn ui(ui: &mut egui::Ui, s: &mut DashSettings, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    crate::ui::renderer::panel(egui::Panel::left("dash_controls"), ui)
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
    crate::ui::renderer::central_panel(ui).show(ui, |ui| {
        let knobs = view.snapshot.map_or(&s.knobs, |sn| &sn.knobs);
        let sweep = view.sweep_running.then(|| {
            format!(
                "sweep to {} concurrent, prompt {} -> output {} tok",
                view.sweep_levels.last().copied().unwrap_or(1),
                s.load.prompt_len,
                s.load.output_len
            )
        });
        let load = match (view.load_running, &sweep) {
            (Some((label, _, _)), _) => label,
            (None, Some(sweep)) => sweep,
            (None, None) => "no load generator",
        };
        let label = settings_label(knobs, load, view.precision, view.device);
        egui::ScrollArea::vertical().show(ui, |ui| {
            super::dashboard_plots::plots_ui(ui, view.history, &label, view.sweep_points);
        });
    });
}

/// The scheduling policy's radio buttons; true when it changed.
fn policy_ui(ui: &mut egui::Ui, policy: &mut Policy) -> bool {
    let fcfs = "First come, first served: a chat sent during a load test waits for a free batch \
                slot.";
    let priority = "Chats go first: the load generator's requests queue behind them and give up \
                    a batch slot to one (it is recomputed later).";
    let a = ui
        .radio_value(policy, Policy::Fcfs, "FCFS")
        .on_hover_text(fcfs);
    let b = ui
        .radio_value(policy, Policy::Priority, "Priority")
        .on_hover_text(priority);
    a.changed() || b.changed()
}

/// A labelled number in a grid row: whether its value is to be applied (typed in, or a drag
/// ended; not on every frame of a drag).
fn drag_knob(ui: &mut egui::Ui, label: &str, enabled: bool, value: egui::DragValue<'_>) -> bool {
    let l = ui.label(label);
    let r = ui.add_enabled(enabled, value).labelled_by(l.id);
    ui.end_row();
    (r.changed() && !r.dragged()) || r.drag_stopped()
}

fn knobs_ui(ui: &mut egui::Ui, s: &mut DashSettings, view: &DashView<'_>, cmds: &mut Vec<Command>) {
    ui.heading("Knobs");
    let before = s.knobs.clone();
    let k = &mut s.knobs.scheduler;
    let mut commit = false;
    egui::Grid::new("knobs_grid").num_columns(2).show(ui, |ui| {
        let seqs = egui::DragValue::new(&mut k.max_num_seqs).range(1..=512);
        commit |= drag_knob(ui, "Max batch size", true, seqs);
        let budget = egui::DragValue::new(&mut k.max_num_batched_tokens)
            .range(16..=65536)
            .speed(16);
        commit |= drag_knob(ui, "Token budget", true, budget);
        commit |= ui
            .checkbox(&mut k.chunked_prefill, "Chunked prefill")
            .changed();
        ui.end_row();
        commit |= ui
            .checkbox(&mut k.prefix_caching, "Prefix caching")
            .changed();
        ui.end_row();
        // The adaptive budget shrinks prefill chunks so decodes keep their ITL under the target.
        commit |= ui
            .checkbox(&mut k.adaptive_budget, "Adaptive token budget")
            .changed();
        ui.end_row();
        let itl = egui::DragValue::new(&mut k.itl_target_ms).range(1..=10_000);
        commit |= drag_knob(ui, "ITL target (ms)", k.adaptive_budget, itl);
        ui.label("Policy");
        commit |= ui.horizontal(|ui| policy_ui(ui, &mut k.policy)).inner;
        ui.end_row();
    });
    let spec_view = super::spec_knobs::SpecView {
        snapshot: view.snapshot,
        models: view.models,
    };
    commit |= super::spec_knobs::spec_ui(ui, &mut s.knobs.spec, &spec_view, cmds);
    precision_ui(ui, view, cmds);
    // KV settings rebuild the pool: edited freely, applied with a button.
    ui.label("KV cache (applying rebuilds the pool)");
    super::kv_knobs::kv_grid(ui, &mut s.knobs.kv);
    if let Some(cfg) = view.model_cfg {
        let request = s.load.prompt_len + s.load.output_len;
        let text = super::kv_knobs::capacity_text(&s.knobs.kv, cfg, request);
        ui.label(egui::RichText::new(text).small());
    }
    let loaded = view.model_cfg.is_some();
    view.kv_quality.ui(ui, s.knobs.kv.types, loaded, cmds);
    let engine_kv = view.snapshot.map(|sn| sn.knobs.kv.clone());
    let kv_pending = engine_kv.as_ref().is_some_and(|e| *e != s.knobs.kv);
    if ui
        .add_enabled(kv_pending, egui::Button::new("Apply KV settings"))
        .clicked()
    {
        cmds.push(Command::SetKnobs(s.knobs.clone()));
    } else if commit && (s.knobs.scheduler != before.scheduler || s.knobs.spec != before.spec) {
        // Scheduler and speculation knobs apply at once; an unapplied KV edit stays a draft.
        cmds.push(Command::SetKnobs(Knobs {
            scheduler: s.knobs.scheduler.clone(),
            kv: engine_kv.unwrap_or_else(|| s.knobs.kv.clone()),
            spec: s.knobs.spec.clone(),
        }));
    }
    if let Some(sn) = view.snapshot {
        ui.label(
            egui::RichText::new(format!(
                "engine: batch cap {}, budget {}, KV {} blocks × {} tok, {}",
                sn.knobs.scheduler.max_num_seqs,
                sn.knobs.scheduler.max_num_batched_tokens,
                sn.kv_total_blocks,
                sn.knobs.kv.block_size,
                sn.knobs.kv.types
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
            let current = sn.precision.map_or_else(String::new, |p| p.to_string());
            egui::ComboBox::from_id_salt("weight_precision")
                .selected_text(current)
                // Every type in view at once: fifteen rows overflow the default height, and a
                // row scrolled out of the list cannot be picked without scrolling.
                .height(f32::INFINITY)
                .show_ui(ui, |ui| {
                    for ty in LIVE_TYPES {
                        // The matrices' type (fallbacks aside): picking it would change nothing.
                        let chosen = sn.precision.is_some_and(|p| p.main == ty);
                        if ui.selectable_label(chosen, ty.name()).clicked() && !chosen {
                            cmds.push(Command::SetPrecision(ty));
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

/// "batch cap 64 -> 8, prefix caching off" for the plot markers.
pub fn describe_knob_change(old: &Knobs, new: &Knobs) -> String {
    let (o, n) = (&old.scheduler, &new.scheduler);
    let mut parts = Vec::new();
    if o.max_num_seqs != n.max_num_seqs {
        parts.push(format!(
            "batch cap {} -> {}",
            o.max_num_seqs, n.max_num_seqs
        ));
    }
    if o.max_num_batched_tokens != n.max_num_batched_tokens {
        parts.push(format!(
            "token budget {} -> {}",
            o.max_num_batched_tokens, n.max_num_batched_tokens
        ));
    }
    let onoff = |b: bool| if b { "on" } else { "off" };
    if o.chunked_prefill != n.chunked_prefill {
        parts.push(format!("chunked prefill {}", onoff(n.chunked_prefill)));
    }
    if o.prefix_caching != n.prefix_caching {
        parts.push(format!("prefix caching {}", onoff(n.prefix_caching)));
    }
    if o.policy != n.policy {
        parts.push(format!("policy {:?}", n.policy));
    }
    if (o.adaptive_budget, o.itl_target_ms) != (n.adaptive_budget, n.itl_target_ms) {
        parts.push(match n.adaptive_budget {
            true => format!("adaptive budget on (ITL {} ms)", n.itl_target_ms),
            false => "adaptive budget off".into(),
        });
    }
    if old.kv != new.kv {
        parts.push(format!(
            "KV {} MiB × {} tok blocks, {}",
            new.kv.budget_bytes >> 20,
            new.kv.block_size,
            new.kv.types
        ));
    }
    if parts.is_empty() {
        "knobs re-applied".into()
    } else {
        parts.join(", ")
    }
}

/// The plot mark for a precision change the engine has made.
pub fn precision_change_text(sn: &EngineSnapshot) -> String {
    match &sn.last_requant {
        Some((from, to, b0, b1, _)) if Some(*to) == sn.precision => format!(
            "precision {from} -> {to} (weights {:.0} -> {:.0} MiB)",
            *b0 as f64 / MIB,
            *b1 as f64 / MIB
        ),
        _ => format!(
            "precision -> {}",
            sn.precision.map_or_else(String::new, |p| p.to_string())
        ),
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
        remote_ui(ui, &mut l.remote);
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

/// The load generator's target: this engine, or a remote OpenAI-compatible server (vLLM, SGLang,
/// TGI, llama.cpp's server, `tpslab serve`), measured on the client side.
fn remote_ui(ui: &mut egui::Ui, r: &mut RemoteSettings) {
    ui.horizontal(|ui| {
        ui.label("Target");
        ui.radio_value(&mut r.enabled, false, "This engine");
        ui.radio_value(&mut r.enabled, true, "Remote endpoint");
    });
    if !r.enabled {
        return;
    }
    egui::Grid::new("remote_grid")
        .num_columns(2)
        .show(ui, |ui| {
            let lb = ui.label("Endpoint URL");
            ui.add(egui::TextEdit::singleline(&mut r.url).hint_text("http://127.0.0.1:8000"))
                .labelled_by(lb.id);
            ui.end_row();
            let lb = ui.label("Served model");
            ui.add(egui::TextEdit::singleline(&mut r.model).hint_text("first listed"))
                .labelled_by(lb.id);
            ui.end_row();
            let lb = ui.label("Endpoint API key");
            ui.add(egui::TextEdit::singleline(&mut r.api_key).password(true))
                .labelled_by(lb.id);
            ui.end_row();
        });
    ui.label(
        egui::RichText::new(
            "Timed on this side as vLLM's benchmark does; the live plots stay on this engine, \
             the summary and the sweep show the remote figures.",
        )
        .small(),
    );
}

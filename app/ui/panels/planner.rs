//! The capacity planner in the window: a model shape (a known architecture, or the loaded
//! model), precisions, devices, a split over GPUs (tensor parallelism, pipeline stages) and a
//! workload; each device's prediction source with its error
//! against measured runs, the table of predictions (as `tpslab plan` prints it) and their
//! trade-off plot (per-request against aggregate TPS, one curve per device and precision, one
//! point per concurrency). Predictions are closed-form, so they are remade every frame. Above
//! them, the device table's row: where it came from, and buttons to open a table file,
//! calibrate this CPU's row on the window's engine, and save the table ([`TableAction`], carried
//! out by the app on workers).

use egui_plot::{Legend, Line, Plot, PlotPoint, PlotPoints, Points, Text};
use serde::{Deserialize, Serialize};
use tpslab_engine::model::synthetic::known_archs;
use tpslab_engine::plan::{
    DeviceTable, ModelShape, Parallel, PlanGrid, Prediction, plan_grid, source,
};
use tpslab_engine::quant::preset::weight_type;
use tpslab_kernels::WType;

use crate::ui::plots::{nice_grid, outline, styled};

/// The model choice that means the model the engine runs.
pub const LOADED: &str = "loaded model";

/// The planner's settings (saved).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct PlannerSettings {
    /// A known architecture's name, or [`LOADED`].
    pub model: String,
    /// Weight type names ("F16", "Q4_K").
    pub precisions: Vec<String>,
    /// Device ids of the table.
    pub devices: Vec<String>,
    /// Concurrency levels, comma separated.
    pub concurrency: String,
    pub prompt_len: usize,
    pub output_len: usize,
    pub token_budget: usize,
    /// Tensor-parallel GPUs and pipeline stages of every device's rows (1 and 1: one GPU).
    pub tp: usize,
    pub pp: usize,
}

impl Default for PlannerSettings {
    fn default() -> Self {
        Self {
            model: "llama-3-8b".into(),
            precisions: vec!["F16".into(), "Q4_K".into()],
            devices: vec!["h200".into(), "h100".into(), "l40s".into()],
            concurrency: "1,16,64,256".into(),
            prompt_len: 128,
            output_len: 128,
            token_budget: 8192,
            tp: 1,
            pp: 1,
        }
    }
}

/// The precisions offered (the CUDA backend's and the common CPU ones).
const PRECISIONS: [WType; 5] = [WType::F16, WType::Q8_0, WType::Q6K, WType::Q4K, WType::Q4_1];

/// What the planner needs from the app.
pub struct PlannerView<'a> {
    pub table: Result<&'a DeviceTable, &'a str>,
    /// The loaded model's shape, once one is loaded.
    pub loaded: Option<&'a ModelShape>,
    /// Where the table came from ("bundled", a file, "calibrated here").
    pub origin: &'a str,
    /// A job on the table in progress (its text), if any.
    pub busy: Option<String>,
    /// The last job's outcome.
    pub message: Option<&'a Result<String, String>>,
}

/// What the device table's buttons ask the app for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableAction {
    /// Open a table file (a dialog on a worker).
    Open,
    /// Measure the default model on the window's engine and refit `this-cpu`.
    Calibrate,
    StopCalibration,
    /// Save the table (for `tpslab plan --devices` and `tpslab --devices`).
    Save,
}

/// The table's row: origin, buttons, the job in progress or the last outcome.
fn table_row_ui(ui: &mut egui::Ui, view: &PlannerView<'_>) -> Option<TableAction> {
    let mut action = None;
    ui.horizontal_wrapped(|ui| {
        ui.label(format!("Device table: {}", view.origin));
        let idle = view.busy.is_none();
        if ui
            .add_enabled(idle, egui::Button::new("Open table…"))
            .clicked()
        {
            action = Some(TableAction::Open);
        }
        let calibrate = egui::Button::new("Calibrate this CPU");
        if ui
            .add_enabled(idle && view.table.is_ok(), calibrate)
            .on_hover_text(
                "Measures the default model on this window's engine at 1, 4 and 16 concurrent \
                 requests (prompt 128, output 128) and refits this-cpu's bandwidth and FLOP/s \
                 to the run at one request; the others are held out.",
            )
            .clicked()
        {
            action = Some(TableAction::Calibrate);
        }
        if ui
            .add_enabled(idle && view.table.is_ok(), egui::Button::new("Save table…"))
            .clicked()
        {
            action = Some(TableAction::Save);
        }
        if let Some(text) = &view.busy {
            ui.spinner();
            ui.label(text);
            if ui.button("Stop").clicked() {
                action = Some(TableAction::StopCalibration);
            }
        }
    });
    match view.message {
        Some(Ok(m)) => {
            ui.label(m);
        }
        Some(Err(e)) => {
            ui.colored_label(ui.visuals().error_fg_color, e);
        }
        None => {}
    }
    action
}

/// The concurrency levels of `text` ("1, 16,256"); what does not parse is skipped.
pub fn parse_levels(text: &str) -> Vec<usize> {
    (text.split(','))
        .filter_map(|s| s.trim().parse().ok())
        .filter(|&c| (1..=1 << 20).contains(&c))
        .take(64)
        .collect()
}

/// The predictions for `s` (every chosen device, precision and level, split over `s.tp` x
/// `s.pp` GPUs) and the notes under them: the engine's [`plan_grid`], as `tpslab plan` makes them.
pub fn predictions(
    table: &DeviceTable,
    shape: &ModelShape,
    s: &PlannerSettings,
) -> Result<(Vec<Prediction>, Vec<String>), String> {
    let precisions = (s.precisions.iter())
        .map(|p| weight_type(p).map_err(|e| format!("{e}")))
        .collect::<Result<Vec<_>, _>>()?;
    let split = Parallel {
        tp: s.tp.max(1),
        pp: s.pp.max(1),
        ep: 1,
    };
    split.check(shape).map_err(|e| e.to_string())?;
    let grid = PlanGrid {
        devices: &s.devices,
        splits: &[split],
        precisions: &precisions,
        concurrency: &parse_levels(&s.concurrency),
        prompt_len: s.prompt_len,
        output_len: s.output_len,
        token_budget: s.token_budget,
        engine: None,
    };
    plan_grid(table, shape, &grid).map_err(|e| e.to_string())
}

fn inputs_ui(
    ui: &mut egui::Ui,
    s: &mut PlannerSettings,
    view: &PlannerView<'_>,
    table: &DeviceTable,
) {
    egui::Grid::new("planner_grid")
        .num_columns(2)
        .show(ui, |ui| {
            let l = ui.label("Model shape");
            egui::ComboBox::from_id_salt("planner_model")
                .selected_text(s.model.clone())
                .show_ui(ui, |ui| {
                    if view.loaded.is_some() {
                        ui.selectable_value(&mut s.model, LOADED.to_string(), LOADED);
                    }
                    for a in known_archs() {
                        ui.selectable_value(&mut s.model, a.to_string(), a);
                    }
                })
                .response
                .labelled_by(l.id);
            ui.end_row();
            for (name, v, max) in [
                ("Prompt length", &mut s.prompt_len, 1 << 20),
                ("Output length", &mut s.output_len, 1 << 20),
                ("Token budget", &mut s.token_budget, 1 << 20),
            ] {
                let l = ui.label(name);
                ui.add(egui::DragValue::new(v).range(1..=max))
                    .labelled_by(l.id);
                ui.end_row();
            }
            let l = ui.label("Concurrency levels");
            ui.text_edit_singleline(&mut s.concurrency)
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Tensor parallel (GPUs)");
            egui::ComboBox::from_id_salt("planner_tp")
                .selected_text(s.tp.to_string())
                .show_ui(ui, |ui| {
                    for tp in [1usize, 2, 4, 8] {
                        ui.selectable_value(&mut s.tp, tp, tp.to_string());
                    }
                })
                .response
                .labelled_by(l.id);
            ui.end_row();
            let l = ui.label("Pipeline stages");
            ui.add(egui::DragValue::new(&mut s.pp).range(1..=8))
                .labelled_by(l.id);
            ui.end_row();
        });
    ui.horizontal_wrapped(|ui| {
        ui.label("Precisions:");
        for ty in PRECISIONS {
            toggle(ui, &mut s.precisions, ty.name());
        }
    });
    ui.horizontal_wrapped(|ui| {
        ui.label("Devices:");
        for id in table.ids() {
            toggle(ui, &mut s.devices, id);
        }
    });
}

/// A checkbox for whether `list` holds `name`.
fn toggle(ui: &mut egui::Ui, list: &mut Vec<String>, name: &str) {
    let mut on = list.iter().any(|n| n == name);
    if ui.checkbox(&mut on, name).changed() {
        list.retain(|n| n != name);
        if on {
            list.push(name.to_string());
        }
    }
}

fn sources_ui(ui: &mut egui::Ui, table: &DeviceTable, s: &PlannerSettings) {
    ui.strong("Prediction sources (error: |predicted - measured| / measured)");
    for id in &s.devices {
        let text = match table.device(id).and_then(|d| source(table, d)) {
            Ok(src) => src.text,
            Err(e) => e.to_string(),
        };
        ui.label(egui::RichText::new(text).small());
    }
}

fn fmt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".into(), |v| format!("{v:.digits$}"))
}

fn table_ui(ui: &mut egui::Ui, rows: &[Prediction]) {
    egui::Grid::new("planner_rows")
        .striped(true)
        .num_columns(8)
        .show(ui, |ui| {
            for h in [
                "device",
                "precision",
                "concurrency",
                "per-request tok/s",
                "aggregate tok/s",
                "TTFT ms",
                "max concurrency",
                "$ / M tok",
            ] {
                ui.strong(h);
            }
            ui.end_row();
            for r in rows {
                ui.label(device_label(r));
                ui.label(&r.precision);
                ui.label(r.concurrency.to_string());
                ui.label(fmt(r.per_request_tps, 1));
                ui.label(fmt(r.aggregate_tps, 0));
                ui.label(fmt(r.ttft_ms, 0));
                let cap = if r.kv_limited {
                    format!("{} (KV-limited)", r.max_concurrency)
                } else {
                    r.max_concurrency.to_string()
                };
                ui.label(cap);
                ui.label(fmt(r.usd_per_million_tokens, 3));
                ui.end_row();
            }
        });
}

/// "h100" for one GPU, "4 x h100 TP4" for a split.
fn device_label(r: &Prediction) -> String {
    match r.gpus {
        1 => r.device.clone(),
        n => format!("{n} x {} {}", r.device, r.parallel.label()),
    }
}

/// Per-request against aggregate TPS: one curve per (device, precision).
fn plot_ui(ui: &mut egui::Ui, rows: &[Prediction]) {
    let mut curves: Vec<(String, Vec<&Prediction>)> = Vec::new();
    for r in rows.iter().filter(|r| r.aggregate_tps.is_some()) {
        let name = format!("{} {}", device_label(r), r.precision);
        match curves.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => c.push(r),
            None => curves.push((name, vec![r])),
        }
    }
    ui.strong("Predicted trade-off: per-request vs aggregate TPS, one point per concurrency");
    let shown = styled(Plot::new("plot_planner"))
        .height(280.0)
        .y_grid_spacer(nice_grid)
        .x_axis_label("per-request TPS (tok/s)")
        .y_axis_label("aggregate TPS (tok/s)")
        .include_x(0.0)
        .include_y(0.0)
        .legend(Legend::default().position(egui_plot::Corner::RightTop))
        .show(ui, |p| {
            for (name, c) in &curves {
                let xy: Vec<[f64; 2]> = (c.iter())
                    .filter_map(|r| Some([r.per_request_tps?, r.aggregate_tps?]))
                    .collect();
                p.line(Line::new(name.as_str(), PlotPoints::from(xy.clone())));
                p.points(Points::new(name.as_str(), PlotPoints::from(xy.clone())).radius(3.0));
                for (r, at) in c.iter().zip(&xy) {
                    p.text(
                        Text::new(
                            "",
                            PlotPoint::new(at[0], at[1]),
                            format!(" c={}", r.concurrency),
                        )
                        .anchor(egui::Align2::LEFT_BOTTOM),
                    );
                }
            }
        });
    outline(ui, shown.response.rect);
}

/// The tab; returns what the device table's buttons asked for.
pub fn ui(
    ui: &mut egui::Ui,
    s: &mut PlannerSettings,
    view: &PlannerView<'_>,
) -> Option<TableAction> {
    ui.heading("Capacity planner");
    let action = table_row_ui(ui, view);
    let table = match view.table {
        Ok(t) => t,
        Err(e) => {
            ui.colored_label(ui.visuals().error_fg_color, format!("Device table: {e}"));
            return action;
        }
    };
    inputs_ui(ui, s, view, table);
    let shape = if s.model == LOADED {
        view.loaded
            .cloned()
            .ok_or_else(|| "no model loaded yet".to_string())
    } else {
        ModelShape::synthetic(&s.model).map_err(|e| e.to_string())
    };
    let rows = shape.and_then(|shape| predictions(table, &shape, s).map(|rows| (shape, rows)));
    match rows {
        Ok((shape, (rows, notes))) => {
            let split = Parallel {
                tp: s.tp.max(1),
                pp: s.pp.max(1),
                ep: 1,
            };
            let split = match split.gpus() {
                1 => "one GPU".to_string(),
                n => format!("{} ({n} GPUs each)", split.label()),
            };
            ui.label(format!(
                "Planned for: {} · prompt {} -> output {} tok · token budget {} · {split}",
                shape.name, s.prompt_len, s.output_len, s.token_budget
            ));
            sources_ui(ui, table, s);
            for n in &notes {
                ui.label(egui::RichText::new(n).small());
            }
            egui::ScrollArea::vertical().show(ui, |ui| {
                table_ui(ui, &rows);
                ui.separator();
                plot_ui(ui, &rows);
            });
        }
        Err(e) => {
            ui.colored_label(ui.visuals().error_fg_color, format!("Planner: {e}"));
        }
    }
    action
}

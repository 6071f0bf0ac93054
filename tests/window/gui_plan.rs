//! The dashboard's trade-off view, its speculation plots and the capacity planner, driven by
//! their labels (AccessKit) with egui_kittest: no GPU, no display. The trade-off view is fed a plot history as the engine
//! would fill it; the planner runs on the bundled device table, on a saved one, and on one it
//! opened through the dialog seam and calibrated on the window's engine with the real default
//! model (waits are bounded loops of frames, never timing checks).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::gui_wait;
use crate::temp_dir;

use std::sync::Arc;

use gui_wait::wait_until;
use temp_dir::TempDir;
use tpslab::ui::files::{DialogAnswer, FixedDialog};

use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use tpslab::ui::panels::dashboard_plots::plots_ui;
use tpslab::ui::panels::planner::{self, PlannerSettings, PlannerView};
use tpslab::ui::plots::{History, Sample};
use tpslab::ui::{AppOptions, AppState, TpsApp};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::plan::{DeviceTable, ModelShape, Parallel, Workload, predict, predict_parallel};
use tpslab_kernels::WType;

const LABEL: &str = "batch cap 64 · budget 2048 tok · 4 concurrent, prompt 128 -> output 128 tok · Q4_1 · CPU, 2 threads";

fn sample(t: f64, batch: usize, per_req: f64, aggregate: f64) -> Sample {
    Sample {
        t,
        output_tps: aggregate,
        per_req_mean: Some(per_req),
        per_req_p10: Some(per_req * 0.9),
        ttft_p50: Some(300.0),
        ttft_p99: Some(910.0),
        itl_p50: Some(8.0),
        itl_p99: Some(19.6),
        batch,
        queue: 0,
        kv_used: 10,
        kv_total: 100,
        rss_mib: Some(150.0),
        vram_mib: None,
        expert_pct: None,
        spec: None,
    }
}

fn count(h: &Harness<'_, History>, text: &str) -> usize {
    h.query_all_by_label_contains(text).count()
}

#[test]
fn the_trade_off_view_draws_one_point_per_batch_size_and_the_operating_point_moves() {
    let mut history = History::default();
    for (i, (b, per_req, agg)) in [(1, 150.0, 150.0), (1, 160.0, 160.0), (4, 58.0, 165.0)]
        .into_iter()
        .enumerate()
    {
        history
            .samples
            .push_back(sample(i as f64 * 0.1, b, per_req, agg));
    }
    let mut h = Harness::builder()
        .with_size([1400.0, 1100.0])
        .build_ui_state(
            |ui, hist: &mut History| plots_ui(ui, hist, LABEL, &[]),
            history,
        );
    h.run();
    // The settings are said once for the whole view, not in every plot's title.
    assert_eq!(count(&h, "batch cap 64 · budget 2048"), 1);
    assert!(h.query_by_label(&format!("Taken under: {LABEL}")).is_some());
    // Each face of TPS has its own plot; TTFT and ITL beside the trade-off.
    for title in [
        "Aggregate output TPS",
        "Per-request TPS",
        "Trade-off: per-request vs aggregate TPS, one point per batch size",
        "Time to first token",
        "Inter-token latency",
    ] {
        assert!(h.query_by_label(title).is_some(), "{title}");
    }
    // One point per batch size seen (the mean of its samples), the latest highlighted.
    assert!(
        h.query_by_label(
            "Points (batch: per-request / aggregate tok/s): 1: 155.0 / 155.0 · 4: 58.0 / 165.0"
        )
        .is_some()
    );
    assert!(
        h.query_by_label(
            "Operating point: batch 4 · 58.0 tok/s per request · 165.0 tok/s aggregate · \
             TTFT P99 910 ms · ITL P99 20 ms"
        )
        .is_some()
    );

    // A knob change moves the batch size: a new point, and the operating point follows.
    h.state_mut()
        .samples
        .push_back(sample(0.3, 16, 18.0, 190.0));
    h.run();
    assert!(
        h.query_by_label_contains("4: 58.0 / 165.0 · 16: 18.0 / 190.0")
            .is_some()
    );
    assert!(
        h.query_by_label_contains("Operating point: batch 16 · 18.0 tok/s")
            .is_some()
    );
    assert_eq!(count(&h, "batch cap 64 · budget 2048"), 1);
}

/// Speculation's plots appear once the engine's snapshot says it is on, fed from the snapshot as
/// the window samples it; the policy's pause is the latest mark. A history without speculation
/// has none of them.
#[test]
fn speculation_gets_its_plots_once_it_is_on() {
    use tpslab::ui::panels::spec_knobs::switch_mark;
    use tpslab_engine::serving::engine::EngineSnapshot;
    use tpslab_engine::serving::spec_metrics::SpecWindow;
    use tpslab_engine::spec::{SpecMethod, SpecPause};
    const TITLES: [&str; 3] = [
        "Speculation: acceptance rate (%)",
        "Speculation: tokens per verified step",
        "Speculation: time per step (ms)",
    ];
    let build = |history: History| {
        Harness::builder()
            .with_size([1400.0, 1400.0])
            .build_ui_state(
                |ui, hist: &mut History| plots_ui(ui, hist, LABEL, &[]),
                history,
            )
    };
    let mut off = History::default();
    off.samples.push_back(sample(0.0, 1, 150.0, 150.0));
    let mut h = build(off);
    h.run();
    for title in TITLES {
        assert!(h.query_by_label(title).is_none(), "{title}");
    }

    let mut snap = EngineSnapshot::default();
    snap.knobs.spec.method = SpecMethod::Ngram;
    snap.live.spec = SpecWindow {
        acceptance_rate: Some(0.62),
        mean_acceptance_length: Some(2.9),
        propose_ms: Some(0.4),
        verify_ms: Some(9.8),
        active_share: Some(1.0),
    };
    let mut history = History::default();
    history.sample(&snap);
    let s = history.samples.back().unwrap().spec.unwrap();
    assert_eq!(
        (s.acceptance_pct, s.tokens_per_step, s.verify_ms),
        (Some(62.0), Some(2.9), Some(9.8))
    );
    let mut paused = snap.clone();
    paused.spec_switches = 1;
    paused.spec_pause = Some(SpecPause::BatchFull {
        running: 9,
        max_batch: 8,
    });
    history.mark(switch_mark(&snap, &paused).unwrap());
    let mut h = build(history);
    h.run();
    for title in TITLES {
        assert!(h.query_by_label(title).is_some(), "{title}");
    }
    assert!(
        h.query_by_label("Last change: speculation paused: 9 running > 8")
            .is_some()
    );
}

#[test]
fn an_empty_history_says_so() {
    let mut h = Harness::builder()
        .with_size([1400.0, 1100.0])
        .build_ui_state(
            |ui, hist: &mut History| plots_ui(ui, hist, LABEL, &[]),
            History::default(),
        );
    h.run();
    assert!(
        h.query_by_label("Operating point: none yet (no request streaming)")
            .is_some()
    );
    assert!(
        h.query_by_label("Points (batch: per-request / aggregate tok/s): none yet")
            .is_some()
    );
}

struct Planner {
    settings: PlannerSettings,
    table: DeviceTable,
}

fn planner_harness(settings: PlannerSettings) -> Harness<'static, Planner> {
    let state = Planner {
        settings,
        table: DeviceTable::bundled().unwrap(),
    };
    Harness::builder()
        .with_size([1400.0, 1100.0])
        .build_ui_state(
            |ui, p: &mut Planner| {
                let view = PlannerView {
                    table: Ok(&p.table),
                    loaded: None,
                    origin: "bundled",
                    busy: None,
                    message: None,
                };
                planner::ui(ui, &mut p.settings, &view);
            },
            state,
        )
}

#[test]
fn the_planner_shows_each_source_with_its_error_and_the_predicted_rows() {
    let settings = PlannerSettings {
        devices: vec!["h200".into(), "h100".into()],
        precisions: vec!["F16".into()],
        concurrency: "1, 256".into(),
        ..PlannerSettings::default()
    };
    let mut h = planner_harness(settings);
    h.run();
    assert!(h.query_by_label("Capacity planner").is_some());
    assert!(
        h.query_by_label_contains("Planned for: llama-3-8b · prompt 128 -> output 128 tok")
            .is_some()
    );
    // The H200 is checked on its own measured rows; the H100 borrows the H200's error.
    assert!(
        h.query_by_label_contains(
            "h200: cuda calibration; against this device's measured runs: mean"
        )
        .is_some()
    );
    assert!(
        h.query_by_label_contains(
            "h100: cuda calibration, not measured on this device; on h200: mean"
        )
        .is_some()
    );
    // The table's cells are the engine's predictions.
    let table = DeviceTable::bundled().unwrap();
    let shape = ModelShape::synthetic("llama-3-8b").unwrap();
    let w = Workload {
        concurrency: 256,
        prompt_len: 128,
        output_len: 128,
        token_budget: 8192,
    };
    let p = predict(
        &table,
        table.device("h100").unwrap(),
        &shape,
        WType::F16,
        &w,
    )
    .unwrap();
    let agg = format!("{:.0}", p.aggregate_tps.unwrap());
    assert!(
        h.query_all_by_label(&agg).next().is_some(),
        "aggregate {agg}"
    );
    let usd = format!("{:.3}", p.usd_per_million_tokens.unwrap());
    assert!(h.query_all_by_label(&usd).next().is_some(), "cost {usd}");
    assert_eq!(
        h.query_all_by_label("h100").count(),
        2 + 1,
        "two rows and its checkbox"
    );

    // Another device: its rows appear.
    h.get_by_label("rtx4090").click();
    h.run();
    assert!(h.state().settings.devices.iter().any(|d| d == "rtx4090"));
    assert!(
        h.query_by_label_contains("rtx4090: cuda calibration")
            .is_some()
    );
    // On a 24 GB card 256 sequences of 8B F16 do not fit: the rest wait, and it says so.
    assert!(h.query_by_label_contains("(KV-limited)").is_some());
}

/// A 70B in F16 does not fit one H100 (the note says so, its rows show no speed); picking
/// tensor parallelism 4 in the tab splits it over four, each row naming its split, with the
/// engine's own multi-GPU prediction in its cells.
#[test]
fn the_planner_splits_a_model_over_gpus_when_asked() {
    let settings = PlannerSettings {
        model: "llama-3.1-70b".into(),
        devices: vec!["h100".into()],
        precisions: vec!["F16".into()],
        concurrency: "1, 16".into(),
        ..PlannerSettings::default()
    };
    let mut h = planner_harness(settings);
    h.run();
    assert!(h.query_by_label_contains("· one GPU").is_some());
    assert!(
        h.query_by_label_contains("llama-3.1-70b F16 on 1 x h100 (1 GPU): does not fit")
            .is_some()
    );
    h.get_by_role_and_label(egui::accesskit::Role::ComboBox, "Tensor parallel (GPUs)")
        .click();
    h.run();
    h.get_all_by_label("4")
        .last()
        .expect("the menu entry")
        .click();
    h.run();
    assert_eq!(h.state().settings.tp, 4);
    assert!(h.query_by_label_contains("· TP4 (4 GPUs each)").is_some());
    assert!(h.query_by_label_contains("does not fit").is_none());
    assert_eq!(
        h.query_all_by_label("4 x h100 TP4").count(),
        2,
        "one row per level"
    );
    let table = DeviceTable::bundled().unwrap();
    let shape = ModelShape::synthetic("llama-3.1-70b").unwrap();
    let w = Workload {
        concurrency: 16,
        prompt_len: 128,
        output_len: 128,
        token_budget: 8192,
    };
    let tp4 = Parallel {
        tp: 4,
        pp: 1,
        ep: 1,
    };
    let p = predict_parallel(
        &table,
        table.device("h100").unwrap(),
        &shape,
        WType::F16,
        &w,
        tp4,
        None,
    )
    .unwrap();
    let agg = format!("{:.0}", p.aggregate_tps.expect("fits on four"));
    assert!(
        h.query_all_by_label(&agg).next().is_some(),
        "aggregate {agg}"
    );
}

/// The window with its Planner tab open, on the device table in `devices` (else the bundled
/// one). A missing model file fails fast; the planner needs no model.
fn planner_window(devices: Option<&std::path::Path>) -> Harness<'static, TpsApp> {
    planner_window_on("/nonexistent/tpslab-gui-plan.gguf", devices)
}

fn planner_window_on(model: &str, devices: Option<&std::path::Path>) -> Harness<'static, TpsApp> {
    let mut app = TpsApp::new(
        AppState::default(),
        AppOptions {
            model: model.into(),
            threads: 1,
            device: Some(DeviceChoice::Cpu),
        },
    );
    if let Some(path) = devices {
        app.set_device_table(path);
    }
    let mut h = Harness::builder()
        .with_size([1400.0, 1000.0])
        .build_ui_state(|ui, app: &mut TpsApp| app.app_ui(ui), app);
    h.run_steps(3);
    h.get_by_label("Planner").click();
    h.run_steps(3);
    h
}

#[test]
fn the_window_has_a_planner_tab() {
    let h = planner_window(None);
    assert!(h.query_by_label("Capacity planner").is_some());
    assert!(
        h.query_by_label_contains("h200: cuda calibration; against this device's measured runs")
            .is_some()
    );
}

/// `--devices FILE` (a table `tpslab plan --calibrate --save-devices` wrote, here one without
/// the H200's measured rows) is the table the planner tab plans with; a hostile one is
/// shown as its error, and the window goes on.
#[test]
fn the_planner_tab_plans_with_a_saved_device_table() {
    let dir = temp_dir("saved");
    let saved = table_without_h200_runs(&dir);
    let hostile = dir.join("hostile.json");
    std::fs::write(&hostile, "{\"devices\": [], \"calibrations\": 7}").unwrap();

    let h = planner_window(Some(&saved));
    // The bundled table's H200 has measured rows (the other test sees their error); the saved
    // one has none, and no other CUDA device was measured.
    assert!(
        h.query_by_label_contains("h200: cuda calibration; against this device's measured runs")
            .is_none()
    );
    assert!(
        h.query_by_label_contains("h200: cuda calibration; error unknown (nothing measured)")
            .is_some()
    );
    drop(h);
    let h = planner_window(Some(&hostile));
    assert!(
        h.query_by_label_contains("Device table: device table:")
            .is_some()
    );
    assert!(h.query_by_label("Planner").is_some());
}

fn temp_dir(what: &str) -> TempDir {
    TempDir::new(&format!("gui-devices-{what}"))
}

/// The bundled table with the H200's measured runs taken out, saved in `dir`.
fn table_without_h200_runs(dir: &std::path::Path) -> std::path::PathBuf {
    let mut table: serde_json::Value =
        serde_json::from_str(include_str!("../../assets/devices.json")).unwrap();
    let h200 = (table["devices"].as_array_mut().unwrap().iter_mut())
        .find(|d| d["id"] == "h200")
        .unwrap();
    h200["measured"] = serde_json::json!([]);
    let saved = dir.join("saved.json");
    std::fs::write(&saved, table.to_string()).unwrap();
    saved
}

fn answer(h: &mut Harness<'static, TpsApp>, a: DialogAnswer) {
    h.state_mut().set_file_dialog(Arc::new(FixedDialog(a)));
}

/// The tab's own buttons: a table opened through the dialog, `this-cpu` calibrated on the
/// window's engine running the real default model (1, 4 and 16 concurrent), and the table
/// saved: the file holds the opened table with the calibrated row and its measured runs.
#[test]
fn the_planner_tab_opens_calibrates_and_saves_its_table() {
    let dir = temp_dir("calibrate");
    let opened = table_without_h200_runs(&dir);
    let mut h = planner_window_on("default", None);
    assert!(h.query_by_label("Device table: bundled").is_some());

    // No dialog to show: said, and the table stays.
    answer(&mut h, DialogAnswer::Unavailable("no portal".into()));
    h.get_by_label("Open table…").click();
    wait_until(&mut h, "the dialog's answer", 30, |h| {
        h.query_by_label_contains("cannot open a table: no portal")
            .is_some()
    });
    answer(&mut h, DialogAnswer::Chosen(opened.clone()));
    h.get_by_label("Open table…").click();
    let origin = format!("Device table: {}", opened.display());
    wait_until(&mut h, "the opened table", 30, |h| {
        h.query_by_label(&origin).is_some()
    });
    assert!(
        h.query_by_label_contains("h200: cuda calibration; error unknown (nothing measured)")
            .is_some()
    );

    wait_until(&mut h, "the model to load", 600, |h| {
        h.state().engine().is_some()
    });
    h.get_by_label("Calibrate this CPU").click();
    h.run_steps(2);
    assert!(h.query_by_label_contains("Calibrating this CPU").is_some());
    wait_until(&mut h, "the calibration", 900, |h| {
        h.query_by_label_contains("this-cpu calibrated: bandwidth")
            .is_some()
    });
    let said = h
        .query_by_label_contains("this-cpu calibrated: bandwidth")
        .map(|n| n.accesskit_node().value().unwrap_or_default())
        .unwrap();
    assert!(
        said.contains("against this device's measured runs"),
        "{said}"
    );

    let out = dir.join("calibrated.json");
    answer(&mut h, DialogAnswer::Chosen(out.clone()));
    h.get_by_label("Save table…").click();
    wait_until(&mut h, "the save", 60, |h| {
        h.query_by_label_contains("Table saved:").is_some()
    });
    let saved = DeviceTable::load(&out).unwrap();
    assert!(
        saved.device("h200").unwrap().measured.is_empty(),
        "the opened table"
    );
    let cpu = saved.device("this-cpu").unwrap();
    let levels: Vec<usize> = cpu.measured.iter().map(|r| r.concurrency).collect();
    assert_eq!(levels, [1, 4, 16]);
    assert!(
        cpu.measured
            .iter()
            .all(|r| r.source.starts_with("the window's planner"))
    );
    assert!(cpu.bandwidth_gb_s.source.contains("calibrated here"));
    let bw = format!("bandwidth {:.1} GB/s", cpu.bandwidth_gb_s.value);
    assert!(said.contains(&bw), "{said} / {bw}");
}

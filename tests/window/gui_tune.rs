//! The Tuner tab driven by its labels (AccessKit) with egui_kittest over the real default model
//! and engine: the form filled in, a tuning run started (it runs on its own thread while frames
//! go on), its rows appearing, and Apply putting the winner's knobs on the running engine.
//! A recorded trace chosen through the dialog seam becomes the workload, read on the tuner's
//! thread (a hostile one fails the run with its reason, the window goes on).
//! Waits are bounded loops of frames, never timing checks.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::gui_wait;

use std::sync::Arc;

use egui_kittest::Harness;
use egui_kittest::kittest::{NodeT, Queryable};
use gui_wait::wait_until;
use tpslab::ui::files::{DialogAnswer, FixedDialog};
use tpslab::ui::{AppOptions, AppState, TpsApp};
use tpslab_engine::device::DeviceChoice;

fn has(h: &Harness<'static, TpsApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

/// The window on the default model (CPU), its Tuner tab open.
fn tuner_tab() -> Harness<'static, TpsApp> {
    let app = TpsApp::new(
        AppState::default(),
        AppOptions {
            model: "default".into(),
            threads: 1,
            device: Some(DeviceChoice::Cpu),
        },
    );
    let mut h = Harness::builder()
        .with_size([1400.0, 1400.0])
        .allow_missing_glyphs()
        .build_ui_state(|ui, app: &mut TpsApp| app.app_ui(ui), app);
    wait_until(&mut h, "the model to load", 600, |h| {
        h.state().engine().is_some()
    });
    h.get_by_label("Tuner").click();
    h.run_steps(2);
    assert!(h.query_by_label("SLO tuner").is_some());
    assert!(has(&h, "No tuning run yet."));
    h
}

#[test]
fn the_tuner_tab_runs_shows_its_candidates_and_applies_the_winner() {
    let mut h = tuner_tab();

    // The form, by its labels: a small workload and a budget of a few seconds.
    for (label, v) in [
        ("TTFT P99 (ms)", 20_000.0),
        ("ITL P99 (ms)", 5_000.0),
        ("Prompt length", 8.0),
        ("Output length", 4.0),
        ("Concurrency", 2.0),
        ("Budget (s)", 4.0),
        ("Shortest run (s)", 0.5),
    ] {
        h.get_by_label(label).set_value_accesskit(v);
        h.run_steps(2);
    }
    let s = &h.state().state.tuner;
    assert_eq!((s.prompt_len, s.output_len, s.concurrency), (8, 4, 2));
    assert_eq!((s.ttft_p99_ms, s.budget_s), (20_000.0, 4.0));

    h.get_by_label("Start tuning").click();
    h.step();
    wait_until(&mut h, "the run to start", 30, |h| has(h, "Stop tuning"));
    // The default knobs are the first candidate: their row appears once measured.
    wait_until(&mut h, "the first measured row", 120, |h| {
        has(h, "seqs 64 · budget 2048 · chunked · spec off")
            && h.query_all_by_label("#0").next().is_some()
    });
    wait_until(&mut h, "the verified report", 300, |h| {
        has(h, "Best (fresh run): goodput") && has(h, "Default (fresh run; ")
    });
    assert!(
        has(&h, "Start tuning"),
        "the form is back once the run ended"
    );
    assert!(has(&h, "Goodput vs per-request TPS: "));
    assert!(has(&h, "on the frontier"));

    // Move the engine off the winner's knobs, then Apply puts them back on, live.
    let engine = h.state().engine().expect("engine").clone();
    let mut off = engine.stats().knobs;
    off.scheduler.max_num_seqs = 3;
    off.scheduler.max_num_batched_tokens = 99;
    engine.set_knobs(off);
    wait_until(&mut h, "the engine to take the other knobs", 30, |h| {
        h.state()
            .engine()
            .expect("engine")
            .stats()
            .knobs
            .scheduler
            .max_num_seqs
            == 3
    });
    // A label's text is its AccessKit value (buttons carry it as their label).
    let node = h.get_by_label_contains("Best knobs: ");
    let node = node.accesskit_node();
    let best = node
        .label()
        .or_else(|| node.value())
        .expect("the label's text")
        .trim_start_matches("Best knobs: ")
        .to_string();
    h.get_by_label("Apply best knobs").click();
    wait_until(&mut h, "the winner's knobs on the engine", 30, |h| {
        let k = h.state().engine().expect("engine").stats().knobs;
        let c = tpslab_engine::tune::Candidate::of_knobs(&k);
        c.label() == best
    });
    let k = h.state().engine().expect("engine").stats().knobs;
    assert_ne!(k.scheduler.max_num_batched_tokens, 99);
    // The dashboard's knobs follow.
    assert_eq!(h.state().state.dash.knobs.scheduler, k.scheduler);
}

/// Chooses `path` through the dialog seam and waits until the form shows it.
fn choose_trace(h: &mut Harness<'static, TpsApp>, path: &std::path::Path) {
    let answer = DialogAnswer::Chosen(path.to_path_buf());
    h.state_mut().set_file_dialog(Arc::new(FixedDialog(answer)));
    h.get_by_label("Choose trace…").click();
    let shown = path.display().to_string();
    wait_until(h, "the chosen trace in the form", 30, |h| has(h, &shown));
    assert_eq!(h.state().state.tuner.trace.as_deref(), Some(path));
}

#[test]
fn a_recorded_trace_chosen_in_the_tab_is_the_workload_and_a_hostile_one_fails_the_run() {
    let dir = std::env::temp_dir().join(format!("tpslab-gui-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut h = tuner_tab();
    for (label, v) in [
        ("TTFT P99 (ms)", 20_000.0),
        ("ITL P99 (ms)", 5_000.0),
        ("Concurrency", 2.0),
        ("Budget (s)", 4.0),
        ("Shortest run (s)", 0.5),
    ] {
        h.get_by_label(label).set_value_accesskit(v);
        h.run_steps(2);
    }

    // A line past the trace's line cap: the run fails with the file's reason; nothing else does.
    let bad = dir.join("bad.jsonl");
    let long = format!(
        "{{\"t\": 0, \"prompt_tokens\": 8, \"pad\": \"{}\"}}\n",
        "x".repeat(4096)
    );
    std::fs::write(&bad, long).unwrap();
    choose_trace(&mut h, &bad);
    h.get_by_label("Start tuning").click();
    wait_until(&mut h, "the trace's refusal", 60, |h| {
        has(h, "Tuning failed: ") && has(h, "line 1 is longer than 1024 bytes")
    });
    assert!(has(&h, "Start tuning"), "the form is back");
    assert!(h.state().engine().is_some(), "the engine runs on");

    // Three requests a second apart: their lengths, at their rate (the form's rate is 0).
    let good = dir.join("three.jsonl");
    let lines = [(100.0, 8, 3), (101.0, 12, 4), (102.0, 6, 2)].map(|(t, p, c)| {
        format!("{{\"t\":{t},\"prompt_tokens\":{p},\"completion_tokens\":{c}}}\n")
    });
    std::fs::write(&good, lines.concat()).unwrap();
    choose_trace(&mut h, &good);
    assert!(
        h.get_by_label("Prompt length")
            .accesskit_node()
            .is_disabled(),
        "the trace's lengths replace the fixed ones"
    );
    h.get_by_label("Start tuning").click();
    let want = "Workload: trace three.jsonl (3 requests, 1.000 req/s): prompt 6-12, mean 9, \
                of 3 recorded -> output 2-4, mean 3, of 3 recorded tokens, 1.000 req/s, at \
                most 2 in flight";
    wait_until(&mut h, "the trace read on the tuner's thread", 60, |h| {
        has(h, want)
    });
    wait_until(&mut h, "the first measured row", 120, |h| {
        h.query_all_by_label("#0").next().is_some()
    });
    h.get_by_label("Stop tuning").click();
    wait_until(&mut h, "the run to stop", 120, |h| has(h, "Start tuning"));

    h.get_by_label("Clear trace").click();
    h.run_steps(2);
    assert_eq!(h.state().state.tuner.trace, None);
    assert!(
        !h.get_by_label("Prompt length")
            .accesskit_node()
            .is_disabled()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

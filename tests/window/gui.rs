//! The window driven by its labels (AccessKit) with egui_kittest: no GPU, no display, the real
//! default model through the real engine. Waits are bounded loops of frames, never timing checks.

use crate::gui_wait;
use crate::gui_window;
use crate::llamacpp;
use crate::runaway;
use gui_wait::wait_until;
use gui_window::{has, window};
use std::sync::Arc;
use std::time::Duration;

use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use tpslab::ui::engine_link::DevicePref;
use tpslab::ui::files::{DialogAnswer, FixedDialog};
use tpslab::ui::load::{RemoteSettings, SweepPoint};
use tpslab::ui::panels::chat::{Conversation, Message, Role};
use tpslab::ui::{AppState, TpsApp};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::sched::Policy;
use tpslab_engine::serving::sampler::SamplingParams;

/// The window on the CPU (the same figures and answers on every machine).
fn harness(state: AppState) -> Harness<'static, TpsApp> {
    harness_on(state, DeviceChoice::Cpu)
}

fn harness_on(state: AppState, device: DeviceChoice) -> Harness<'static, TpsApp> {
    harness_with(state, "default", device, [1400.0, 1400.0])
}

/// The window drawing saved messages only: a missing model file fails fast in the status bar.
fn harness_without_model(state: AppState) -> Harness<'static, TpsApp> {
    harness_with(
        state,
        "/nonexistent/tpslab-gui-test.gguf",
        DeviceChoice::Cpu,
        [1000.0, 800.0],
    )
}

fn harness_with(
    state: AppState,
    model: &str,
    device: DeviceChoice,
    size: [f32; 2],
) -> Harness<'static, TpsApp> {
    window(state, model, device, size, |_| {})
}

fn wait_for_model(h: &mut Harness<'static, TpsApp>) {
    // The first run may fetch the default model with pip.
    wait_until(h, "the model to load", 600, |h| {
        h.state().engine().is_some()
    });
    wait_until(h, "the status bar", 10, |h| {
        h.query_by_label_contains("Backend: CPU, 1 threads")
            .is_some()
    });
}

/// The open conversation's last message: (role, text, finish reason so far).
fn last_message(h: &Harness<'static, TpsApp>) -> Option<(Role, String, String)> {
    let chat = &h.state().state.chat;
    let conv = chat.conversations.iter().find(|c| c.id == chat.active)?;
    let m = conv.messages.last()?;
    let finish = m.stats.as_ref().map_or(String::new(), |s| s.finish.clone());
    Some((m.role, m.text.clone(), finish))
}

fn type_message(h: &mut Harness<'static, TpsApp>, text: &str) {
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message").type_text(text);
    h.step();
}

/// A fresh window state whose one conversation samples greedily (the same answer every run).
fn greedy_chat(max_tokens: usize) -> AppState {
    let mut state = AppState::default();
    state.chat.conversations = vec![Conversation {
        id: 1,
        title: "Chat 1".into(),
        sampling: SamplingParams::greedy(),
        max_tokens,
        ..Conversation::default()
    }];
    state
}

#[test]
fn chat_streams_an_answer_and_stops() {
    // Greedy, so the answers are the same on every run. Not "What is the capital of France?":
    // its first token is a near-tie that llama.cpp answers "L'Étoile, la Marseillaise…"; this
    // one llama.cpp (llama-completion, same file and template) answers as we do.
    let state = greedy_chat(48);
    let mut h = harness(state);
    wait_for_model(&mut h);

    type_message(&mut h, "Tell me the capital of France.");
    h.get_by_label("Send").click();
    wait_until(&mut h, "a streamed answer to finish", 120, |h| {
        last_message(h).is_some_and(|(role, text, finish)| {
            role == Role::Assistant
                && !text.is_empty()
                && finish != "streaming"
                && !finish.is_empty()
        })
    });
    let (_, answer, finish) = last_message(&h).expect("an answer");
    assert!(finish == "stop" || finish == "length", "finish: {finish}");
    eprintln!("answer ({finish}): {answer}");
    assert!(answer.contains("Paris"), "answer: {answer}");
    // The answer is on screen with its figures under it.
    wait_until(&mut h, "the answer on screen", 10, |h| {
        has(h, "Paris") && has(h, "tokens · TTFT")
    });

    // A long answer, stopped as soon as it streams.
    h.state_mut().state.chat.conversations[0].max_tokens = 1024;
    type_message(
        &mut h,
        "Write a very long story about a dragon who learns to bake bread.",
    );
    // Enter sends (the input box still has focus).
    h.key_press(egui::Key::Enter);
    wait_until(&mut h, "the second answer to start streaming", 120, |h| {
        last_message(h).is_some_and(|(role, text, _)| role == Role::Assistant && !text.is_empty())
    });
    h.get_by_label("Stop").click();
    wait_until(&mut h, "the generation to stop", 60, |h| {
        last_message(h).is_some_and(|(_, _, finish)| finish != "streaming")
    });
    let (_, _, finish) = last_message(&h).expect("an answer");
    assert_eq!(finish, "abort");
    // Idle again: Send is back and Regenerate is offered.
    wait_until(&mut h, "the input to be idle", 10, |h| {
        h.query_by_label("Regenerate").is_some() && h.query_by_label("Stop").is_none()
    });
}

#[test]
fn under_the_priority_policy_a_chat_goes_ahead_of_a_full_load() {
    // The load generator fills both batch slots with long requests; a chat then needs one.
    let mut state = greedy_chat(4);
    state.dash.knobs.scheduler.max_num_seqs = 2;
    state.dash.knobs.scheduler.policy = Policy::Priority;
    (state.dash.load.concurrency, state.dash.load.prompt_len) = (2, 16);
    state.dash.load.output_len = 4000;
    let mut h = harness(state);
    wait_for_model(&mut h);
    h.get_by_label("Dashboard").click();
    h.step();
    h.get_by_label("Start load").click();
    wait_until(&mut h, "both load requests to be decoding", 120, |h| {
        let s = h.state().engine().expect("engine").stats();
        s.knobs.scheduler.max_num_seqs == 2
            && s.running == 2
            && s.live.counters.generation_tokens_total > 0
    });

    h.get_by_label("Chat").click();
    h.step();
    type_message(&mut h, "What is the capital of France?");
    h.get_by_label("Send").click();
    wait_until(&mut h, "the chat's answer to finish", 240, |h| {
        last_message(h).is_some_and(|(role, text, finish)| {
            role == Role::Assistant && !text.is_empty() && finish == "length"
        })
    });
    // The answer came while both load requests were still far from their 4000 tokens: one of
    // them gave up its slot (and is recomputed later); none had finished.
    let s = h.state().engine().expect("engine").stats();
    let preemptions = s.live.counters.preemptions;
    assert!(preemptions >= 1, "preemptions: {preemptions}");
    h.get_by_label("Dashboard").click();
    wait_until(&mut h, "the load figures", 10, |h| {
        has(h, "; 0 requests done")
    });
    h.get_by_label("Stop load").click();
    wait_until(&mut h, "the load to stop", 120, |h| has(h, "Start load"));
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, step by step, as a user clicks through it
fn dashboard_knobs_load_generator_and_sweep() {
    let dir = std::env::temp_dir().join(format!("tpslab-gui-test-{}", std::process::id()));
    let mut state = AppState::default();
    state.dash.load.prompt_len = 16;
    state.dash.load.output_len = 8;
    state.dash.load.sweep_max = 2;
    state.dash.load.sweep_requests_per_slot = 1;
    state.dash.load.sweep_path = dir.join("sweep").display().to_string();
    let mut h = harness(state);
    wait_for_model(&mut h);
    h.get_by_label("Dashboard").click();
    h.step();

    // A knob reaches the running engine.
    assert!(
        h.state()
            .engine()
            .expect("engine")
            .stats()
            .knobs
            .scheduler
            .prefix_caching
    );
    h.get_by_label("Prefix caching").click();
    h.get_by_label("Max batch size").set_value_accesskit(8.0);
    wait_until(&mut h, "the engine to report the new knobs", 30, |h| {
        let k = h.state().engine().expect("engine").stats().knobs.scheduler;
        !k.prefix_caching && k.max_num_seqs == 8
    });
    wait_until(
        &mut h,
        "the plots to be labelled with the new batch cap",
        10,
        |h| has(h, "batch cap 8 · budget"),
    );

    // The weight precision: the engine re-quantizes in memory, the plots get a mark with the
    // sizes before and after, and the labels carry the new precision.
    h.get_by_role_and_label(egui::accesskit::Role::ComboBox, "Weight precision")
        .click();
    h.run_steps(2);
    h.get_by_label("Q8_0").click();
    wait_until(&mut h, "the engine to serve Q8_0 weights", 120, |h| {
        (h.state().engine().expect("engine").stats().precision)
            .is_some_and(|p| p.to_string() == "Q8_0")
    });
    wait_until(&mut h, "the precision mark and label", 10, |h| {
        h.query_by_label_contains("precision Q4_1 -> Q8_0 (weights")
            .is_some()
            && has(h, "Precision: Q8_0")
            && has(h, "· Q8_0 ·")
    });

    // Load generator: start, see figures, stop.
    h.get_by_label("Concurrency").set_value_accesskit(3.0);
    h.step();
    h.get_by_label("Start load").click();
    wait_until(&mut h, "the load to run", 30, |h| {
        h.query_by_label_contains("Load running: 3 concurrent")
            .is_some()
    });
    // The live trade-off view: the operating point of the real run, one point per batch size.
    wait_until(&mut h, "the operating point of the load", 60, |h| {
        has(h, "Operating point: batch ")
            && !has(h, "Points (batch: per-request / aggregate tok/s): none yet")
    });
    wait_until(&mut h, "load requests to finish", 120, |h| {
        h.state()
            .engine()
            .expect("engine")
            .stats()
            .live
            .counters
            .requests_finished
            >= 3
    });
    h.get_by_label("Stop load").click();
    wait_until(&mut h, "the load run's summary", 60, |h| {
        h.query_by_label_contains("Last load (3 concurrent")
            .is_some()
    });
    assert!(h.query_by_label("Start load").is_some());

    // A short sweep: one labelled point per level, saved as JSON and CSV.
    h.get_by_label("Run sweep").click();
    h.run_steps(2);
    // While it runs, the plots say what they are taken under: the sweep, not "no load".
    assert!(
        has(&h, "sweep to 2 concurrent, prompt"),
        "the sweep in the plots' label"
    );
    wait_until(&mut h, "the sweep's points", 180, |h| {
        has(h, "c=1:") && has(h, "c=2:") && h.query_by_label("Run sweep").is_some()
    });
    // Saved where the dialog says (here a fixed answer), all three side by side.
    let picked = dir.join("picked").join("mine.json");
    h.state_mut()
        .set_file_dialog(Arc::new(FixedDialog(DialogAnswer::Chosen(picked.clone()))));
    h.get_by_label("Save JSON + CSV + PNG").click();
    wait_until(&mut h, "the save notice", 30, |h| has(h, "Sweep saved: "));
    for ext in ["json", "csv", "png"] {
        assert!(picked.with_extension(ext).is_file(), "mine.{ext}");
    }
    let png = image::open(picked.with_extension("png")).expect("the PNG decodes");
    assert_eq!([png.width(), png.height()], tpslab::ui::plot_png::PNG_SIZE);
    // No dialog available: saved to the default path, and the notice says why and where.
    h.state_mut()
        .set_file_dialog(Arc::new(FixedDialog(DialogAnswer::Unavailable(
            "no portal here".into(),
        ))));
    h.get_by_label("Save JSON + CSV + PNG").click();
    let default_json = dir.join("sweep.json").display().to_string();
    wait_until(&mut h, "the fallback notice", 30, |h| {
        has(h, "Sweep saved to the default place (no portal here)") && has(h, &default_json)
    });
    let csv = std::fs::read_to_string(dir.join("sweep.csv")).expect("sweep.csv");
    assert_eq!(csv.lines().count(), 3, "{csv}");
    let json: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("sweep.json")).expect("json"))
            .expect("valid json");
    assert_eq!(json.as_array().map(Vec::len), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_answer_renders_as_markdown_with_a_copyable_code_block() {
    let code = "fn main() {\n    println!(\"hi\");\n}";
    let answer = format!(
        "## Hello in Rust\n\nUse **println!** in `main`:\n\n```rust\n{code}\n```\n\n- one\n- two\n"
    );
    let mut state = AppState::default();
    state.chat.conversations[0].messages = vec![
        Message {
            role: Role::User,
            text: "Say hi in Rust".into(),
            ..Message::default()
        },
        Message {
            role: Role::Assistant,
            text: answer,
            ..Message::default()
        },
    ];
    let mut h = harness_without_model(state);
    h.run_steps(2);
    // The code is shown as it is (monospace, in its frame), the markers are gone.
    assert!(h.query_by_label(code).is_some(), "the code block's text");
    assert!(h.query_by_label("Hello in Rust").is_some(), "the heading");
    assert!(has(&h, "Use println! in main:"), "inline styles");
    assert!(
        !has(&h, "**") && !has(&h, "```"),
        "no markdown markers shown"
    );
    assert!(h.query_by_label("one").is_some() && h.query_by_label("two").is_some());
    h.get_by_label("Copy code").click();
    h.step();
    let copied = h
        .output()
        .platform_output
        .commands
        .iter()
        .any(|c| matches!(c, egui::OutputCommand::CopyText(t) if t == code));
    assert!(
        copied,
        "Copy code copies the block: {:?}",
        h.output().platform_output.commands
    );
}

#[test]
fn a_long_conversation_lays_out_only_what_is_on_screen() {
    let body = "Some text.\n\n```rust\nfn main() {}\n```\n\n".repeat(10);
    let mut state = AppState::default();
    let messages = &mut state.chat.conversations[0].messages;
    for i in 0..40 {
        messages.push(Message {
            role: Role::User,
            text: format!("question {i}"),
            ..Message::default()
        });
        messages.push(Message {
            role: Role::Assistant,
            text: format!("{body}answer number {i}."),
            ..Message::default()
        });
    }
    let mut h = harness_without_model(state);
    h.run_steps(4);
    // Scrolled to the end: the last answer is drawn, the first ones only take their space.
    assert!(has(&h, "answer number 39."), "the last answer is on screen");
    assert!(
        !has(&h, "answer number 0."),
        "the first answer is not laid out"
    );
    assert!(
        h.query_all_by_label("Copy code").count() < 60,
        "only visible code blocks"
    );
}

/// A sweep result as the sweep thread reports it.
fn sweep_point(c: usize, aggregate: f64, per_request: f64) -> SweepPoint {
    SweepPoint {
        concurrency: c,
        prompt_len: 128,
        output_len: 64,
        precision: Some("Q4_1".parse().expect("Q4_1")),
        completed: 2 * c,
        duration_s: 10.0,
        output_throughput: aggregate,
        mean_per_request_tps: Some(per_request),
        p10_per_request_tps: Some(per_request * 0.9),
        median_ttft_ms: 100.0,
        p99_ttft_ms: 200.0,
        max_batch: 64,
        device: "CPU, 2 threads".into(),
    }
}

#[test]
fn a_sweep_plot_saves_as_a_png_with_its_settings() {
    let points = [
        sweep_point(1, 40.0, 40.0),
        sweep_point(2, 70.0, 35.0),
        sweep_point(4, 110.0, 28.0),
        sweep_point(8, 140.0, 18.0),
    ];
    // The PNG carries the run's settings as text (the label drawn above the plot).
    let settings = tpslab::ui::plots::sweep_settings(&points);
    assert_eq!(
        settings,
        "batch cap 64 · prompt 128 -> output 64 tok · Q4_1 · CPU, 2 threads"
    );
    let dir = std::env::temp_dir().join(format!("tpslab-png-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("sweep.png");
    tpslab::ui::plot_png::save(&path, &points).expect("PNG written");
    let img = image::open(&path).expect("PNG decodes").to_rgba8();
    assert_eq!([img.width(), img.height()], tpslab::ui::plot_png::PNG_SIZE);
    // A light page with dark text and axes, and coloured curve and points.
    let page = *img.get_pixel(2, 2);
    assert!(page.0[0] > 200 && page.0[3] == 255, "background {page:?}");
    let dark = img
        .pixels()
        .filter(|p| p.0[..3].iter().all(|c| *c < 100))
        .count();
    let colored = img
        .pixels()
        .filter(|p| {
            let (mx, mn) = (p.0[..3].iter().max(), p.0[..3].iter().min());
            mx.zip(mn).is_some_and(|(a, b)| a - b > 60)
        })
        .count();
    let total = (img.width() * img.height()) as usize;
    eprintln!("dark {dark}, coloured {colored} of {total} pixels");
    assert!(dark > total / 1000, "text and axes: {dark} dark pixels");
    assert!(
        colored > 200,
        "the curve and its points: {colored} coloured pixels"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn saved_state_loads_from_older_or_partial_json() {
    // Fields missing from old saves take their defaults.
    let s: AppState = serde_json::from_str(r#"{"tab":"Dashboard","chat":{"active":1}}"#)
        .expect("partial state parses");
    assert_eq!(s.chat.conversations.len(), 1);
    assert_eq!(
        s.dash,
        tpslab::ui::panels::dashboard::DashSettings::default()
    );
    assert_eq!(s.device, DevicePref::Auto);
    let s: AppState = serde_json::from_str(r#"{"device":{"Cuda":1}}"#).expect("device parses");
    assert_eq!(s.device, DevicePref::Cuda(1));
    let round: AppState =
        serde_json::from_str(&serde_json::to_string(&s).expect("serializes")).expect("parses");
    assert_eq!(round, s);
}

/// The saved state is written whole or not at all: a crash mid-save (a temporary file left
/// half written beside it) leaves the last whole save, which loads; a torn file does not load
/// as some other state.
#[test]
fn the_state_file_is_replaced_whole() {
    use tpslab::ui::state_file;
    let dir = std::env::temp_dir().join(format!("tpslab-state-{}", std::process::id()));
    let path = dir.join("window-state.json");
    let mut s = AppState {
        device: DevicePref::Cuda(1),
        ..AppState::default()
    };
    state_file::save(&path, &s).expect("save");
    assert_eq!(state_file::load::<AppState>(&path), Some(s.clone()));
    // What a save killed half-way leaves: its temporary file, never the state file itself.
    let whole = std::fs::read(&path).expect("read");
    std::fs::write(
        dir.join(".window-state.json.1-2-3.tmp"),
        &whole[..whole.len() / 2],
    )
    .expect("write");
    assert_eq!(state_file::load::<AppState>(&path), Some(s.clone()));
    s.device = DevicePref::Auto;
    state_file::save(&path, &s).expect("save again");
    assert_eq!(state_file::load::<AppState>(&path), Some(s));
    // A torn file (as eframe's in-place rewrite could leave) is no state at all.
    std::fs::write(&path, &whole[..whole.len() / 2]).expect("tear");
    assert_eq!(state_file::load::<AppState>(&path), None);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Runs frames until the engine is up or its start failed (shown in the status bar).
fn wait_for_engine_or_failure(h: &mut Harness<'static, TpsApp>) {
    // The first run may fetch the default model with pip.
    wait_until(h, "the engine to start or fail", 600, |h| {
        h.state().engine().is_some() || has(h, "Engine not running")
    });
}

/// True when this machine has a GPU the engine took (then the CPU-fallback checks don't apply).
fn on_gpu(h: &Harness<'static, TpsApp>) -> bool {
    h.state()
        .engine()
        .is_some_and(|e| e.stats().device.starts_with("CUDA"))
}

#[test]
fn device_auto_without_a_gpu_runs_on_the_cpu_and_says_why() {
    let mut h = harness_on(AppState::default(), DeviceChoice::Auto);
    wait_for_engine_or_failure(&mut h);
    if on_gpu(&h) {
        wait_until(&mut h, "the GPU backend and VRAM", 10, |h| {
            has(h, "Backend: CUDA") && has(h, "VRAM")
        });
        return;
    }
    // The fallback note and the CPU backend are in the status bar, memory parts apart.
    wait_until(&mut h, "the fallback note and the CPU backend", 10, |h| {
        has(h, "using CPU") && has(h, "Backend: CPU, 1 threads") && has(h, "activations")
    });
    let note = h.state().engine().expect("engine").stats().device_note;
    eprintln!("note: {note:?}");
    assert!(note.is_some_and(|n| n.ends_with("; using CPU")));

    // Choosing CPU restarts the engine on a worker, without the note; the choice is saved.
    h.get_by_label("CPU").click();
    wait_until(&mut h, "the engine restarted on the CPU", 60, |h| {
        h.state()
            .engine()
            .is_some_and(|e| e.stats().device_note.is_none())
            && has(h, "Backend: CPU, 1 threads")
            && !has(h, "using CPU")
    });
    assert_eq!(h.state().state.device, DevicePref::Cpu);

    // Choosing CUDA here fails: the reason is shown, the CPU engine runs on, the choice reverts.
    h.get_by_label("CUDA").click();
    wait_until(&mut h, "the CUDA start error", 60, |h| {
        has(h, "cannot start the engine on cuda:0: ")
            && has(h, "the engine runs on as before (cpu)")
            && h.state().engine().is_some()
    });
    assert_eq!(h.state().state.device, DevicePref::Cpu);
    assert!(has(&h, "Backend: CPU, 1 threads"));
}

#[test]
fn device_cuda_without_a_gpu_shows_the_error_and_the_window_carries_on() {
    let mut h = harness_on(AppState::default(), DeviceChoice::Cuda(0));
    wait_for_engine_or_failure(&mut h);
    if on_gpu(&h) {
        return;
    }
    // Shown once, with its reason, in the status bar.
    let shown = h
        .query_all_by_label_contains("Engine not running: cannot start the engine on cuda:0: ")
        .count();
    assert_eq!(shown, 1);
    // The window still works: tabs switch, and the CPU can be chosen instead.
    h.get_by_label("Dashboard").click();
    h.step();
    assert!(h.query_by_label("Knobs").is_some());
    h.get_by_label("CPU").click();
    wait_until(&mut h, "the engine to start on the CPU", 600, |h| {
        h.state().engine().is_some() && has(h, "Backend: CPU, 1 threads")
    });
}

/// Plain HTTP/1.1 GET or POST on loopback; the status code and body (`None`: nothing listens).
fn http(addr: &str, method: &str, path: &str, body: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(60))).ok()?;
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    Some((status, out.split_once("\r\n\r\n")?.1.to_string()))
}

#[test]
fn the_api_server_starts_from_the_window_and_serves_its_engine() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut state = AppState::default();
    state.dash.server.port = port;
    let mut h = harness(state);
    wait_for_model(&mut h);
    h.get_by_label("Dashboard").click();
    h.step();
    h.get_by_label("Start API server").click();
    let url = format!("Serving http://{addr}/v1");
    wait_until(&mut h, "the server to run", 10, |h| has(h, &url));
    let (status, body) = http(&addr, "GET", "/v1/models", "").expect("the server answers");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("SmolLM2-135M-Instruct"), "{body}");
    // The same server as `tpslab serve`: llama-server's health check, OpenAI's retrieve.
    let ok = Some((200, r#"{"status":"ok"}"#.to_string()));
    assert_eq!(http(&addr, "GET", "/health", ""), ok);
    let (status, body) = http(&addr, "GET", "/v1/models/nope", "").expect("retrieve");
    assert!(status == 404 && body.contains("model_not_found"), "{body}");
    // A completion through the API runs on the window's engine.
    let before = h
        .state()
        .engine()
        .expect("engine")
        .stats()
        .live
        .counters
        .generation_tokens_total;
    let req = r#"{"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0, "ignore_eos": true}"#;
    let (status, body) = http(&addr, "POST", "/v1/completions", req).expect("completion");
    assert_eq!(status, 200, "{body}");
    wait_until(&mut h, "the engine to count the API's tokens", 10, |h| {
        let s = h.state().engine().expect("engine").stats();
        s.live.counters.generation_tokens_total == before + 4
    });

    // The same sweep on this engine and, through the API, as a remote endpoint: two curves
    // side by side, the remote one timed on the client side.
    {
        let load = &mut h.state_mut().state.dash.load;
        load.prompt_len = 16;
        load.output_len = 4;
        load.sweep_max = 2;
        load.sweep_requests_per_slot = 1;
    }
    h.get_by_label("Run sweep").click();
    wait_until(&mut h, "the local sweep", 120, |h| {
        has(h, "c=2:") && h.query_by_label("Run sweep").is_some()
    });
    h.state_mut().state.dash.load.remote = RemoteSettings {
        enabled: true,
        url: format!("http://{addr}"),
        ..RemoteSettings::default()
    };
    h.step();
    h.get_by_label("Run sweep").click();
    let remote = format!("remote http://{addr} (SmolLM2-135M-Instruct");
    wait_until(&mut h, "the remote sweep beside the local one", 120, |h| {
        h.query_by_label("Run sweep").is_some()
            && h.query_all_by_label_contains("c=2:").count() == 2
            && has(h, &remote)
            && has(h, "CPU, 1 threads  vs  ")
    });
    // A load on the remote endpoint: the live plots carry its figures, measured here, and say
    // whose they are; with a TTFT objective of ten minutes every request counts for goodput.
    h.state_mut().state.dash.load.slo_ttft_ms = 600_000.0;
    h.step();
    h.get_by_label("Start load").click();
    wait_until(&mut h, "the remote load's live plots", 60, |h| {
        has(h, &format!("· remote · {remote}")) && has(h, "Load running")
    });
    h.get_by_label("Stop load").click();
    wait_until(&mut h, "the remote load's summary", 60, |h| {
        h.query_by_label_contains("Last load (").is_some()
            && h.query_by_label("Start load").is_some()
    });
    assert!(has(&h, "Goodput: "), "the goodput line");

    // An endpoint nothing listens on: the window says so and carries on.
    h.state_mut().state.dash.load.remote.url = "http://127.0.0.1:9".into();
    h.step();
    h.get_by_label("Start load").click();
    wait_until(&mut h, "the endpoint error", 30, |h| {
        h.state()
            .errors()
            .iter()
            .any(|e| e.contains("remote endpoint: cannot reach"))
    });

    h.get_by_label("Stop API server").click();
    wait_until(&mut h, "the server to stop", 30, |h| {
        h.query_by_label("Start API server").is_some()
            && http(&addr, "GET", "/v1/models", "").is_none()
    });
}

/// A model whose chat template never ends: the answer says why in the chat, and frames went on
/// while the template ran (its render is on a worker, never in a frame).
#[test]
fn a_runaway_chat_template_is_an_error_in_the_chat_not_a_frozen_window() {
    let dir = std::env::temp_dir().join(format!("tpslab-gui-runaway-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let path = runaway::model_with_template(&dir, runaway::NESTED_LOOPS, "Runaway Window");
    let mut h = harness_with(
        greedy_chat(8),
        path.to_str().expect("utf8 path"),
        DeviceChoice::Cpu,
        [1000.0, 800.0],
    );
    wait_for_model(&mut h);
    type_message(&mut h, "Hello");
    h.get_by_label("Send").click();
    let mut frames_while_rendering = 0;
    wait_until(&mut h, "the template's error in the chat", 60, |h| {
        let finish = last_message(h).map(|(_, _, f)| f).unwrap_or_default();
        frames_while_rendering += usize::from(finish == "preparing the prompt");
        finish.contains("was stopped")
    });
    assert!(
        frames_while_rendering > 0,
        "no frame was drawn while the template ran"
    );
    assert!(
        has(&h, "ran past its budget"),
        "the error is shown in the chat"
    );
    // The window goes on: a new conversation opens.
    let before = h.state().state.chat.conversations.len();
    h.get_by_label("New chat").click();
    h.step();
    assert_eq!(h.state().state.chat.conversations.len(), before + 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A thinking model's answer (the default model under DeepSeek-R1's real template, whose prompt
/// opens `<think>`): its reasoning is shown apart from the answer, folded under a header with its
/// own token count and time, and unfolds on a click.
#[test]
fn reasoning_is_shown_apart_and_folded() {
    let dir = std::env::temp_dir().join(format!("tpslab-gui-reasoning-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let template = llamacpp::template("deepseek-ai-DeepSeek-R1-Distill-Qwen-32B");
    let path = runaway::model_with_template(&dir, &template, "Thinking Window");
    let mut h = harness_with(
        greedy_chat(12),
        path.to_str().expect("utf8 path"),
        DeviceChoice::Cpu,
        [1000.0, 800.0],
    );
    wait_for_model(&mut h);
    type_message(&mut h, "Hello");
    h.get_by_label("Send").click();
    wait_until(&mut h, "the answer to end", 120, |h| {
        let finish = last_message(h).map(|(_, _, f)| f).unwrap_or_default();
        finish == "length" || finish == "stop"
    });
    let chat = &h.state().state.chat;
    let conv = chat
        .conversations
        .iter()
        .find(|c| c.id == chat.active)
        .expect("conversation");
    let m = conv.messages.last().expect("answer").clone();
    let stats = m.stats.clone().expect("stats");
    assert!(!m.reasoning.trim().is_empty(), "no reasoning in {m:?}");
    assert!(
        !m.text.contains(m.reasoning.trim()),
        "the reasoning leaked into the answer: {m:?}"
    );
    assert!(
        stats.reasoning_tokens >= 1 && stats.reasoning_tokens <= stats.tokens,
        "{stats:?}"
    );
    assert!(stats.reasoning_ms.is_some(), "{stats:?}");
    let header = format!("Thinking · {} tokens · ", stats.reasoning_tokens);
    assert!(has(&h, &header), "no header {header:?}");
    // Folded: the reasoning's text is not on screen until the header is clicked.
    let probe: String = m.reasoning.trim().chars().take(12).collect();
    assert!(!has(&h, &probe), "the reasoning is shown unfolded");
    h.get_by_label_contains("Thinking · ").click();
    h.run();
    assert!(has(&h, &probe), "the reasoning does not unfold");
    let _ = std::fs::remove_dir_all(&dir);
}

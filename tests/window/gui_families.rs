//! The window runs every architecture family and every weight type (egui_kittest), on the CPU
//! through the real engine.
//!
//! Families: the tiny random model of each, the files `tpslab_engine::model::tiny` writes, with the llama.cpp vocabulary
//! each family is held against in tests/parity/arch_reference.rs (tests/data/arch_refs.json names it),
//! in a temporary library; each is selected in the Models panel, loaded with its Load button,
//! and sent a chat message through the real engine on the CPU. Random weights say nothing
//! useful, so the test checks what arrived (tokens, a non-empty answer, its TTFT and tok/s
//! figures, the precision and batch labels), not the words.
//!
//! Weight types: the dashboard's live precision knob offers each type the CPU kernels quantize
//! and run; the default model is re-quantized to each of the newer ones in turn, the labels
//! follow, and it still answers a chat. Waits are bounded loops of frames, never timing checks.

use crate::gui_wait;
use crate::llamacpp;
use gui_wait::wait_until;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use egui::accesskit::Role;
use egui_kittest::Harness;
use egui_kittest::kittest::Queryable;
use serde_json::Value;
use tpslab::ui::files::{DialogAnswer, FixedDialog};
use tpslab::ui::panels::chat::{AnswerStats, Conversation, Role as ChatRole, answer_stats_text};
use tpslab::ui::{AppOptions, AppState, Tab, TpsApp};
use tpslab_engine::device::DeviceChoice;
use tpslab_engine::model::tiny::{tokenizer_of, write_tiny};
use tpslab_engine::serving::requant::LIVE_TYPES;
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_kernels::WType;

/// The families and their vocabularies, as the llama.cpp references were recorded.
const REFS: &str = include_str!("../data/arch_refs.json");
/// A short answer: enough for a first token and some decoding.
const MAX_TOKENS: usize = 6;
/// A path that does not exist: the window starts without an engine, as after a fresh install.
const NO_MODEL: &str = "/nonexistent/tpslab-families-test.gguf";

struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// (family, vocabulary) for every family llama.cpp runs, in the references' order.
fn families() -> Vec<(String, String)> {
    let refs: Value = serde_json::from_str(REFS).expect("arch_refs.json");
    let variants = refs["variants"].as_object().expect("variants");
    variants
        .iter()
        .map(|(arch, v)| (arch.clone(), v["vocab"].as_str().expect("vocab").to_owned()))
        .collect()
}

fn file_name(arch: &str) -> String {
    format!("tiny-{arch}.gguf")
}

/// One conversation per family, greedy and short; titled so that sending keeps the title.
fn conversations(families: &[(String, String)]) -> AppState {
    let mut state = AppState {
        tab: Tab::Models,
        ..AppState::default()
    };
    state.chat.conversations = (1..)
        .zip(families)
        .map(|(id, (arch, _))| Conversation {
            id,
            title: format!("Talk to {arch}"),
            sampling: SamplingParams::greedy(),
            max_tokens: MAX_TOKENS,
            ..Conversation::default()
        })
        .collect();
    state.chat.active = 1;
    state
}

/// The window on the CPU with one compute thread, its library in `lib`, loading `model`.
fn harness(state: AppState, model: &str, lib: &Path) -> Harness<'static, TpsApp> {
    let mut app = TpsApp::new(
        state,
        AppOptions {
            model: model.into(),
            threads: 1,
            device: Some(DeviceChoice::Cpu),
        },
    );
    app.set_library_dir(lib.to_path_buf());
    // Never a real file dialog in a test (it could block on zenity).
    app.set_file_dialog(Arc::new(FixedDialog(DialogAnswer::Cancelled)));
    Harness::builder()
        .with_size([1500.0, 1100.0])
        // Random weights answer with any token, in any script.
        .allow_missing_glyphs()
        .build_ui_state(|ui, app: &mut TpsApp| app.app_ui(ui), app)
}

fn has(h: &Harness<'static, TpsApp>, text: &str) -> bool {
    h.query_all_by_label_contains(text).next().is_some()
}

/// The open conversation's last message, if the assistant's: (text, stats).
fn last_answer(h: &Harness<'static, TpsApp>) -> Option<(String, Option<AnswerStats>)> {
    let chat = &h.state().state.chat;
    let conv = chat.conversations.iter().find(|c| c.id == chat.active)?;
    let m = conv.messages.last()?;
    (m.role == ChatRole::Assistant).then(|| (m.text.clone(), m.stats.clone()))
}

/// Selects `arch`'s row in the Models panel and loads it with the Load button.
fn load_family(h: &mut Harness<'static, TpsApp>, arch: &str, path: &Path) {
    let name = file_name(arch);
    // The library is a page of its own, chosen in the top bar.
    h.get_by_label("Models").click();
    h.step();
    h.get_by_label(&name).click();
    h.step();
    wait_until(h, &format!("{name} to be selected"), 10, |h| {
        has(h, &format!("Selected: {name}"))
    });
    h.get_by_label("Load").click();
    wait_until(h, &format!("{arch} to run"), 300, |h| {
        h.state().engine().is_some()
            && h.state().loaded_model().is_some_and(|p| p == path)
            && has(h, &format!("Model: {name}"))
    });
    // The tiny files are F32, and the status bar says so.
    wait_until(h, &format!("{arch}'s precision"), 10, |h| {
        has(h, "Precision: F32") && has(h, "Backend: CPU, 1 threads")
    });
}

/// Opens `arch`'s conversation, sends a message and waits for the whole answer.
fn chat_with(h: &mut Harness<'static, TpsApp>, arch: &str) -> (String, AnswerStats) {
    h.get_by_label("Chat").click();
    h.step();
    h.get_by_label(&format!("Talk to {arch}")).click();
    // The choice is applied at the end of that frame; the next one draws its input box.
    h.run_steps(2);
    send_and_wait(h, arch)
}

/// Sends a message in the open conversation and waits for the whole answer.
fn send_and_wait(h: &mut Harness<'static, TpsApp>, arch: &str) -> (String, AnswerStats) {
    h.get_by_label("Message").focus();
    h.step();
    h.get_by_label("Message")
        .type_text("Hello! Say something about the sea.");
    h.step();
    h.get_by_label("Send").click();
    let mut streamed = false;
    wait_until(h, &format!("{arch}'s answer"), 120, |h| {
        last_answer(h).is_some_and(|(text, stats)| {
            let finish = stats.as_ref().map_or("", |s| s.finish.as_str());
            // Seen while the answer is still coming: it streams, not arrives at once.
            streamed |= !text.is_empty() && finish == "streaming";
            // Ended: a final reason, and the input is idle again (Send back, no Stop).
            !matches!(finish, "" | "streaming" | "preparing the prompt")
        }) && h.query_by_label("Stop").is_none()
    });
    let (text, stats) = last_answer(h).expect("an answer");
    let stats = stats.expect("the answer's figures");
    eprintln!(
        "{arch}: {:?} ({}), streamed frames seen: {streamed}",
        text,
        answer_stats_text(&stats)
    );
    (text, stats)
}

/// Tokens arrived and made text, and the figures were measured. (Whitespace counts as text:
/// greedy on random weights, the tiny Gemmas answer with newlines.)
fn answered(text: &str, stats: &AnswerStats) -> bool {
    !text.is_empty()
        && stats.tokens >= 1
        && stats.tokens <= MAX_TOKENS
        && (stats.finish == "length" || stats.finish == "stop")
        && stats.ttft_ms.is_some_and(|t| t > 0.0)
        && (stats.tokens < 2 || stats.decode_tps.is_some_and(|t| t > 0.0))
}

/// The answer's figures line is on screen under it, with every figure filled in.
fn figures_on_screen(h: &mut Harness<'static, TpsApp>, what: &str, stats: &AnswerStats) {
    let line = answer_stats_text(stats);
    wait_until(h, &format!("{what}'s figures on screen"), 10, |h| {
        has(h, &line)
    });
    assert!(!line.contains('–'), "{what}: a figure is missing: {line}");
}

#[test]
fn the_window_loads_each_tiny_family_and_chats_with_it() {
    let families = families();
    // As many as the families' dense variants llama.cpp runs (each has references).
    let dense = tpslab_engine::model::tiny::variants()
        .into_iter()
        .filter_map(tpslab_engine::model::tiny::spec)
        .filter(|t| t.reference_vocab.is_some() && t.experts.is_none())
        .count();
    assert_eq!(families.len(), dense, "{families:?}");
    let home = std::env::temp_dir().join(format!("tpslab-gui-families-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let tmp = Tmp(home);
    let lib = tmp.0.join("models");
    std::fs::create_dir_all(&lib).expect("temp library");
    let mut paths = Vec::new();
    for (arch, vocab) in &families {
        let path = lib.join(file_name(arch));
        let tokenizer = tokenizer_of(&llamacpp::vocab(vocab)).expect("vocabulary");
        write_tiny(arch, &tokenizer, &path).expect("tiny model");
        paths.push(path);
    }

    let mut h = harness(conversations(&families), NO_MODEL, &lib);
    wait_until(&mut h, "the library to list every family", 120, |h| {
        h.state()
            .library()
            .is_some_and(|l| !l.scanning() && l.models.len() == families.len())
    });
    // Each file is read as the family it was written as.
    for (arch, _) in &families {
        let lib = h.state().library().expect("library");
        let entry = (lib.models.iter())
            .find(|m| m.name == file_name(arch))
            .unwrap_or_else(|| panic!("{arch} is not listed"));
        assert_eq!(&entry.arch, arch);
        assert_eq!(entry.precision.to_string(), "F32", "{arch}");
    }

    let mut failed = Vec::new();
    for ((arch, _), path) in families.iter().zip(&paths) {
        load_family(&mut h, arch, path);
        let (text, stats) = chat_with(&mut h, arch);
        if !answered(&text, &stats) {
            failed.push(format!("{arch}: answer {text:?}, figures {stats:?}"));
            continue;
        }
        figures_on_screen(&mut h, arch, &stats);
    }
    assert!(failed.is_empty(), "{failed:#?}");

    // The dashboard's labels carry the batch cap and the precision of the last model.
    h.get_by_label("Dashboard").click();
    wait_until(&mut h, "the dashboard's labels", 10, |h| {
        has(h, "engine: batch cap") && has(h, "batch cap ") && has(h, "· F32 · CPU")
    });
    // A dense model has no expert view.
    assert!(
        !has(&h, "Expert weights read"),
        "a dense model shows expert figures"
    );
    let counters = h.state().engine().expect("engine").stats().live.counters;
    assert!(
        counters.generation_tokens_total >= 1,
        "the last engine counted no tokens: {counters:?}"
    );
    drop(h);
}

/// A mixture of experts (the tiny qwen3moe, Qwen's vocabulary) answers in the window, and the
/// dashboard shows what its steps read of the experts: the share of expert weights per step and
/// the tokens each expert got in the latest step, drawn from the engine's own counts.
#[test]
fn the_dashboard_shows_what_a_mixture_of_experts_reads() {
    let home = std::env::temp_dir().join(format!("tpslab-gui-moe-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let tmp = Tmp(home);
    let lib = tmp.0.join("models");
    std::fs::create_dir_all(&lib).expect("temp library");
    let path = lib.join(file_name("qwen3moe"));
    let tokenizer = tokenizer_of(&llamacpp::vocab("qwen2")).expect("vocabulary");
    write_tiny("qwen3moe", &tokenizer, &path).expect("tiny model");
    let families = [("qwen3moe".to_owned(), "qwen2".to_owned())];
    let mut h = harness(conversations(&families), &path.display().to_string(), &lib);
    wait_until(&mut h, "the MoE model to run", 300, |h| {
        h.state().engine().is_some() && has(h, "Precision: F32")
    });
    let (text, stats) = chat_with(&mut h, "qwen3moe");
    assert!(
        answered(&text, &stats),
        "answer {text:?}, figures {stats:?}"
    );

    let engine = h.state().engine().expect("engine").stats();
    let load = engine
        .live
        .experts
        .clone()
        .expect("the engine's expert load");
    let counters = &engine.live.counters;
    let share = counters.expert_share().expect("an expert share");
    assert!(share > 0.0 && share <= 1.0, "share {share}: {counters:?}");
    // Every MoE layer routed each token of the step to 4 of its 8 experts (the tiny file).
    let routed: u32 = load.tokens_per_expert.iter().sum();
    assert_eq!(load.tokens_per_expert.len(), 8, "{load:?}");
    assert!(load.layers >= 1 && routed > 0, "{load:?}");
    assert_eq!(routed % (load.layers * 4), 0, "{load:?}");

    h.get_by_label("Dashboard").click();
    wait_until(&mut h, "the dashboard's expert view", 20, |h| {
        has(h, "Expert weights read per step (%)") && has(h, "Tokens per expert, latest step")
    });
    let shown = h
        .state()
        .history()
        .experts
        .clone()
        .expect("the window's expert load");
    assert_eq!(shown.tokens_per_expert.len(), load.tokens_per_expert.len());
    let title = format!("mean of {} layers;", shown.layers);
    assert!(has(&h, &title), "no {title:?} on screen");

    // The top bar's "Experts on CPU" (--n-cpu-moe): on the CPU it says it applies on a GPU;
    // applied, the engine restarts with it, the plots mark it and the choice is saved.
    assert!(has(&h, "(applies on a GPU)"));
    h.get_by_role_and_label(Role::SpinButton, "Experts on CPU")
        .set_value_accesskit(1.0);
    h.run();
    h.get_by_label("Apply").click();
    wait_until(&mut h, "the engine to restart", 60, |h| {
        h.state().engine().is_some()
            && (h.state().history().marks.iter())
                .any(|m| m.text == "experts of 0 -> 1 blocks on the CPU")
    });
    assert_eq!(h.state().state.cpu_moe_layers, 1);
    assert_eq!(h.state().state.placement().cpu_moe_layers, 1);
    assert!(
        h.query_by_label("Apply").is_none(),
        "applied: nothing left to apply"
    );
    drop(h);
}

/// The CPU weight types added after the knob's first nine, and the precision label each gives
/// SmolLM2: its 576-wide rows fall back for the 256-element types, as llama.cpp's do.
const NEW_TYPES: [(WType, &str); 6] = [
    (WType::Q5_0, "Q5_0"),
    (WType::Q5_1, "Q5_1"),
    (WType::IQ4NL, "IQ4_NL"),
    (WType::IQ4XS, "IQ4_XS+IQ4_NL"),
    (WType::Q3K, "Q3_K+Q4_0"),
    (WType::Q2K, "Q2_K+Q4_0"),
];

#[test]
fn the_live_precision_knob_offers_and_serves_the_newer_cpu_weight_types() {
    let home = std::env::temp_dir().join(format!("tpslab-gui-precision-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&home);
    let tmp = Tmp(home);
    let lib = tmp.0.join("models");
    std::fs::create_dir_all(&lib).expect("temp library");
    let model = tpslab_engine::library::resolve_model("default", &mut |m| eprintln!("{m}"))
        .expect("the default model");
    let mut state = AppState::default();
    state.chat.conversations = vec![Conversation {
        id: 1,
        title: "Talk to every type".into(),
        sampling: SamplingParams::greedy(),
        max_tokens: MAX_TOKENS,
        ..Conversation::default()
    }];
    state.chat.active = 1;
    let mut h = harness(state, &model.display().to_string(), &lib);
    // The first run may fetch the default model.
    wait_until(&mut h, "the default model to run", 600, |h| {
        h.state().engine().is_some() && has(h, "Precision: Q4_1")
    });
    h.get_by_label("Dashboard").click();
    h.step();
    let mut failed = Vec::new();
    for (ty, label) in NEW_TYPES {
        h.get_by_role_and_label(Role::ComboBox, "Weight precision")
            .click();
        h.run_steps(2);
        // Every type the knob offers is in the list each time it opens.
        for offered in LIVE_TYPES {
            assert!(
                h.query_all_by_label(offered.name()).next().is_some(),
                "{offered} is not offered"
            );
        }
        h.get_by_label(ty.name()).click();
        let started = std::time::Instant::now();
        wait_until(&mut h, &format!("the engine to take {ty}"), 30, |h| {
            let s = h.state().engine().expect("engine").stats();
            s.requantizing == Some(ty) || s.precision.is_some_and(|p| p.main == ty)
        });
        wait_until(&mut h, &format!("the engine to serve {ty}"), 300, |h| {
            let s = h.state().engine().expect("engine").stats();
            assert!(s.last_error.is_none(), "{ty}: {:?}", s.last_error);
            s.requantizing.is_none() && s.precision.is_some_and(|p| p.main == ty)
        });
        eprintln!(
            "{ty}: re-quantized in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let p = (h.state().engine().expect("engine").stats().precision).expect("precision");
        assert_eq!(p.to_string(), label, "{ty}");
        wait_until(&mut h, &format!("the {label} labels"), 10, |h| {
            has(h, &format!("Precision: {label}")) && has(h, &format!("· {label} · CPU"))
        });
        // It still answers.
        h.get_by_label("Chat").click();
        h.step();
        let (text, stats) = send_and_wait(&mut h, ty.name());
        if answered(&text, &stats) {
            figures_on_screen(&mut h, ty.name(), &stats);
        } else {
            failed.push(format!("{ty}: answer {text:?}, figures {stats:?}"));
        }
        h.get_by_label("Dashboard").click();
        h.step();
    }
    assert!(failed.is_empty(), "{failed:#?}");
    drop(h);
}

//! Precision as a live knob on the real model: the engine re-quantizes its weights in memory while
//! a request is in flight (which still ends with every token), the new weights give exactly what
//! the same re-quantization done offline gives, going back to the file's type gives back the
//! original tokens, and a failure (the file broken since it was loaded) leaves the old weights
//! serving.

use std::sync::mpsc;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tpslab_engine::model::LoadedModel;
use tpslab_engine::sched::stop::{FinishReason, StopCriteria};
use tpslab_engine::serving::engine::{EngineConfig, EngineHandle, EngineSnapshot, Event, Request};
use tpslab_engine::serving::requant::{matrix_type, requantize};
use tpslab_kernels::WType;

fn model_path() -> std::path::PathBuf {
    tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("model")
}

fn model() -> Arc<LoadedModel> {
    static M: OnceLock<Arc<LoadedModel>> = OnceLock::new();
    M.get_or_init(|| Arc::new(LoadedModel::load(&model_path()).expect("load")))
        .clone()
}

fn engine(lm: Arc<LoadedModel>) -> EngineHandle {
    let config = EngineConfig {
        threads: 2,
        ..Default::default()
    };
    EngineHandle::start(lm, config, None).expect("engine")
}

fn request(lm: &LoadedModel, text: &str, max_tokens: usize) -> Request {
    Request {
        prompt: lm.raw_prompt(text).expect("tokenize"),
        stop: StopCriteria {
            max_tokens: Some(max_tokens),
            ignore_eos: true,
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The tokens of one request, run to its end (asserted to end by length).
fn collect(rx: &mpsc::Receiver<Event>) -> Vec<u32> {
    let mut out = Vec::new();
    loop {
        match rx
            .recv_timeout(Duration::from_secs(300))
            .expect("engine answers")
        {
            Event::Token { token, .. } => out.push(token),
            Event::Finished { reason, .. } => {
                assert_eq!(reason, FinishReason::Length);
                return out;
            }
            Event::Refused { reason, .. } => panic!("refused: {reason}"),
            Event::Started { .. } | Event::PromptLogprobs { .. } | Event::Embedding { .. } => {}
        }
    }
}

fn greedy(engine: &EngineHandle, lm: &LoadedModel, text: &str, n: usize) -> Vec<u32> {
    let (tx, rx) = mpsc::channel();
    engine.submit(request(lm, text, n), tx);
    collect(&rx)
}

fn wait_for(
    engine: &EngineHandle,
    what: &str,
    done: impl Fn(&EngineSnapshot) -> bool,
) -> EngineSnapshot {
    let t0 = Instant::now();
    loop {
        let s = engine.stats();
        if done(&s) {
            return s;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "timed out waiting for {what}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

const PROMPT: &str = "The capital of France is";

/// The precision label the engine reports ("" before its first report).
fn label(s: &EngineSnapshot) -> String {
    s.precision.map_or_else(String::new, |p| p.to_string())
}

#[test]
fn precision_switch_serves_on_and_matches_offline_requantization() {
    let lm = model();
    assert_eq!(lm.precision.to_string(), "Q4_1");
    let e = engine(Arc::clone(&lm));
    let before = greedy(&e, &lm, PROMPT, 12);
    let bytes_before = e.stats().memory.weights;

    // A long request in flight across the switch: it is recomputed on the new weights, and
    // ends with every token it asked for.
    let (tx, long_rx) = mpsc::channel();
    e.submit(
        request(&lm, "Once upon a time, in a small village, there lived", 40),
        tx,
    );
    e.set_precision(WType::Q8_0);
    let s = wait_for(&e, "Q8_0", |s| label(s) == "Q8_0");
    assert!(s.last_error.is_none(), "{:?}", s.last_error);
    assert_eq!(collect(&long_rx).len(), 40);
    let (from, to, b0, b1, _) = s.last_requant.expect("last_requant");
    assert_eq!(
        (from.to_string(), to.to_string()),
        ("Q4_1".into(), "Q8_0".into())
    );
    assert_eq!((b0, b1), (bytes_before, s.memory.weights));
    assert!(
        b1 > b0,
        "Q8_0 weights ({b1} B) should be larger than Q4_1 ({b0} B)"
    );

    // The engine's Q8_0 tokens are those of the same re-quantization done offline.
    let after = greedy(&e, &lm, PROMPT, 12);
    let (q8, report) = requantize(&lm, WType::Q8_0, 2).expect("requantize");
    assert!(report.from_file);
    assert_eq!(q8.precision.to_string(), "Q8_0");
    let q8 = Arc::new(q8);
    let offline = greedy(&engine(Arc::clone(&q8)), &q8, PROMPT, 12);
    assert_eq!(after, offline);

    // Back to the file's own type: the weights come from the file again, so the tokens are
    // the original ones exactly.
    e.set_precision(WType::Q4_1);
    let s = wait_for(&e, "Q4_1", |s| label(s) == "Q4_1");
    assert_eq!(s.memory.weights, bytes_before);
    assert_eq!(greedy(&e, &lm, PROMPT, 12), before);
}

#[test]
fn a_failed_switch_keeps_the_old_weights_serving() {
    let dir = std::env::temp_dir().join(format!("tpslab-precision-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let copy = dir.join("model.gguf");
    std::fs::copy(model_path(), &copy).expect("copy");
    let lm = Arc::new(LoadedModel::load(&copy).expect("load"));
    // The file is overwritten after loading: re-reading it for the new weights fails.
    std::fs::write(&copy, b"GGUF but not really").expect("overwrite");
    let e = engine(Arc::clone(&lm));
    e.set_precision(WType::Q8_0);
    let s = wait_for(&e, "the error", |s| s.last_error.is_some());
    let err = s.last_error.clone().unwrap_or_default();
    assert!(
        err.contains("precision unchanged") && err.contains("model.gguf"),
        "{err}"
    );
    assert_eq!(label(&s), "Q4_1");
    assert!(s.requantizing.is_none());
    assert_eq!(greedy(&e, &lm, PROMPT, 4).len(), 4);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn type_names_and_fallbacks() {
    assert_eq!("q4_k".parse(), Ok(WType::Q4K));
    assert_eq!(" Q8_0 ".parse(), Ok(WType::Q8_0));
    assert_eq!("q3_k".parse(), Ok(WType::Q3K));
    assert!("q3".parse::<WType>().is_err());
    assert_eq!(WType::Q4_1.to_string(), "Q4_1");
    // A row of 576 elements (SmolLM2's hidden size) is not a multiple of 256.
    assert_eq!(matrix_type(WType::Q4K, 576), WType::Q4_1);
    assert_eq!(matrix_type(WType::Q6K, 576), WType::Q8_0);
    assert_eq!(matrix_type(WType::Q4K, 1536), WType::Q4K);
    assert_eq!(matrix_type(WType::Q4_0, 40), WType::F16);
}

/// The knob compares types: asking a synthetic Q4_K SmolLM2 ("Q4_K+Q4_1": its 576-wide rows
/// fell back) for Q4_K again starts nothing, so a switch to Q8_0 asked right after is not
/// refused as "already re-quantizing", and its report starts from the Q4_K label.
#[test]
fn asking_for_the_type_already_served_changes_nothing() {
    let lm = Arc::new(LoadedModel::synthetic("smollm2-135m", WType::Q4K, 0, 2).expect("model"));
    assert_eq!(lm.precision.to_string(), "Q4_K+Q4_1");
    let e = engine(Arc::clone(&lm));
    e.set_precision(WType::Q4K);
    e.set_precision(WType::Q8_0);
    let s = wait_for(&e, "Q8_0 or an error", |s| {
        label(s) == "Q8_0" || s.last_error.is_some()
    });
    assert!(s.last_error.is_none(), "{:?}", s.last_error);
    let (from, to, ..) = s.last_requant.expect("last_requant");
    assert_eq!(
        (from.to_string(), to.to_string()),
        ("Q4_K+Q4_1".into(), "Q8_0".into())
    );
}

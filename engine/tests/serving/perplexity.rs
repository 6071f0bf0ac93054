//! Perplexity of the real default model on the bundled text, and of its Q8_0 quantization; a
//! cancelled run.

use std::sync::atomic::{AtomicBool, Ordering};

use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::model::LoadedModel;
use tpslab_engine::quant::quantize::{QuantizeOptions, plan, quantize_file};
use tpslab_engine::serving::perplexity::{BUNDLED_TEXT, PerplexityError, perplexity};
use tpslab_kernels::WType;

const CTX: usize = 256;

fn default_model() -> LoadedModel {
    let path =
        tpslab_engine::library::resolve_model("default", &mut |m| eprintln!("{m}")).expect("model");
    LoadedModel::load(&path).expect("load")
}

#[test]
fn default_model_perplexity_is_sane_and_q8_0_is_close() {
    let path =
        tpslab_engine::library::resolve_model("default", &mut |m| eprintln!("{m}")).expect("model");
    let lm = LoadedModel::load(&path).expect("load");
    let mut calls = 0;
    let r =
        perplexity(&lm, BUNDLED_TEXT, CTX, 2, None, &mut |_, _| calls += 1).expect("perplexity");
    eprintln!("original: {r:?}");
    assert!(r.windows >= 3 && calls == r.windows);
    assert_eq!(r.tokens_scored, r.windows * (CTX - 1 - CTX / 2));
    assert!(
        r.perplexity.is_finite() && (5.0..100.0).contains(&r.perplexity),
        "perplexity {}",
        r.perplexity
    );

    let out = std::env::temp_dir().join(format!("tpslab-ppl-q8-{}.gguf", std::process::id()));
    let f = GgufFile::open(&path).expect("open");
    let p = plan(&f, WType::Q8_0).expect("plan");
    quantize_file(&f, &p, &out, QuantizeOptions::default(), &mut |_| {}).expect("quantize");
    let q8 = LoadedModel::load(&out).expect("load Q8_0");
    let q = perplexity(&q8, BUNDLED_TEXT, CTX, 2, None, &mut |_, _| {}).expect("perplexity Q8_0");
    eprintln!("Q8_0: {q:?}");
    let rel = (q.perplexity / r.perplexity - 1.0).abs();
    assert!(
        rel < 0.03,
        "Q8_0 perplexity {} vs {}",
        q.perplexity,
        r.perplexity
    );
    let _ = std::fs::remove_file(&out);

    assert!(matches!(
        perplexity(&lm, "too short", CTX, 1, None, &mut |_, _| {}),
        Err(PerplexityError::TooShort { .. })
    ));
}

#[test]
fn a_cancelled_run_stops_before_its_next_chunk_with_a_cancelled_error() {
    let lm = default_model();
    // Cancelled before it starts: no window runs.
    let cancel = AtomicBool::new(true);
    let mut calls = 0;
    let e = perplexity(&lm, BUNDLED_TEXT, CTX, 2, Some(&cancel), &mut |_, _| {
        calls += 1
    })
    .expect_err("cancelled");
    assert!(matches!(e, PerplexityError::Cancelled), "{e}");
    assert_eq!(e.to_string(), "perplexity cancelled");
    assert_eq!(calls, 0);
    // Cancelled after the first window of several: it stops there, no later window runs.
    let cancel = AtomicBool::new(false);
    let mut windows = Vec::new();
    let e = perplexity(
        &lm,
        BUNDLED_TEXT,
        CTX,
        2,
        Some(&cancel),
        &mut |done, total| {
            windows.push((done, total));
            cancel.store(true, Ordering::Relaxed);
        },
    )
    .expect_err("cancelled");
    assert!(matches!(e, PerplexityError::Cancelled), "{e}");
    assert_eq!(windows.len(), 1, "{windows:?}");
    assert!(
        windows[0].1 >= 3,
        "the text has several windows: {windows:?}"
    );
}

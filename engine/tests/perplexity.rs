//! Perplexity of the real default model on the bundled text, and of its Q8_0 quantization.

use tpslab_engine::generate::LoadedModel;
use tpslab_engine::gguf::GgufFile;
use tpslab_engine::perplexity::{BUNDLED_TEXT, PerplexityError, perplexity};
use tpslab_engine::quantize::{QuantizeOptions, plan, quantize_file};
use tpslab_kernels::WType;

const CTX: usize = 256;

#[test]
fn default_model_perplexity_is_sane_and_q8_0_is_close() {
    let path =
        tpslab_engine::library::resolve_model("default", &mut |m| eprintln!("{m}")).expect("model");
    let lm = LoadedModel::load(&path).expect("load");
    let mut calls = 0;
    let r = perplexity(&lm, BUNDLED_TEXT, CTX, 2, &mut |_, _| calls += 1).expect("perplexity");
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
    let q = perplexity(&q8, BUNDLED_TEXT, CTX, 2, &mut |_, _| {}).expect("perplexity Q8_0");
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
        perplexity(&lm, "too short", CTX, 1, &mut |_, _| {}),
        Err(PerplexityError::TooShort { .. })
    ));
}

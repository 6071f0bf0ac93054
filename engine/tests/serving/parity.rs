//! Numerical parity with llama.cpp on the real default model, teacher-forced: at every step of
//! the reference greedy continuations the reference token must be our top choice, or a near-tie
//! with it. Free-running greedy comparisons stop meaning anything after the first near-tie (two
//! llama.cpp builds disagree there too); teacher forcing checks all 96 steps.

use tpslab_engine::device::Workspace;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::LoadedModel;
use tpslab_kernels::ThreadPool;

/// Facts from ../shared/refs/llamacpp_greedy.json (llama.cpp llama-server, greedy, same file).
const REFS: &str = include_str!("../../../tests/data/llamacpp_greedy.json");

/// Largest logit gap by which our top token may beat the reference's token. Our logits differ
/// from llama.cpp's by ~0.1-0.3 on this Q4_1 file. Measured with llama-eval-callback on "The
/// capital of France is": layer 0's Q/K/V projections and every value of the first token's
/// layer agree to ~1e-6; the later tokens' FFN inputs differ by ~0.3%, so the difference enters
/// with attention over more than one position (attention outputs agree to ~1e-4: llama.cpp's
/// CPU flash attention accumulates softmax x V in f16, we in f32), and grows over 30 layers. The
/// likely amplifier is the 8-bit activation quantization in front of every quantized matmul: a
/// 1e-4 input difference flips a rounding and moves that product by a whole step (1/254 of the
/// block's range). The F16 file, whose matmuls take unquantized activations, gives the same
/// perplexity in both engines to 1e-5 (BENCHMARKS.md). llama.cpp's own flash attention on/off
/// differ by ~0.1 at the same steps. 0.5 is still far below the typical top-1/top-2 gap.
const NEAR_TIE: f32 = 0.5;

#[test]
fn teacher_forced_greedy_matches_llama_cpp() {
    let path =
        tpslab_engine::library::ensure_default_model(&mut |m| eprintln!("{m}")).expect("model");
    let lm = LoadedModel::load(&path).expect("load");
    let refs: serde_json::Value = serde_json::from_str(REFS).expect("refs");
    let pool = ThreadPool::new(2);
    let vocab = lm.model.cfg.vocab;
    let mut exact = 0;
    let mut total = 0;
    for case in refs["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .filter(|c| c["kind"] == "raw")
    {
        let ids = |k: &str| -> Vec<u32> {
            case[k]
                .as_array()
                .expect("ids")
                .iter()
                .map(|v| v.as_u64().expect("id") as u32)
                .collect()
        };
        let (prompt, want) = (ids("prompt_token_ids"), ids("output_token_ids"));
        let n = prompt.len() + want.len();
        let table: Vec<u32> = (0..n.div_ceil(16) as u32).collect();
        let mut kv = KvCache::new(&lm.model.cfg, 16, table.len()).expect("kv");
        let mut ws = Workspace::default();
        let mut seq = prompt.clone();
        let mut pos = 0;
        for (step, &w) in want.iter().enumerate() {
            let mut b = Batch::default();
            b.push_seq(table.clone(), pos, &seq[pos..], true);
            let logits = lm
                .model
                .forward(&pool, &b, &mut kv, &mut ws)
                .expect("forward");
            assert_eq!(logits.len(), vocab);
            pos = seq.len();
            let (top, top_l) =
                logits
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f32::NEG_INFINITY),
                        |a, (i, &l)| if l > a.1 { (i, l) } else { a },
                    );
            let gap = top_l - logits[w as usize];
            assert!(
                gap <= NEAR_TIE,
                "{:?} step {step}: llama.cpp chose {w}, ours {top} by {gap:.3} logits",
                case["prompt"]
            );
            exact += usize::from(top == w as usize);
            total += 1;
            seq.push(w);
        }
    }
    eprintln!("top-1 agreement with llama.cpp: {exact}/{total}");
    // Near-ties are rare: nearly every step must agree exactly.
    assert!(
        exact + 2 >= total,
        "only {exact}/{total} steps agree exactly"
    );
}

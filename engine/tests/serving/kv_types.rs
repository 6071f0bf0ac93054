//! KV cache element types (f16, bf16, q8_0, q4_0, llama.cpp's `--cache-type-k/-v`): the tokens a
//! budget holds in each, rows read back exactly as ggml's reference quantization gives them,
//! refusals, and the real default model's greedy text and perplexity over a q8_0 cache against
//! an f16 one.

use half::{bf16, f16};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tpslab_engine::device::Workspace;
use tpslab_engine::kv::{Batch, KvCache, KvError, KvType, KvTypes};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::model::config::ModelConfig;
use tpslab_engine::serving::perplexity::{BUNDLED_TEXT, perplexity_kv};
use tpslab_kernels::ThreadPool;
use tpslab_kernels::attn::KvRows;

use crate::default_model;

fn shape(arch: &str) -> ModelConfig {
    tpslab_engine::model::synthetic::arch(arch)
        .expect("arch")
        .config
}

#[test]
fn q8_0_and_q4_0_kv_hold_1_88x_and_3_5x_the_tokens_of_f16_in_the_same_budget() {
    for arch in ["smollm2-135m", "llama-3.2-1b", "qwen2.5-0.5b"] {
        let cfg = shape(arch);
        let budget = 64 << 20;
        let tokens = |t: KvType| {
            let types = KvTypes::same(t);
            let blocks = types.pool_for_budget(&cfg, 16, budget).expect("pool");
            // The cache built from that many blocks stays inside the budget it was sized from.
            let kv = KvCache::with_types(&cfg, 16, blocks, types).expect("cache");
            assert!(
                kv.bytes() <= budget,
                "{arch} {t}: {} > {budget}",
                kv.bytes()
            );
            assert!(kv.bytes() + types.bytes_per_block(&cfg, 16) > budget);
            (blocks * 16) as f64
        };
        let f16 = tokens(KvType::F16);
        let (q8, q4, b16) = (
            tokens(KvType::Q8_0),
            tokens(KvType::Q4_0),
            tokens(KvType::BF16),
        );
        eprintln!("{arch}: f16 {f16} tokens, q8_0 {q8}, q4_0 {q4}");
        // ggml's Q8_0 spends 34 bytes on 32 values, f16 64: at most 64/34 = 1.882x, less
        // only by the rounding of the budget to whole blocks.
        let q8_bound = 64.0 / 34.0;
        assert!(
            q8 / f16 >= 0.995 * q8_bound,
            "{arch}: q8_0 holds {q8} vs f16 {f16}"
        );
        assert!(q4 / f16 >= 3.5, "{arch}: q4_0 holds {q4} vs f16 {f16}");
        assert_eq!(b16, f16);
        // K and V apart: q8_0 keys with f16 values cost the mean of the two.
        let mixed = KvTypes {
            k: KvType::Q8_0,
            v: KvType::F16,
        };
        let per = |t: KvTypes| t.bytes_per_token(&cfg);
        assert_eq!(
            2 * per(mixed),
            per(KvTypes::same(KvType::Q8_0)) + per(KvTypes::F16)
        );
    }
}

/// ggml's `quantize_row_q8_0_ref` then `dequantize_row_q8_0`, written out here on their own.
fn ref_q8_0(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(32)
        .flat_map(|b| {
            let amax = b.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let dh = f16::from_f32(d).to_f32();
            // Stored as int8, so a value that rounds to zero reads back as +0.
            b.iter()
                .map(move |v| dh * f32::from((v * id).round() as i8))
        })
        .collect()
}

/// ggml's `quantize_row_q4_0_ref` then `dequantize_row_q4_0`.
fn ref_q4_0(x: &[f32]) -> Vec<f32> {
    x.chunks_exact(32)
        .flat_map(|b| {
            let (mut amax, mut max) = (0f32, 0f32);
            for &v in b {
                if amax < v.abs() {
                    amax = v.abs();
                    max = v;
                }
            }
            let d = max / -8.0;
            let id = if d != 0.0 { 1.0 / d } else { 0.0 };
            let dh = f16::from_f32(d).to_f32();
            b.iter()
                .map(move |v| dh * (((v * id + 8.5) as i8).min(15) as f32 - 8.0))
        })
        .collect()
}

fn reference(t: KvType, x: &[f32]) -> Vec<f32> {
    match t {
        KvType::F16 => x.iter().map(|&v| f16::from_f32(v).to_f32()).collect(),
        KvType::BF16 => x.iter().map(|&v| bf16::from_f32(v).to_f32()).collect(),
        KvType::Q8_0 => ref_q8_0(x),
        KvType::Q4_0 => ref_q4_0(x),
    }
}

/// Elements of slot `slot` that differ (in bits) from `want`.
fn mismatches(rows: KvRows<'_>, slot: usize, want: &[f32]) -> usize {
    let mut got = vec![0f32; want.len()];
    rows.to_f32(slot * want.len(), &mut got);
    got.iter()
        .zip(want)
        .filter(|(a, b)| a.to_bits() != b.to_bits())
        .count()
}

#[test]
fn stored_rows_read_back_as_ggml_reference_dequantization() {
    let mut cfg = shape("smollm2-135m");
    cfg.n_layers = 2;
    let kv_dim = cfg.kv_dim();
    let mut rng = StdRng::seed_from_u64(45);
    let mut row = |scale: f32| -> Vec<f32> {
        let mut r: Vec<f32> = (0..kv_dim)
            .map(|_| rng.random_range(-1.0f32..1.0) * scale)
            .collect();
        // An outlier (K rows have them), and a block of zeros (scale 0).
        r[5] = 40.0 * scale;
        r[32..64].fill(0.0);
        r
    };
    let pairs = [
        (KvType::Q8_0, KvType::Q8_0),
        (KvType::Q4_0, KvType::Q4_0),
        (KvType::Q8_0, KvType::Q4_0),
        (KvType::BF16, KvType::F16),
    ];
    for (k, v) in pairs {
        let types = KvTypes { k, v };
        let mut kv = KvCache::with_types(&cfg, 16, 4, types).expect("cache");
        let slots = [0usize, 17, 63];
        let mut written = Vec::new();
        for (i, &slot) in slots.iter().enumerate() {
            for layer in 0..2 {
                let (kr, vr) = (row(1.0 + i as f32), row(0.01));
                kv.write(layer, slot, &kr, &vr);
                written.push((layer, slot, kr, vr));
            }
        }
        for (layer, slot, kr, vr) in &written {
            let (kc, vc) = kv.layer(*layer);
            assert_eq!(mismatches(kc, *slot, &reference(k, kr)), 0, "{types} K");
            assert_eq!(mismatches(vc, *slot, &reference(v, vr)), 0, "{types} V");
        }
        // The check sees a wrong scale: the same bytes with one block's f16 scale bumped.
        if let (_, KvRows::Blocks { ty, data }) = kv.layer(0) {
            let (slot, vr) = (written[0].1, &written[0].3);
            let mut bad = data.to_vec();
            // Block 2: block 0 holds the outlier (the rest of it rounds to 0), block 1 zeros.
            let at = slot * ty.row_bytes(kv_dim) + 2 * ty.type_size();
            bad[at] ^= 0x04;
            let bad = KvRows::Blocks { ty, data: &bad };
            // Every element but those quantized to 0 moves with the scale.
            assert!(mismatches(bad, slot, &reference(v, vr)) >= 16, "{types}");
        }
    }
}

#[test]
fn a_head_that_is_not_whole_blocks_and_unknown_names_are_refused() {
    let mut cfg = shape("smollm2-135m");
    cfg.n_layers = 1;
    cfg.head_dim = 48;
    for t in [KvType::Q8_0, KvType::Q4_0] {
        let err = KvCache::with_types(&cfg, 16, 2, KvTypes::same(t)).expect_err("refused");
        assert!(matches!(err, KvError::HeadNotBlocks { head_dim: 48, .. }));
        assert!(err.to_string().contains("use f16 or bf16"), "{err}");
    }
    for t in [KvType::F16, KvType::BF16] {
        KvCache::with_types(&cfg, 16, 2, KvTypes::same(t)).expect("whole elements");
    }
    for t in KvType::ALL {
        assert_eq!(t.name().parse::<KvType>(), Ok(t));
        assert_eq!(t.name().to_uppercase().parse::<KvType>(), Ok(t));
        let json = serde_json::to_string(&KvTypes::same(t)).expect("json");
        assert_eq!(
            serde_json::from_str::<KvTypes>(&json).expect("back"),
            KvTypes::same(t)
        );
    }
    let err = "q5_0".parse::<KvType>().expect_err("unknown");
    assert_eq!(
        err.to_string(),
        "unknown KV cache type 'q5_0' (known: f16, bf16, q8_0, q4_0)"
    );
    assert!(serde_json::from_str::<KvTypes>(r#"{"k":"fp8"}"#).is_err());
}

/// Largest logit gap by which another token may beat the f16 cache's greedy choice under a
/// quantized cache (as in `parity.rs`: near-ties may flip, nothing else may).
const NEAR_TIE: f32 = 0.5;

/// Greedy continuation of `prompt` for `n` tokens over an f16 cache, one step at a time.
fn greedy_f16(lm: &LoadedModel, pool: &ThreadPool, prompt: &[u32], n: usize) -> Vec<u32> {
    let total = prompt.len() + n;
    let table: Vec<u32> = (0..total.div_ceil(16) as u32).collect();
    let mut kv = KvCache::new(&lm.model.cfg, 16, table.len()).expect("kv");
    let mut ws = Workspace::default();
    let mut seq = prompt.to_vec();
    let mut pos = 0;
    while seq.len() < total {
        let mut b = Batch::default();
        b.push_seq(table.clone(), pos, &seq[pos..], true);
        let logits = lm
            .model
            .forward(pool, &b, &mut kv, &mut ws)
            .expect("forward");
        pos = seq.len();
        seq.push(argmax(logits).0 as u32);
    }
    seq
}

fn argmax(row: &[f32]) -> (usize, f32) {
    row.iter().copied().enumerate().fold(
        (0, f32::NEG_INFINITY),
        |a, (i, l)| if l > a.1 { (i, l) } else { a },
    )
}

/// Teacher-forced over `seq` with a cache of `types`: at each generated position, (whether our
/// top token is the f16 cache's, the logit gap to it).
fn forced(
    lm: &LoadedModel,
    pool: &ThreadPool,
    seq: &[u32],
    prompt_len: usize,
    types: KvTypes,
) -> Vec<(bool, f32)> {
    let vocab = lm.model.cfg.vocab;
    let table: Vec<u32> = (0..seq.len().div_ceil(16) as u32).collect();
    let mut kv = KvCache::with_types(&lm.model.cfg, 16, table.len(), types).expect("kv");
    let mut ws = Workspace::default();
    let mut b = Batch::default();
    b.push_seq(table, 0, seq, false);
    b.logit_rows = (prompt_len - 1..seq.len() - 1).collect();
    let logits = lm
        .model
        .forward(pool, &b, &mut kv, &mut ws)
        .expect("forward");
    logits
        .chunks_exact(vocab)
        .zip(&seq[prompt_len..])
        .map(|(row, &want)| {
            let (top, l) = argmax(row);
            (top == want as usize, l - row[want as usize])
        })
        .collect()
}

#[test]
fn default_model_greedy_text_over_a_q8_0_cache_follows_the_f16_cache() {
    let lm = default_model::model();
    let pool = ThreadPool::new(2);
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        "It is a truth universally acknowledged, that a single man in possession of a good",
    ];
    let q8 = KvTypes::same(KvType::Q8_0);
    let (mut exact, mut total, mut worst) = (0, 0, 0f32);
    for p in prompts {
        let prompt = lm.raw_prompt(p).expect("prompt");
        let seq = greedy_f16(&lm, &pool, &prompt, 48);
        // The f16 cache teacher-forced gives back its own greedy choices: the check's baseline.
        assert!(
            forced(&lm, &pool, &seq, prompt.len(), KvTypes::F16)
                .iter()
                .all(|s| s.0)
        );
        for (step, (same, gap)) in forced(&lm, &pool, &seq, prompt.len(), q8)
            .into_iter()
            .enumerate()
        {
            assert!(
                gap <= NEAR_TIE,
                "{p:?} step {step}: q8_0 KV beats f16's token by {gap}"
            );
            exact += usize::from(same);
            total += 1;
            worst = worst.max(gap);
        }
    }
    eprintln!("q8_0 KV: top-1 agreement with f16 KV {exact}/{total}, largest gap {worst:.3}");
    // Each flip is a near-tie (checked above); a cache read back wrong flips most steps.
    assert!(exact * 20 >= total * 19, "only {exact}/{total} steps agree");
}

#[test]
fn default_model_perplexity_with_q8_0_kv_is_within_1_percent_of_f16_kv() {
    let lm = default_model::model();
    let ppl = |t: KvType| {
        perplexity_kv(
            &lm,
            BUNDLED_TEXT,
            256,
            2,
            KvTypes::same(t),
            None,
            &mut |_, _| {},
        )
        .expect("perplexity")
        .perplexity
    };
    let (f16, q8, q4) = (ppl(KvType::F16), ppl(KvType::Q8_0), ppl(KvType::Q4_0));
    eprintln!("perplexity: f16 KV {f16:.4}, q8_0 KV {q8:.4}, q4_0 KV {q4:.4}");
    assert!(
        (q8 / f16 - 1.0).abs() < 0.01,
        "q8_0 KV {q8} vs f16 KV {f16}"
    );
    // q4_0 costs more, but a cache read back wrong would cost far more than this.
    assert!(
        (q4 / f16 - 1.0).abs() < 0.10,
        "q4_0 KV {q4} vs f16 KV {f16}"
    );
}

//! `quantize` on the real default model: the per-tensor types of every preset against what
//! llama.cpp's `llama-quantize` picks (a committed reference, `data/llama_quantize_types.json`),
//! the predicted size, files of several presets that load and generate, Q8_0 logits close to the
//! original's, quantizer errors on real weight rows, and no output left behind by a cancelled
//! run.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use tpslab_engine::device::Workspace;
use tpslab_engine::formats::gguf::GgufFile;
use tpslab_engine::kv::{Batch, KvCache};
use tpslab_engine::model::LoadedModel;
use tpslab_engine::quant::preset::Preset;
use tpslab_engine::quant::quantize::{QuantizeOptions, plan, quantize_file, temp_path};
use tpslab_engine::serving::generate::generate;
use tpslab_engine::serving::sampler::SamplingParams;
use tpslab_kernels::quantize::relative_rms_error;
use tpslab_kernels::{ThreadPool, WType};

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("tpslab-quantize-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    d.join(name)
}

fn default_model() -> PathBuf {
    tpslab_engine::library::resolve_model("default", &mut |m| eprintln!("{m}")).expect("model")
}

/// Quantizes the default model to `preset` at `out`, checking the prediction against the result.
fn quantize_to(preset: Preset, out: &Path) -> GgufFile {
    let f = GgufFile::open(default_model()).expect("open");
    let p = plan(&f, preset).expect("plan");
    eprintln!("{}: predicted {} bytes", p.summary(), p.output_bytes);
    let mut last = 0;
    let report = quantize_file(&f, &p, out, QuantizeOptions::default(), &mut |pr| {
        assert!(pr.bytes_done >= last && pr.bytes_done <= pr.total_bytes);
        last = pr.bytes_done;
    })
    .expect("quantize");
    assert_eq!(
        report.output_bytes, p.output_bytes,
        "predicted size is exact"
    );
    assert_eq!(std::fs::metadata(out).expect("out").len(), p.output_bytes);
    assert!(!temp_path(out).exists(), "temporary file renamed away");
    let g = GgufFile::open(out).expect("reopen");
    // Tokenizer, chat template and the rest of the metadata kept; file type set.
    for (k, v) in &f.metadata {
        if k != "general.file_type" {
            assert_eq!(g.get(k), Some(v), "metadata '{k}'");
        }
    }
    g
}

fn last_logits(lm: &LoadedModel, tokens: &[u32]) -> Vec<f32> {
    let pool = ThreadPool::new(2);
    let table: Vec<u32> = (0..tokens.len().div_ceil(16) as u32).collect();
    let mut kv = KvCache::new(&lm.model.cfg, 16, table.len()).expect("kv");
    let mut ws = Workspace::default();
    let mut b = Batch::default();
    b.push_seq(table, 0, tokens, true);
    lm.model
        .forward(&pool, &b, &mut kv, &mut ws)
        .expect("forward")
        .to_vec()
}

fn greedy_text(lm: LoadedModel) -> String {
    let lm = Arc::new(lm);
    let prompt = lm.raw_prompt("The capital of France is").expect("prompt");
    let out = generate(
        &lm,
        2,
        &prompt,
        &SamplingParams::default(),
        lm.default_stop(Some(12)),
        &mut |_| {},
    )
    .expect("generate");
    out.text
}

#[test]
fn q8_0_loads_generates_and_stays_close() {
    let orig = LoadedModel::load(&default_model()).expect("load original");
    let prompt = orig
        .raw_prompt("Once upon a time, in a small village by the sea, there lived")
        .expect("prompt");
    let want = last_logits(&orig, &prompt);

    let out8 = tmp("q8_0.gguf");
    let g = quantize_to(Preset::Q8_0, &out8);
    let differ = differing_from_llama_quantize(Preset::Q8_0, &g).expect("reference digests");
    assert!(
        differ.is_empty(),
        "Q8_0 differs from llama-quantize: {differ:?}"
    );
    assert_eq!(g.get_u64("general.file_type").expect("ftype"), 7);
    for t in &g.tensors {
        let want = if t.dims.len() == 1 {
            WType::F32
        } else {
            WType::Q8_0
        };
        assert_eq!(t.ty, want, "{}", t.name);
    }
    let q8 = LoadedModel::load(&out8).expect("load Q8_0");
    assert_eq!(q8.precision.to_string(), "Q8_0");
    let got = last_logits(&q8, &prompt);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::MIN), |a, (i, &x)| if x > a.1 { (i, x) } else { a })
            .0
    };
    let max_diff = want
        .iter()
        .zip(&got)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let spread = want.iter().fold(0f32, |m, a| m.max(a.abs()));
    eprintln!("Q8_0 vs Q4_1 original: max |logit diff| {max_diff:.3} of max |logit| {spread:.2}");
    assert_eq!(argmax(&want), argmax(&got), "same top token");
    // Q4_1 values fit Q8_0 almost exactly: only activation rounding paths differ.
    assert!(max_diff < 0.05 * spread, "logits differ by {max_diff}");
    let text = greedy_text(q8);
    eprintln!("Q8_0 greedy: {text:?}");
    assert!(!text.trim().is_empty());

    let _ = std::fs::remove_file(out8);
}

/// The reference: for each preset, the type llama-quantize gives each tensor of the default
/// model.
fn llama_quantize_types() -> Vec<(String, Vec<(String, String)>)> {
    let v: serde_json::Value =
        serde_json::from_str(include_str!("../data/llama_quantize_types.json")).expect("json");
    let names: Vec<String> = v["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|n| n.as_str().expect("name").to_string())
        .collect();
    let types = v["types"].as_object().expect("types");
    types
        .iter()
        .map(|(preset, t)| {
            let t: Vec<&str> = t.as_str().expect("types").split(' ').collect();
            assert_eq!(t.len(), names.len(), "{preset}");
            let pairs = names
                .iter()
                .zip(t)
                .map(|(n, t)| (n.clone(), t.to_string()))
                .collect();
            (preset.clone(), pairs)
        })
        .collect()
}

/// Every preset's per-tensor types on the default model are the ones llama-quantize picks
/// (output / tied embedding, attn_v and ffn_down bumps, fallbacks of the 576-wide rows to
/// Q5_0, Q5_1, Q4_0, IQ4_NL or Q8_0).
#[test]
fn every_preset_picks_llama_quantizes_types() {
    let f = GgufFile::open(default_model()).expect("open");
    let reference = llama_quantize_types();
    assert!(reference.len() >= 16, "presets in the reference");
    for want in [
        "Q8_0", "Q6_K", "Q5_K_M", "Q5_K_S", "Q4_K_M", "Q4_K_S", "Q3_K_M", "Q2_K", "IQ4_XS",
    ] {
        assert!(reference.iter().any(|(p, _)| p == want), "{want} missing");
    }
    for (name, types) in &reference {
        let preset: Preset = name.parse().expect("preset name");
        assert_eq!(preset.name(), name);
        let p = plan(&f, preset).expect("plan");
        assert_eq!(p.tensors.len(), types.len(), "{name}: tensor count");
        let mut wrong = Vec::new();
        for (n, want) in types {
            let got = p
                .tensors
                .iter()
                .find(|t| &t.info.name == n)
                .unwrap_or_else(|| panic!("{name}: no tensor {n} in the plan"))
                .to;
            if got.name() != want {
                wrong.push(format!("{n}: {got} (llama-quantize {want})"));
            }
        }
        assert!(
            wrong.is_empty(),
            "{name}: {} differ: {wrong:?}",
            wrong.len()
        );
        eprintln!("{}", p.summary());
    }
}

/// Tensors of `g` whose bytes differ from what llama-quantize wrote for `preset` (by the
/// SHA-256 digests in `data/llama_quantize_digests.json`); `None` when the reference does not
/// have the preset.
fn differing_from_llama_quantize(preset: Preset, g: &GgufFile) -> Option<Vec<String>> {
    use sha2::{Digest, Sha256};
    let v: serde_json::Value =
        serde_json::from_str(include_str!("../data/llama_quantize_digests.json")).expect("json");
    let digests: Vec<&str> = v["digests"][preset.name()].as_str()?.split(' ').collect();
    let names = v["tensors"].as_array().expect("tensors");
    assert_eq!(digests.len(), names.len(), "{preset}: digests");
    assert_eq!(names.len(), g.tensors.len(), "{preset}: tensor count");
    let want = |n: &str| {
        names
            .iter()
            .position(|m| m.as_str() == Some(n))
            .map_or("(missing)", |i| digests[i])
    };
    let mut differ = Vec::new();
    for t in &g.tensors {
        let bytes = g.read_tensor(t).expect("read");
        let hex: String = Sha256::digest(&bytes)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        if hex != want(&t.name) {
            differ.push(format!("{} ({})", t.name, t.ty));
        }
    }
    Some(differ)
}

/// Presets whose files hold every new type (Q5_0, Q5_1, Q4_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
/// IQ4_NL, IQ4_XS, Q8_0) quantize to files that load and generate, with the next-token choice
/// of the original for the 4-bit-and-up mixes.
#[test]
fn presets_load_and_generate() {
    let orig = LoadedModel::load(&default_model()).expect("load original");
    let prompt = orig
        .raw_prompt("Once upon a time, in a small village by the sea, there lived")
        .expect("prompt");
    let want = last_logits(&orig, &prompt);
    let argmax = |v: &[f32]| {
        v.iter()
            .enumerate()
            .fold((0, f32::MIN), |a, (i, &x)| if x > a.1 { (i, x) } else { a })
            .0
    };
    for (preset, file_type, same_top) in [
        (Preset::Q4KM, 15, true),
        (Preset::Q5KS, 16, true),
        (Preset::IQ4XS, 30, true),
        (Preset::Q3KM, 12, false),
        (Preset::Q2K, 10, false),
    ] {
        let out = tmp(&format!("{preset}.gguf"));
        let g = quantize_to(preset, &out);
        assert_eq!(g.get_u64("general.file_type").expect("ftype"), file_type);
        // Byte for byte what llama-quantize writes, every tensor.
        let differ = differing_from_llama_quantize(preset, &g).expect("reference digests");
        assert!(
            differ.is_empty(),
            "{preset}: {} tensors differ from llama-quantize: {differ:?}",
            differ.len()
        );
        let lm = LoadedModel::load(&out).unwrap_or_else(|e| panic!("load {preset}: {e}"));
        let got = last_logits(&lm, &prompt);
        assert!(got.iter().all(|x| x.is_finite()), "{preset}: logits finite");
        if same_top {
            assert_eq!(argmax(&want), argmax(&got), "{preset}: same top token");
        }
        let text = greedy_text(lm);
        eprintln!("{preset} greedy: {text:?}");
        assert!(!text.trim().is_empty(), "{preset}: generates");
        let _ = std::fs::remove_file(out);
    }
}

/// The quantizers on real weight rows (the default model's ffn_down, dequantized): errors in
/// the order of bits per weight.
#[test]
fn real_weight_rows_error_order() {
    let f = GgufFile::open(default_model()).expect("open");
    let t = f.tensor("blk.3.ffn_down.weight").expect("ffn_down");
    let k = t.dims[0] as usize;
    let bytes = f.read_tensor(t).expect("read");
    let src = t.ty;
    let rows = 64;
    let mut x = vec![0f32; rows * k];
    for (r, out) in x.chunks_mut(k).enumerate() {
        let rb = src.row_bytes(k);
        tpslab_kernels::dequantize_row(src, &bytes[r * rb..(r + 1) * rb], out);
    }
    let e = |ty| relative_rms_error(ty, &x);
    let errs = [WType::F16, WType::Q8_0, WType::Q6K, WType::Q4K, WType::Q4_0].map(|t| (t, e(t)));
    eprintln!("relative RMS errors on real rows: {errs:?}");
    for w in errs.windows(2) {
        assert!(
            w[0].1 < w[1].1 || (w[0].0 == WType::Q4K && w[0].1 <= w[1].1),
            "{errs:?}"
        );
    }
    // These rows are Q4_1 values, which Q4_K's 4-bit grid fits closely: Q5_K lands between
    // Q6_K and Q4_0 but not always below Q4_K here (measured 1.93% vs 1.83%).
    let q5 = e(WType::Q5K);
    assert!(errs[2].1 < q5 && q5 < errs[4].1, "Q5_K {q5} vs {errs:?}");
    assert!(e(WType::Q8_0) < 0.02 && e(WType::Q4K) < 0.2, "{errs:?}");
    // The added types in the order of their bits (measured: Q5_0 4.3%, IQ4_NL 7.4%, IQ4_XS
    // 7.5%, Q4_0 8.5%, Q3_K 15%, Q2_K 30%).
    let low = [
        WType::Q5_0,
        WType::IQ4NL,
        WType::Q4_0,
        WType::Q3K,
        WType::Q2K,
    ]
    .map(|t| (t, e(t)));
    eprintln!("relative RMS errors of the added types: {low:?}");
    for w in low.windows(2) {
        assert!(w[0].1 < w[1].1, "{low:?}");
    }
    let (xs, q4_0) = (e(WType::IQ4XS), low[2].1);
    assert!(xs < q4_0 && low[4].1 < 0.5, "IQ4_XS {xs} vs {low:?}");
}

/// A cancelled run and a run into a missing folder leave nothing at the output path.
#[test]
fn failures_leave_no_output() {
    let f = GgufFile::open(default_model()).expect("open");
    let p = plan(&f, Preset::Q8_0).expect("plan");
    let out = tmp("cancelled.gguf");
    let cancel = AtomicBool::new(true);
    let opts = QuantizeOptions {
        threads: 1,
        cancel: Some(&cancel),
    };
    let err = quantize_file(&f, &p, &out, opts, &mut |_| {}).expect_err("cancelled");
    assert!(err.to_string().contains("cancelled"), "{err}");
    assert!(!out.exists() && !temp_path(&out).exists());
    let out = tmp("no-such-dir").join("x.gguf");
    let err = quantize_file(&f, &p, &out, QuantizeOptions::default(), &mut |_| {})
        .expect_err("missing dir");
    assert!(err.to_string().contains("x.gguf.tmp"), "{err}");
    assert!(!out.exists());
}

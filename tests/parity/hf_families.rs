//! Hugging Face folders of every family the engine runs (Llama with Llama 3 RoPE scaling,
//! Mistral, Qwen2 with YaRN, Qwen3, Gemma 2, Gemma 3, Phi-3 with LongRoPE, SmolLM3, Granite
//! with its four scales), each
//! written here from the tiny random model of `tpslab_engine::model::tiny` as a real folder
//! is laid out (config.json, model.safetensors with Hugging Face names and rotary layout,
//! Gemma's norms stored as `w - 1`, tokenizer.json), then opened as the engine opens any folder.
//! Two checks:
//! - against the tiny GGUF it came from: every tensor byte for byte, and the resolved model
//!   config, except where a folder cannot say what the GGUF says (named in `config_differences`);
//! - against llama.cpp's convert_hf_to_gguf.py run on the same folders
//!   (tests/reference/make_hf_refs.py, tests/data/hf_refs.json): the same `{arch}.*` metadata
//!   and every tensor's name, shape and bytes (sha256), the computed Llama 3 `rope_freqs` to
//!   within 1e-6 relative (torch's f32 `pow` and Rust's may differ in the last bit).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value as Json, json};
use sha2::{Digest, Sha256};
use tpslab_engine::formats::gguf::{GgufFile, Value};
use tpslab_engine::formats::hf::{HfConfig, rope_permute};
use tpslab_engine::formats::safetensors::{StDesc, StWriter};
use tpslab_engine::model::config::ModelConfig;
use tpslab_engine::model::tiny::write_tiny;
use tpslab_kernels::WType;

const REFS: &str = include_str!("../data/hf_refs.json");

/// The families: (tiny variant, Hugging Face class, its `model_type`).
const FAMILIES: [(&str, &str, &str); 9] = [
    ("llama", "LlamaForCausalLM", "llama"),
    ("mistral", "MistralForCausalLM", "mistral"),
    ("qwen2", "Qwen2ForCausalLM", "qwen2"),
    ("qwen3", "Qwen3ForCausalLM", "qwen3"),
    ("gemma2", "Gemma2ForCausalLM", "gemma2"),
    ("gemma3", "Gemma3ForCausalLM", "gemma3_text"),
    ("phi3", "Phi3ForCausalLM", "phi3"),
    ("smollm3", "SmolLM3ForCausalLM", "smollm3"),
    ("granite", "GraniteForCausalLM", "granite"),
];

/// GPT-2's printable stand-ins for bytes (`bytes_to_unicode`).
fn byte_chars() -> Vec<char> {
    let mut printable: Vec<u32> = (33..=126).chain(161..=172).chain(174..=255).collect();
    let mut out = vec!['\0'; 256];
    let mut extra = 0;
    for b in 0..256u32 {
        let c = if printable.contains(&b) {
            b
        } else {
            extra += 1;
            255 + extra
        };
        out[b as usize] = char::from_u32(c).unwrap();
    }
    printable.clear();
    out
}

/// A small byte-level BPE tokenizer.json: the 256 bytes, a few merges, one special token.
fn tokenizer_json() -> Json {
    let mut vocab = serde_json::Map::new();
    for (i, c) in byte_chars().iter().enumerate() {
        vocab.insert(c.to_string(), json!(i));
    }
    let merges = ["Ġ t", "h e", "i n", "Ġt he", "a n", "e r"];
    for m in merges {
        let id = vocab.len();
        vocab.insert(m.replace(' ', ""), json!(id));
    }
    let eos = vocab.len();
    json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [{"id": eos, "content": "<|endoftext|>", "single_word": false,
            "lstrip": false, "rstrip": false, "normalized": false, "special": true}],
        "normalizer": null,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true,
            "use_regex": true},
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true,
            "use_regex": true},
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merges},
    })
}

const VOCAB: u64 = 256 + 6 + 1;

/// config.json of `class` matching the tiny variant `arch` (`factors`: Phi-3's LongRoPE
/// factors, from the tiny file).
fn config(arch: &str, class: &str, factors: Option<(Vec<f32>, Vec<f32>)>) -> Json {
    let model_type = FAMILIES.iter().find(|f| f.0 == arch).map(|f| f.2);
    let mut c = json!({
        "architectures": [class],
        "model_type": model_type,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        "vocab_size": VOCAB,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
        "bos_token_id": VOCAB - 1,
        "eos_token_id": VOCAB - 1,
        "torch_dtype": "float32",
    });
    let extra = match arch {
        "llama" => json!({"num_hidden_layers": 2, "rope_theta": 500000.0, "head_dim": 16,
            "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}),
        "mistral" => json!({"num_hidden_layers": 2, "sliding_window": 16}),
        "qwen2" => json!({"num_hidden_layers": 2, "rope_theta": 1000000.0,
            "sliding_window": 4096, "use_sliding_window": false,
            "rope_scaling": {"type": "yarn", "factor": 4.0,
                "original_max_position_embeddings": 64}}),
        "qwen3" => json!({"num_hidden_layers": 4, "head_dim": 32}),
        "gemma2" => json!({"num_hidden_layers": 4, "head_dim": 32,
            "attn_logit_softcapping": 20.0, "final_logit_softcapping": 10.0,
            "sliding_window": 16, "query_pre_attn_scalar": 32}),
        "gemma3" => json!({"num_hidden_layers": 6, "head_dim": 32, "rope_theta": 1000000.0,
            "rope_local_base_freq": 10000.0, "sliding_window": 16, "sliding_window_pattern": 6,
            "final_logit_softcapping": null, "attn_logit_softcapping": null,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0}}),
        "phi3" => {
            let (long, short) = factors.expect("phi3 factors");
            json!({"num_hidden_layers": 2, "original_max_position_embeddings": 4096,
                "sliding_window": null,
                "rope_scaling": {"type": "longrope", "long_factor": long, "short_factor": short}})
        }
        "smollm3" => json!({"num_hidden_layers": 4, "no_rope_layers": [1, 1, 1, 0]}),
        // The tiny file's scales; a head_dim the converter ignores (the head is 64 / 4).
        "granite" => json!({"num_hidden_layers": 2, "head_dim": 32, "attention_multiplier": 0.2,
            "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "logits_scaling": 4.0}),
        _ => panic!("no family {arch}"),
    };
    for (k, v) in extra.as_object().unwrap() {
        c[k] = v.clone();
    }
    c
}

/// The Hugging Face name of a tiny GGUF tensor (written here, apart from the engine's map, so
/// a mistake in one shows against the other); `None` for what a folder keeps in config.json.
fn hf_name(arch: &str, gguf: &str) -> Option<String> {
    let gemma = arch.starts_with("gemma");
    match gguf {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "rope_freqs.weight" | "rope_factors_long.weight" | "rope_factors_short.weight" => {
            return None;
        }
        _ => {}
    }
    let rest = gguf.strip_prefix("blk.").unwrap();
    let (layer, suffix) = rest.split_once('.').unwrap();
    let (kind, ty) = suffix.rsplit_once('.').unwrap();
    let hf = match kind {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "attn_qkv" => "self_attn.qkv_proj",
        "ffn_norm" if gemma => "pre_feedforward_layernorm",
        "ffn_norm" | "post_attention_norm" => "post_attention_layernorm",
        "post_ffw_norm" => "post_feedforward_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" if arch == "phi3" => "mlp.gate_up_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        other => panic!("{arch}: no Hugging Face name for {other}"),
    };
    Some(format!("model.layers.{layer}.{hf}.{ty}"))
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Writes the folder of `arch` into `dir` from its tiny GGUF (written beside it); returns the
/// GGUF's path.
fn write_folder(arch: &str, class: &str, dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let tj = tokenizer_json();
    std::fs::write(dir.join("tokenizer.json"), tj.to_string()).unwrap();
    std::fs::write(
        dir.join("tokenizer_config.json"),
        json!({"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>",
            "bos_token": "<|endoftext|>", "add_bos_token": false})
        .to_string(),
    )
    .unwrap();
    // The tokenizer keys, as the engine maps this tokenizer.json (the config only sizes it).
    let probe: HfConfig =
        serde_json::from_value(config("qwen3", "Qwen3ForCausalLM", None)).unwrap();
    let tokenizer = tpslab_engine::formats::hf_tokenizer::metadata(dir, &probe).unwrap();
    let gguf = dir.with_extension("tiny.gguf");
    write_tiny(arch, &tokenizer, &gguf).unwrap();
    let tiny = GgufFile::open(&gguf).unwrap();
    let mut factors = (Vec::new(), Vec::new());
    let mut out: Vec<(StDesc, Vec<u8>)> = Vec::new();
    let heads = |name: &str| if name.contains("attn_q.") { 4 } else { 2 };
    for t in &tiny.tensors {
        let mut bytes = tiny.read_tensor(t).unwrap();
        match t.name.as_str() {
            "rope_factors_long.weight" => factors.0 = f32s(&bytes),
            "rope_factors_short.weight" => factors.1 = f32s(&bytes),
            _ => {}
        }
        let Some(name) = hf_name(arch, &t.name) else {
            continue;
        };
        let llama_like = matches!(arch, "llama" | "mistral" | "smollm3" | "granite");
        if llama_like && (t.name.contains("attn_q.") || t.name.contains("attn_k.")) {
            let rows = if t.dims.len() == 1 {
                t.dims[0]
            } else {
                t.dims[1]
            };
            rope_permute(&mut bytes, rows as usize, heads(&t.name), false).unwrap();
        }
        if arch.starts_with("gemma") && t.name.ends_with("norm.weight") {
            // Exact: w - 1 for w in [0.5, 2] is representable (Sterbenz), and so is its + 1.
            bytes = f32s(&bytes)
                .iter()
                .flat_map(|w| (w - 1.0).to_le_bytes())
                .collect();
        }
        let desc = StDesc {
            name,
            dtype: WType::F32,
            shape: t.dims.iter().rev().copied().collect(),
        };
        out.push((desc, bytes));
    }
    let factors = (arch == "phi3").then_some(factors);
    std::fs::write(
        dir.join("config.json"),
        serde_json::to_string_pretty(&config(arch, class, factors)).unwrap(),
    )
    .unwrap();
    let file = std::fs::File::create(dir.join("model.safetensors")).unwrap();
    let descs = out.iter().map(|(d, _)| d.clone()).collect();
    let mut w = StWriter::new(std::io::BufWriter::new(file), descs, &BTreeMap::new()).unwrap();
    for (_, bytes) in &out {
        w.write_tensor(bytes).unwrap();
    }
    w.finish().unwrap();
    gguf
}

struct Tmp(PathBuf);

impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The fields of the resolved config a folder cannot match its tiny GGUF on, by design:
/// the tiny Mistral file names its own architecture (the converter writes `llama`), and the
/// tiny Phi-3 file's LongRoPE attention factor is a fixed 1.19, which a config derives from
/// its context (1.0 at 4096 of 4096).
fn config_differences(arch: &str, folder: &mut ModelConfig, tiny: &ModelConfig) {
    match arch {
        "mistral" => folder.arch.clone_from(&tiny.arch),
        "phi3" => {
            assert_eq!(folder.extras.rope_attn_factor, 1.0);
            folder.extras.rope_attn_factor = tiny.extras.rope_attn_factor;
        }
        _ => {}
    }
}

fn sha(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn json_of(v: &Value) -> Json {
    match v {
        Value::U32(x) => json!(x),
        Value::I32(x) => json!(x),
        Value::U64(x) => json!(x),
        Value::F32(x) => json!(x),
        Value::Bool(x) => json!(x),
        Value::String(x) => json!(x),
        other => json!(format!("{other:?}")),
    }
}

/// The folder against llama.cpp's converter: its `{arch}.*` keys and every tensor.
fn check_against_converter(arch: &str, folder: &GgufFile, want: &Json, bad: &mut Vec<String>) {
    let name = folder.get_str("general.architecture").unwrap();
    assert_eq!(name, want["arch"].as_str().unwrap(), "{arch}: architecture");
    let prefix = format!("{name}.");
    let ours: BTreeMap<String, Json> = folder
        .metadata
        .iter()
        .filter(|(k, _)| k.starts_with(&prefix))
        .map(|(k, v)| (k.clone(), json_of(v)))
        .collect();
    let mut theirs: BTreeMap<String, Json> =
        serde_json::from_value(want["metadata"].clone()).unwrap();
    // The one key the engine adds on purpose (the llama family's hf mapping: transformers slides Mistral's window).
    if arch == "mistral" {
        theirs.insert("llama.attention.sliding_window".into(), json!(16));
    }
    for k in ours.keys().chain(theirs.keys()) {
        let (a, b) = (ours.get(k), theirs.get(k));
        let same = match (a.and_then(Json::as_f64), b.and_then(Json::as_f64)) {
            (Some(x), Some(y)) => (x as f32) == (y as f32),
            _ => a == b,
        };
        if !same {
            bad.push(format!("{arch}: {k} = {a:?}, the converter wrote {b:?}"));
        }
    }
    let tensors = want["tensors"].as_object().unwrap();
    for t in &folder.tensors {
        let Some(w) = tensors.get(&t.name) else {
            bad.push(format!("{arch}: {} is not in the converter's file", t.name));
            continue;
        };
        let dims: Vec<u64> = serde_json::from_value(w["dims"].clone()).unwrap();
        if dims != t.dims {
            bad.push(format!("{arch}: {} dims {:?} vs {dims:?}", t.name, t.dims));
        }
        let bytes = folder.read_tensor(t).unwrap();
        if t.name == "rope_freqs.weight" {
            let theirs: Vec<f32> = serde_json::from_value(w["values"].clone()).unwrap();
            let ours = f32s(&bytes);
            let close = ours.len() == theirs.len()
                && ours
                    .iter()
                    .zip(&theirs)
                    .all(|(a, b)| ((a - b) / b).abs() <= 1e-6);
            if !close {
                bad.push(format!("{arch}: rope_freqs {ours:?} vs {theirs:?}"));
            }
        } else if sha(&bytes) != w["sha256"].as_str().unwrap() {
            bad.push(format!(
                "{arch}: {} bytes differ from the converter's",
                t.name
            ));
        }
    }
    for name in tensors.keys() {
        if folder.tensor(name).is_none() {
            bad.push(format!(
                "{arch}: the converter wrote {name}, the folder has none"
            ));
        }
    }
}

#[test]
fn every_family_opens_from_a_folder_as_llama_cpp_converts_it() {
    let refs: Json = serde_json::from_str(REFS).unwrap();
    let root = Tmp(std::env::temp_dir().join(format!("tpslab-hf-families-{}", std::process::id())));
    let mut bad = Vec::new();
    for (arch, class, _) in FAMILIES {
        let dir = root.0.join(arch);
        let gguf = write_folder(arch, class, &dir);
        let folder = GgufFile::open(&dir).unwrap_or_else(|e| panic!("{arch}: {e}"));
        let tiny = GgufFile::open(&gguf).unwrap();
        let mut from_folder = ModelConfig::from_gguf(&folder).unwrap();
        let from_tiny = ModelConfig::from_gguf(&tiny).unwrap();
        config_differences(arch, &mut from_folder, &from_tiny);
        assert_eq!(from_folder, from_tiny, "{arch}: resolved config");
        for t in &tiny.tensors {
            if t.name == "rope_freqs.weight" {
                // Computed from config.json: checked against the converter below.
                continue;
            }
            let ours = folder
                .tensor(&t.name)
                .unwrap_or_else(|| panic!("{arch}: the folder has no {}", t.name));
            assert_eq!((&ours.dims, ours.ty), (&t.dims, t.ty), "{arch}: {}", t.name);
            let same = folder.read_tensor(ours).unwrap() == tiny.read_tensor(t).unwrap();
            assert!(same, "{arch}: {} differs from the tiny GGUF's", t.name);
        }
        check_against_converter(arch, &folder, &refs["families"][arch], &mut bad);
        // And it runs: the engine loads the folder.
        tpslab_engine::model::LoadedModel::load(&dir).unwrap_or_else(|e| panic!("{arch}: {e}"));
    }
    assert!(bad.is_empty(), "{bad:#?}");
}

/// Not a check: writes the folders into `$TPSLAB_HF_FOLDERS` for tests/reference/make_hf_refs.py
/// (run by it with `--ignored`).
#[test]
#[ignore = "generator for tests/reference/make_hf_refs.py"]
fn write_folders_for_the_reference_script() {
    let out = PathBuf::from(std::env::var("TPSLAB_HF_FOLDERS").expect("TPSLAB_HF_FOLDERS"));
    for (arch, class, _) in FAMILIES {
        let gguf = write_folder(arch, class, &out.join(arch));
        std::fs::remove_file(gguf).unwrap();
    }
}

/// A config the engine cannot run as written is refused with an error naming the field, not
/// run wrongly: a SmolLM3 NoPE pattern other than llama.cpp's, LongRoPE factors of the wrong
/// length, an unknown RoPE scaling type, a negative head count.
#[test]
fn configs_the_engine_cannot_honour_are_refused_by_name() {
    let root = Tmp(std::env::temp_dir().join(format!("tpslab-hf-hostile-{}", std::process::id())));
    type Case<'a> = (&'a str, &'a str, &'a dyn Fn(&mut Json), &'a str);
    let cases: [Case; 4] = [
        (
            "smollm3",
            "SmolLM3ForCausalLM",
            &|c| c["no_rope_layers"] = json!([1, 1, 1, 1]),
            "no_rope_layers",
        ),
        (
            "phi3",
            "Phi3ForCausalLM",
            &|c| {
                c["rope_scaling"]["long_factor"]
                    .as_array_mut()
                    .unwrap()
                    .pop();
            },
            "long and",
        ),
        (
            "llama",
            "LlamaForCausalLM",
            &|c| c["rope_scaling"]["rope_type"] = json!("mystery"),
            "'mystery' is not supported",
        ),
        (
            "qwen3",
            "Qwen3ForCausalLM",
            &|c| c["num_attention_heads"] = json!(-4),
            "num_attention_heads",
        ),
    ];
    for (arch, class, edit, want) in cases {
        let dir = root.0.join(arch);
        write_folder(arch, class, &dir);
        let path = dir.join("config.json");
        let mut c: Json = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        edit(&mut c);
        std::fs::write(&path, c.to_string()).unwrap();
        let e = GgufFile::open(&dir).expect_err(arch).to_string();
        assert!(e.contains(want), "{arch}: {e}");
    }
}

//! A tiny Llama model made here (one layer, 64 wide, a byte-level vocabulary of 259 tokens, seeded
//! random F32 weights) as a GGUF file and as a Hugging Face folder: small enough that a fuzz case
//! loads it in milliseconds, laid out as real files are. The folder can also carry another
//! tokenizer folder's files (its embedding sized to that vocabulary).

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value as Json, json};
use tpslab_engine::formats::gguf::Value;
use tpslab_engine::formats::gguf_write::{TensorDesc, write_gguf};
use tpslab_engine::formats::safetensors::{StDesc, StWriter};
use tpslab_engine::model::LoadedModel;
use tpslab_kernels::WType;

const HIDDEN: u64 = 64;
const FFN: u64 = 128;
const HEADS: u64 = 4;
const KV_HEADS: u64 = 2;
const CONTEXT: u64 = 256;
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

/// GPT-2's printable stand-ins for the 256 byte values (its `bytes_to_unicode`).
fn byte_tokens() -> Vec<String> {
    let printable = |b: u32| {
        (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b)
    };
    let mut extra = 0;
    (0u32..256)
        .map(|b| {
            let c = if printable(b) {
                b
            } else {
                extra += 1;
                255 + extra
            };
            char::from_u32(c).map_or_else(String::new, String::from)
        })
        .collect()
}

fn vocab() -> u64 {
    256 + SPECIALS.len() as u64
}

/// Deterministic small weights (uniform in about ±0.03).
fn weights(n: u64, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .flat_map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            let x = ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.06;
            x.to_le_bytes()
        })
        .collect()
}

fn ones(n: u64) -> Vec<u8> {
    (0..n).flat_map(|_| 1.0f32.to_le_bytes()).collect()
}

/// The GGUF tensors for a vocabulary of `vocab` tokens: (name, ggml dims, bytes).
fn tensors(vocab: u64) -> Vec<(String, Vec<u64>, Vec<u8>)> {
    let kv = HIDDEN / HEADS * KV_HEADS;
    let mut t = vec![
        (
            "token_embd.weight".to_string(),
            vec![HIDDEN, vocab],
            weights(HIDDEN * vocab, 1),
        ),
        ("output_norm.weight".to_string(), vec![HIDDEN], ones(HIDDEN)),
    ];
    let blk = |s: &str| format!("blk.0.{s}");
    for (i, (name, dims)) in [
        ("attn_norm.weight", vec![HIDDEN]),
        ("attn_q.weight", vec![HIDDEN, HIDDEN]),
        ("attn_k.weight", vec![HIDDEN, kv]),
        ("attn_v.weight", vec![HIDDEN, kv]),
        ("attn_output.weight", vec![HIDDEN, HIDDEN]),
        ("ffn_norm.weight", vec![HIDDEN]),
        ("ffn_gate.weight", vec![HIDDEN, FFN]),
        ("ffn_up.weight", vec![HIDDEN, FFN]),
        ("ffn_down.weight", vec![FFN, HIDDEN]),
    ]
    .into_iter()
    .enumerate()
    {
        let n: u64 = dims.iter().product();
        let bytes = if dims.len() == 1 {
            ones(n)
        } else {
            weights(n, i as u64 + 2)
        };
        t.push((blk(name), dims, bytes));
    }
    t
}

/// The tiny model as GGUF bytes, with `extra` metadata added (or replacing a key).
pub fn tiny_llama(extra: &[(String, Value)]) -> Vec<u8> {
    let mut tokens: Vec<Value> = byte_tokens().into_iter().map(Value::String).collect();
    tokens.extend(SPECIALS.iter().map(|s| Value::String((*s).into())));
    let mut types = vec![Value::I32(1); 256];
    types.extend(std::iter::repeat_n(Value::I32(3), 3));
    let mut md: Vec<(String, Value)> = vec![
        ("general.architecture".into(), Value::String("llama".into())),
        (
            "general.name".into(),
            Value::String("Tiny Fuzz Llama".into()),
        ),
        ("llama.block_count".into(), Value::U32(1)),
        ("llama.embedding_length".into(), Value::U32(HIDDEN as u32)),
        ("llama.feed_forward_length".into(), Value::U32(FFN as u32)),
        (
            "llama.attention.head_count".into(),
            Value::U32(HEADS as u32),
        ),
        (
            "llama.attention.head_count_kv".into(),
            Value::U32(KV_HEADS as u32),
        ),
        ("llama.context_length".into(), Value::U32(CONTEXT as u32)),
        ("llama.rope.freq_base".into(), Value::F32(10000.0)),
        (
            "llama.attention.layer_norm_rms_epsilon".into(),
            Value::F32(1e-5),
        ),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.token_type".into(), Value::Array(types)),
        ("tokenizer.ggml.merges".into(), Value::Array(Vec::new())),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(256)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(258)),
        (
            "tokenizer.chat_template".into(),
            Value::String(tpslab_engine::text::chat::CHATML_TEMPLATE.into()),
        ),
    ];
    md.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
    md.extend(extra.iter().cloned());
    let tensors: Vec<(TensorDesc, Vec<u8>)> = tensors(vocab())
        .into_iter()
        .map(|(name, dims, bytes)| (TensorDesc::new(name, dims, WType::F32), bytes))
        .collect();
    write_gguf(Vec::new(), &md, &tensors).expect("write the tiny model")
}

/// Writes the tiny model as a Hugging Face folder (config.json, tokenizer.json, one safetensors
/// file) in `dir`; returns (config.json, tokenizer.json) as written.
pub fn tiny_folder(dir: &Path) -> (Json, Json) {
    std::fs::create_dir_all(dir).expect("folder");
    let gguf = dir.with_extension("seed.gguf");
    std::fs::write(&gguf, tiny_llama(&[])).expect("write");
    let tokenizer: Json = serde_json::from_str(
        &LoadedModel::load(&gguf)
            .expect("load the tiny model")
            .tokenizer
            .hf_json()
            .expect("tokenizer.json"),
    )
    .expect("tokenizer JSON");
    let _ = std::fs::remove_file(&gguf);
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).expect("tokenizer");
    let config = write_model(
        dir,
        vocab(),
        json!({"bos_token_id": 256, "eos_token_id": 258}),
    );
    (config, tokenizer)
}

/// The tiny model as a folder in `dir` with the tokenizer files of the folder `tokenizer`
/// (tokenizer.json and, where there is one, tokenizer_config.json), its embedding as many rows
/// as that tokenizer has ids; returns config.json as written.
#[allow(dead_code)] // not every test binary that includes this carries another tokenizer
pub fn tiny_folder_with_tokenizer(dir: &Path, tokenizer: &Path) -> Json {
    std::fs::create_dir_all(dir).expect("folder");
    let text = std::fs::read_to_string(tokenizer.join("tokenizer.json")).expect("tokenizer.json");
    let tj: Json = serde_json::from_str(&text).expect("tokenizer JSON");
    let vocab = &tj["model"]["vocab"];
    let ids = vocab
        .as_object()
        .map(|v| v.values().filter_map(Json::as_u64).collect::<Vec<_>>())
        .unwrap_or_else(|| (0..vocab.as_array().map_or(0, Vec::len) as u64).collect());
    let added = tj["added_tokens"].as_array().into_iter().flatten();
    let top = ids
        .into_iter()
        .chain(added.filter_map(|a| a["id"].as_u64()))
        .max()
        .expect("a vocabulary");
    std::fs::write(dir.join("tokenizer.json"), text).expect("tokenizer");
    let tc = tokenizer.join("tokenizer_config.json");
    if tc.is_file() {
        std::fs::copy(&tc, dir.join("tokenizer_config.json")).expect("tokenizer_config.json");
    }
    write_model(dir, top + 1, json!({}))
}

/// config.json (with `extra` keys) and model.safetensors of the tiny model over `vocab` tokens.
fn write_model(dir: &Path, vocab: u64, extra: Json) -> Json {
    let mut config = json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": 1,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "max_position_embeddings": CONTEXT,
        "vocab_size": vocab,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": true,
    });
    for (k, v) in extra.as_object().expect("an object") {
        config[k] = v.clone();
    }
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config");
    let tensors = tensors(vocab);
    let descs: Vec<StDesc> = tensors
        .iter()
        .map(|(name, dims, _)| StDesc {
            name: tpslab_engine::formats::hf::hf_name(name).expect("an HF name"),
            dtype: WType::F32,
            // safetensors shapes are row-major: ggml's dims reversed.
            shape: dims.iter().rev().copied().collect(),
        })
        .collect();
    let out = std::fs::File::create(dir.join("model.safetensors")).expect("create");
    let mut w =
        StWriter::new(std::io::BufWriter::new(out), descs, &BTreeMap::new()).expect("header");
    for (_, _, bytes) in &tensors {
        w.write_tensor(bytes).expect("tensor");
    }
    w.finish().expect("finish");
    config
}

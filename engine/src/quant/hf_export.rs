//! Exporting a model to a Hugging Face folder (`tpslab export`): weights dequantized to
//! F32/F16/BF16 in `model.safetensors` under Hugging Face names, Llama Q/K rows permuted back
//! into Hugging Face's rotary layout, `config.json`, `tokenizer.json` (the engine's own
//! tokenizer, serialized) and `tokenizer_config.json` with the chat template. What
//! `GgufFile::open` reads back from the folder is the same model. The class written and the
//! edits undone are the family's (`FamilyDef::hf_classes`, `FamilyDef::hf_change`): a family
//! whose converter edits values other than by permuting rows (Gemma's `1 + w` norms) or
//! fuses tensors (Phi-3) is refused by name.
//!
//! The weights are written to `model.safetensors.tmp` and renamed last, so a failed export
//! never leaves a folder that loads.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};

use serde_json::json;
use tpslab_kernels::WType;

use crate::formats::gguf::{GgufError, GgufFile};
use crate::formats::hf::{CONFIG, TOKENIZER, TOKENIZER_CONFIG, WEIGHTS, hf_name, rope_permute};
use crate::formats::hf_map::{Change, Shape};
use crate::formats::safetensors::{StDesc, StWriter};
use crate::model::arch::HfClass;
use crate::model::config::ModelConfig;
use crate::quant::quantize::convert;
use crate::text::chat::ChatTemplate;
use crate::text::tokenizer::Tokenizer;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("{0}")]
    Model(String),
    #[error("export to {dtype} is not supported (F32, F16 and BF16 are)")]
    Dtype { dtype: WType },
    #[error("{path} exists and is not an empty folder; refusing to write over it")]
    NotEmpty { path: PathBuf },
    #[error("{what} {path}: {err}")]
    Io {
        what: &'static str,
        path: PathBuf,
        err: String,
    },
}

/// What an export wrote.
#[derive(Debug, Clone)]
pub struct ExportReport {
    pub tensors: usize,
    pub weights_bytes: u64,
}

fn io<'a, E: std::fmt::Display>(
    what: &'static str,
    path: &'a Path,
) -> impl Fn(E) -> ExportError + use<'a, E> {
    move |err| ExportError::Io {
        what,
        path: path.to_path_buf(),
        err: err.to_string(),
    }
}

/// The torch dtype name config.json records.
fn torch_dtype(ty: WType) -> &'static str {
    match ty {
        WType::F16 => "float16",
        WType::BF16 => "bfloat16",
        _ => "float32",
    }
}

/// Exports the model `f` to the folder `out` (created; must not hold anything yet) with every
/// tensor in `dtype`, converting on `threads` threads. `progress(done, total)` after each tensor.
pub fn export_folder(
    f: &GgufFile,
    out: &Path,
    dtype: WType,
    threads: usize,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<ExportReport, ExportError> {
    if !matches!(dtype, WType::F32 | WType::F16 | WType::BF16) {
        return Err(ExportError::Dtype { dtype });
    }
    let cfg = ModelConfig::from_gguf(f).map_err(|e| ExportError::Model(e.to_string()))?;
    let tokenizer = Tokenizer::from_gguf(f).map_err(|e| ExportError::Model(e.to_string()))?;
    let template =
        ChatTemplate::from_gguf(f, &tokenizer).map_err(|e| ExportError::Model(e.to_string()))?;
    if out.exists()
        && std::fs::read_dir(out)
            .map_err(io("cannot read", out))?
            .next()
            .is_some()
    {
        return Err(ExportError::NotEmpty { path: out.into() });
    }
    std::fs::create_dir_all(out).map_err(io("cannot create", out))?;

    let class = export_class(&cfg)?;
    let mut descs = Vec::new();
    for t in &f.tensors {
        let edit = edit_of(&cfg, class, &t.name)?;
        let name = hf_name(&t.name).ok_or_else(|| {
            ExportError::Model(format!("tensor '{}' has no Hugging Face name", t.name))
        })?;
        let shape: Vec<u64> = t.dims.iter().rev().copied().collect();
        descs.push((t, StDesc { name, dtype, shape }, edit));
    }
    let tmp = out.join(format!("{WEIGHTS}.tmp"));
    let result = (|| {
        let file = File::create(&tmp).map_err(io("cannot create", &tmp))?;
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let mut w = StWriter::new(
            BufWriter::with_capacity(1 << 20, file),
            descs.iter().map(|(_, d, _)| d.clone()).collect(),
            &meta,
        )
        .map_err(io("cannot write", &tmp))?;
        let total = descs.len();
        let mut bytes = 0u64;
        for (i, (t, d, edit)) in descs.iter().enumerate() {
            let src = f.read_tensor(t)?;
            let from = t.ty;
            let k = t.dims[0] as usize;
            let mut data = if from == dtype {
                src
            } else {
                convert(from, dtype, &src, k, threads)
            };
            if let Change::Permute(h) = *edit {
                rope_permute(&mut data, d.shape[0] as usize, h as usize, false)
                    .map_err(|e| ExportError::Model(format!("{}: {e}", t.name)))?;
            }
            w.write_tensor(&data).map_err(io("cannot write", &tmp))?;
            bytes += data.len() as u64;
            progress(i + 1, total);
        }
        let file = w
            .finish()
            .map_err(io("cannot write", &tmp))?
            .into_inner()
            .map_err(|e| io("cannot write", &tmp)(e.into_error()))?;
        file.sync_all().map_err(io("cannot sync", &tmp))?;
        Ok::<_, ExportError>(bytes)
    })();
    let bytes = match result {
        Ok(b) => b,
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
    };

    write_side_files(f, out, (&cfg, class), &tokenizer, &template, dtype)?;
    let weights = out.join(WEIGHTS);
    std::fs::rename(&tmp, &weights).map_err(io("cannot rename the weights to", &weights))?;
    Ok(ExportReport {
        tensors: descs.len(),
        weights_bytes: bytes,
    })
}

/// The Hugging Face class `cfg`'s family writes its architecture as (its first class for the
/// architecture names only this engine uses, `mistral` and `smollm`).
fn export_class(cfg: &ModelConfig) -> Result<&'static HfClass, ExportError> {
    let classes = cfg.family.def().hf_classes();
    classes
        .iter()
        .find(|c| c.gguf_arch == cfg.arch)
        .or(classes.first())
        .ok_or_else(|| {
            ExportError::Model(format!(
                "{} has no Hugging Face class to export as",
                cfg.arch
            ))
        })
}

/// What the converter does to GGUF tensor `name`, to be undone on export: nothing or a row
/// permutation; any other edit is refused.
fn edit_of(cfg: &ModelConfig, class: &HfClass, name: &str) -> Result<Change, ExportError> {
    let shape = Shape {
        heads: cfg.n_heads as u64,
        kv_heads: cfg.n_kv_heads as u64,
        head_dim: cfg.head_dim as u64,
    };
    match cfg.family.def().hf_change(class, name, &shape) {
        Change::PlusOne => Err(ExportError::Model(format!(
            "{name}: {} stores this weight edited; exporting it is not supported",
            class.class
        ))),
        edit => Ok(edit),
    }
}

/// config.json, tokenizer.json and tokenizer_config.json (with the chat template).
fn write_side_files(
    f: &GgufFile,
    out: &Path,
    (cfg, class): (&ModelConfig, &HfClass),
    tokenizer: &Tokenizer,
    template: &ChatTemplate,
    dtype: WType,
) -> Result<(), ExportError> {
    let has_output = f.tensor("output.weight").is_some();
    let qkv_bias = f.tensor("blk.0.attn_q.bias").is_some();
    write_json(
        &out.join(CONFIG),
        &config_json(cfg, class, tokenizer, dtype, has_output, qkv_bias),
    )?;
    let tok_path = out.join(TOKENIZER);
    let tok_json = tokenizer
        .hf_json()
        .map_err(io("cannot serialize the tokenizer to", &tok_path))?;
    std::fs::write(&tok_path, tok_json).map_err(io("cannot write", &tok_path))?;
    let text = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i));
    let key = |k: &str| f.get(k).and_then(|v| v.as_u64()).map(|v| v as u32);
    let mut tc = json!({
        "add_bos_token": tokenizer.add_bos(),
        "bos_token": text(tokenizer.bos_id()),
        "eos_token": text(tokenizer.eos_id()),
        "chat_template": template.source(),
        "model_max_length": cfg.context_len,
        "tokenizer_class": "GPT2Tokenizer",
        "clean_up_tokenization_spaces": false,
    });
    for (name, k) in [
        ("unk_token", "tokenizer.ggml.unknown_token_id"),
        ("pad_token", "tokenizer.ggml.padding_token_id"),
    ] {
        if let Some(t) = text(key(k)) {
            tc[name] = json!(t);
        }
    }
    write_json(&out.join(TOKENIZER_CONFIG), &tc)?;
    Ok(())
}

fn config_json(
    cfg: &ModelConfig,
    class: &HfClass,
    tok: &Tokenizer,
    dtype: WType,
    has_output: bool,
    qkv_bias: bool,
) -> serde_json::Value {
    json!({
        "architectures": [class.class],
        "model_type": class.model_types.first().copied().unwrap_or_default(),
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.context_len,
        "vocab_size": cfg.vocab,
        "rms_norm_eps": cfg.rms_eps as f64,
        "rope_theta": cfg.rope_theta as f64,
        "rope_scaling": null,
        "hidden_act": "silu",
        "attention_bias": qkv_bias,
        "mlp_bias": false,
        "tie_word_embeddings": !has_output,
        "bos_token_id": tok.bos_id(),
        "eos_token_id": tok.eos_id(),
        "torch_dtype": torch_dtype(dtype),
        "use_cache": true,
    })
}

fn write_json(path: &Path, v: &serde_json::Value) -> Result<(), ExportError> {
    let text = serde_json::to_string_pretty(v).map_err(io("cannot serialize", path))?;
    std::fs::write(path, text + "\n").map_err(io("cannot write", path))
}

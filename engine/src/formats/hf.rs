//! Hugging Face model folders (`config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! `*.safetensors`, sharded or not) opened as the same [`GgufFile`] view a GGUF gives, the way
//! llama.cpp's `convert_hf_to_gguf.py` maps them: metadata under the GGUF keys, tensors under
//! GGUF names, Llama Q/K rows permuted into GGUF's rotary layout when read. So the config,
//! weights, tokenizer, chat template, perplexity and quantizer all work on a folder unchanged.
//!
//! Open one with [`GgufFile::open`] on the folder (or [`open_folder`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Deserialize;
use serde_json::Value as Json;

use crate::formats::gguf::{GgmlType, GgufFile, TensorInfo, TensorSource, Value};
use crate::formats::safetensors::{SafetensorsError, SafetensorsFile};

/// JSON files past this size are not a model's config or tokenizer: refuse before reading.
const MAX_JSON: u64 = 256 << 20;
/// Vocabulary ids past this are not real (the largest vocabularies are ~260k).
const MAX_VOCAB: u64 = 1 << 22;

pub const CONFIG: &str = "config.json";
pub const TOKENIZER: &str = "tokenizer.json";
pub const TOKENIZER_CONFIG: &str = "tokenizer_config.json";
pub const WEIGHTS: &str = "model.safetensors";
pub const WEIGHTS_INDEX: &str = "model.safetensors.index.json";

/// Why a Hugging Face folder could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum HfError {
    #[error("{dir} is not a Hugging Face model folder: it has no {file}")]
    Missing { dir: PathBuf, file: &'static str },
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Json { path: PathBuf, what: String },
    #[error(transparent)]
    Safetensors(#[from] SafetensorsError),
    #[error("{path}: model type '{found}' is not supported (supported: llama, mistral, qwen2)")]
    Arch { path: PathBuf, found: String },
    #[error("{path}: {what}")]
    Config { path: PathBuf, what: String },
    #[error("{path}: {what}")]
    Tokenizer { path: PathBuf, what: String },
    #[error("tensor '{name}' in {path}: {what}")]
    Tensor {
        name: String,
        path: PathBuf,
        what: String,
    },
}

/// The `config.json` fields the Llama family uses (serde mirror; resolved into GGUF keys).
#[derive(Debug, Clone, Deserialize)]
pub struct HfConfig {
    pub model_type: Option<String>,
    #[serde(default)]
    pub architectures: Vec<String>,
    pub hidden_size: u64,
    pub intermediate_size: u64,
    pub num_hidden_layers: u64,
    pub num_attention_heads: u64,
    pub num_key_value_heads: Option<u64>,
    pub head_dim: Option<u64>,
    pub max_position_embeddings: u64,
    pub vocab_size: u64,
    pub rms_norm_eps: Option<f64>,
    pub rope_theta: Option<f64>,
    pub rope_scaling: Option<Json>,
    #[serde(default)]
    pub tie_word_embeddings: bool,
    pub bos_token_id: Option<Json>,
    pub eos_token_id: Option<Json>,
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> HfError + '_ {
    move |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a JSON file, refusing one too large to be a model's.
pub fn read_json(path: &Path) -> Result<Json, HfError> {
    let len = std::fs::metadata(path).map_err(io_err(path))?.len();
    if len > MAX_JSON {
        return Err(HfError::Json {
            path: path.into(),
            what: format!("{len} bytes is too large for a model's JSON file"),
        });
    }
    let text = std::fs::read(path).map_err(io_err(path))?;
    serde_json::from_slice(&text).map_err(|e| HfError::Json {
        path: path.into(),
        what: format!("not valid JSON: {e}"),
    })
}

/// A required file of the folder, with an error naming it when absent.
fn required(dir: &Path, file: &'static str) -> Result<PathBuf, HfError> {
    let p = dir.join(file);
    if p.is_file() {
        Ok(p)
    } else {
        Err(HfError::Missing {
            dir: dir.into(),
            file,
        })
    }
}

/// The GGUF architecture of a Hugging Face `model_type` (Mistral is Llama in GGUF, as
/// convert_hf_to_gguf writes it).
fn gguf_arch(cfg: &HfConfig, path: &Path) -> Result<&'static str, HfError> {
    gguf_arch_of(cfg.model_type.as_deref(), &cfg.architectures).map_err(|found| HfError::Arch {
        path: path.into(),
        found,
    })
}

/// The GGUF architecture of a `config.json`'s `model_type` (else its `architectures[0]`), or
/// the type found when the engine does not run it (the library's import check asks this too).
pub fn gguf_arch_of(
    model_type: Option<&str>,
    architectures: &[String],
) -> Result<&'static str, String> {
    let ty = model_type.map_or_else(
        || {
            architectures
                .first()
                .map(|a| a.trim_end_matches("ForCausalLM").to_lowercase())
                .unwrap_or_default()
        },
        str::to_string,
    );
    match ty.as_str() {
        "llama" | "mistral" => Ok("llama"),
        "qwen2" => Ok("qwen2"),
        _ => Err(ty),
    }
}

/// The GGUF tokenizer keys of a folder (`formats::hf_tokenizer::metadata`, passed in by
/// `GgufFile::open` so this reader does not import the tokenizer mapping that reads its types).
pub type TokenizerKeys = fn(&Path, &HfConfig) -> Result<Vec<(String, Value)>, HfError>;

/// Opens the Hugging Face model in `dir` as a [`GgufFile`] view.
pub fn open_folder(dir: &Path, tokenizer: TokenizerKeys) -> Result<GgufFile, HfError> {
    let config_path = required(dir, CONFIG)?;
    // Checked up front so a folder missing either file is named as such.
    required(dir, TOKENIZER)?;
    let cfg: HfConfig =
        serde_json::from_value(read_json(&config_path)?).map_err(|e| HfError::Config {
            path: config_path.clone(),
            what: format!("not a Llama-family config: {e}"),
        })?;
    let arch = gguf_arch(&cfg, &config_path)?;
    let mut metadata = config_metadata(dir, &cfg, arch, &config_path)?;
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    metadata.extend(tokenizer(dir, &cfg)?);

    let (tensors, file_len) = tensors(dir, &cfg, arch, heads, kv_heads)?;
    let dominant = tensors
        .iter()
        .filter(|t| t.dims.len() >= 2)
        .map(|t| t.ty)
        .max_by_key(|ty| {
            tensors
                .iter()
                .filter(|t| t.ty == *ty)
                .map(|t| t.size)
                .sum::<u64>()
        });
    let file_type = match dominant {
        Some(GgmlType::F16) => 1,
        Some(GgmlType::BF16) => 32,
        _ => 0,
    };
    metadata.insert("general.file_type".into(), Value::U32(file_type));
    let extra: u64 = [CONFIG, TOKENIZER, TOKENIZER_CONFIG]
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum();
    Ok(GgufFile {
        path: dir.to_path_buf(),
        version: 3,
        metadata,
        tensors,
        data_offset: 0,
        file_len: file_len + extra,
    })
}

/// The model keys (`general.*`, `{arch}.*`) for a checked config.json.
fn config_metadata(
    dir: &Path,
    cfg: &HfConfig,
    arch: &str,
    config_path: &Path,
) -> Result<BTreeMap<String, Value>, HfError> {
    let bad = |what: String| HfError::Config {
        path: config_path.into(),
        what,
    };
    if let Some(s) = cfg.rope_scaling.as_ref().filter(|s| !s.is_null()) {
        return Err(bad(format!("rope_scaling {s} is not supported")));
    }
    let heads = cfg.num_attention_heads;
    let kv_heads = cfg.num_key_value_heads.unwrap_or(heads);
    if heads == 0 || kv_heads == 0 || !cfg.hidden_size.is_multiple_of(heads) {
        return Err(bad(format!(
            "hidden_size {} does not split into {heads} heads",
            cfg.hidden_size
        )));
    }
    if !heads.is_multiple_of(kv_heads) {
        return Err(bad(format!(
            "{heads} attention heads do not share {kv_heads} key/value heads"
        )));
    }
    let head_dim = cfg.hidden_size / heads;
    if cfg.head_dim.is_some_and(|d| d != head_dim) {
        return Err(bad(format!(
            "head_dim {:?} differs from hidden_size / heads = {head_dim}",
            cfg.head_dim
        )));
    }
    if cfg.vocab_size == 0 || cfg.vocab_size > MAX_VOCAB {
        return Err(bad(format!(
            "vocab_size {} is out of range",
            cfg.vocab_size
        )));
    }
    let u32v = |v: u64| Value::U32(u32::try_from(v).unwrap_or(u32::MAX));
    let k = |s: &str| format!("{arch}.{s}");
    let name = dir
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().into_owned());
    let metadata: BTreeMap<String, Value> = [
        (
            "general.architecture".to_string(),
            Value::String(arch.into()),
        ),
        ("general.name".into(), Value::String(name)),
        (k("block_count"), u32v(cfg.num_hidden_layers)),
        (k("context_length"), u32v(cfg.max_position_embeddings)),
        (k("embedding_length"), u32v(cfg.hidden_size)),
        (k("feed_forward_length"), u32v(cfg.intermediate_size)),
        (k("attention.head_count"), u32v(heads)),
        (k("attention.head_count_kv"), u32v(kv_heads)),
        (k("rope.dimension_count"), u32v(head_dim)),
        (k("vocab_size"), u32v(cfg.vocab_size)),
        (
            k("rope.freq_base"),
            Value::F32(cfg.rope_theta.unwrap_or(10_000.0) as f32),
        ),
        (
            k("attention.layer_norm_rms_epsilon"),
            Value::F32(cfg.rms_norm_eps.unwrap_or(1e-6) as f32),
        ),
    ]
    .into_iter()
    .collect();
    Ok(metadata)
}

/// The safetensors files of the folder: the shards the index names, or `model.safetensors`.
fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, HfError> {
    let index = dir.join(WEIGHTS_INDEX);
    if !index.is_file() {
        return Ok(vec![required(dir, WEIGHTS)?]);
    }
    let j = read_json(&index)?;
    let bad = |what: String| HfError::Json {
        path: index.clone(),
        what,
    };
    let map = j
        .get("weight_map")
        .and_then(Json::as_object)
        .ok_or_else(|| bad("no weight_map object".into()))?;
    let mut files: Vec<String> = Vec::new();
    for (tensor, file) in map {
        let file = file
            .as_str()
            .ok_or_else(|| bad(format!("weight_map['{tensor}'] is not a file name")))?;
        // Only plain names inside this folder: never a path that leaves it.
        if file.is_empty() || file.contains(['/', '\\']) || file.starts_with('.') {
            return Err(bad(format!(
                "weight_map['{tensor}'] = '{file}' is not a file name"
            )));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    if files.is_empty() {
        return Err(bad("weight_map is empty".into()));
    }
    files.sort();
    Ok(files.into_iter().map(|f| dir.join(f)).collect())
}

/// GGUF name of a Hugging Face tensor name; `Ok(None)` for tensors convert_hf_to_gguf skips.
pub fn gguf_name(hf: &str) -> Option<Option<String>> {
    if hf.ends_with(".rotary_emb.inv_freq") {
        return Some(None);
    }
    for (h, g) in GLOBAL_NAMES {
        if hf == h {
            return Some(Some(g.to_string()));
        }
    }
    let rest = hf.strip_prefix("model.layers.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let (_, g) = LAYER_NAMES.iter().find(|(h, _)| *h == suffix)?;
    Some(Some(format!("blk.{layer}.{g}")))
}

/// Hugging Face name of a GGUF tensor name (the inverse of [`gguf_name`]).
pub fn hf_name(gguf: &str) -> Option<String> {
    for (h, g) in GLOBAL_NAMES {
        if gguf == g {
            return Some(h.to_string());
        }
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    let layer: u64 = layer.parse().ok()?;
    let (h, _) = LAYER_NAMES.iter().find(|(_, g)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{h}"))
}

const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

const LAYER_NAMES: [(&str, &str); 12] = [
    ("input_layernorm.weight", "attn_norm.weight"),
    ("self_attn.q_proj.weight", "attn_q.weight"),
    ("self_attn.q_proj.bias", "attn_q.bias"),
    ("self_attn.k_proj.weight", "attn_k.weight"),
    ("self_attn.k_proj.bias", "attn_k.bias"),
    ("self_attn.v_proj.weight", "attn_v.weight"),
    ("self_attn.v_proj.bias", "attn_v.bias"),
    ("self_attn.o_proj.weight", "attn_output.weight"),
    ("post_attention_layernorm.weight", "ffn_norm.weight"),
    ("mlp.gate_proj.weight", "ffn_gate.weight"),
    ("mlp.up_proj.weight", "ffn_up.weight"),
    ("mlp.down_proj.weight", "ffn_down.weight"),
];

/// Every weight of the folder as a GGUF tensor entry, and the safetensors files' total size.
fn tensors(
    dir: &Path,
    cfg: &HfConfig,
    arch: &str,
    heads: u64,
    kv_heads: u64,
) -> Result<(Vec<TensorInfo>, u64), HfError> {
    let mut out: Vec<TensorInfo> = Vec::new();
    let mut total = 0u64;
    for shard in shard_files(dir)? {
        let st = SafetensorsFile::open(&shard)?;
        total += st.file_len;
        let path: Arc<Path> = Arc::from(shard.as_path());
        for t in st.tensors {
            let bad = |what: String| HfError::Tensor {
                name: t.name.clone(),
                path: shard.clone(),
                what,
            };
            let name = match gguf_name(&t.name) {
                Some(Some(n)) => n,
                Some(None) => continue,
                None => {
                    return Err(bad(
                        "no Llama-family weight has this name (cannot map it to GGUF)".into(),
                    ));
                }
            };
            if let Some(layer) = name
                .strip_prefix("blk.")
                .and_then(|r| r.split('.').next())
                .and_then(|l| l.parse::<u64>().ok())
                .filter(|&l| l >= cfg.num_hidden_layers)
            {
                return Err(bad(format!(
                    "layer {layer}, but num_hidden_layers is {}",
                    cfg.num_hidden_layers
                )));
            }
            if t.shape.is_empty() || t.shape.len() > 4 {
                return Err(bad(format!("rank {} (1..=4 allowed)", t.shape.len())));
            }
            let dims: Vec<u64> = t.shape.iter().rev().copied().collect();
            let rope_heads = match name.rsplit('.').nth(1) {
                _ if arch != "llama" => None,
                Some("attn_q") => Some(heads),
                Some("attn_k") => Some(kv_heads),
                _ => None,
            };
            if let Some(h) = rope_heads {
                let rows = t.shape[0];
                // h comes from config.json: checked, so a hostile count is an error, not a wrap.
                if h.checked_mul(2).is_none_or(|d| !rows.is_multiple_of(d)) {
                    return Err(bad(format!(
                        "{rows} rows do not split into {h} heads of an even size"
                    )));
                }
            }
            if out.iter().any(|o| o.name == name) {
                return Err(bad(format!("'{name}' appears twice in the folder")));
            }
            out.push(TensorInfo {
                name,
                dims,
                ty: t.dtype,
                offset: t.start,
                size: t.size,
                source: TensorSource::Safetensors {
                    path: Arc::clone(&path),
                    start: t.start,
                    rope_heads: rope_heads.map(|h| h as usize),
                },
            });
        }
    }
    gguf_order(&mut out);
    Ok((out, total))
}

/// GGUF order: embedding, blocks in order, then the output norm and head.
fn gguf_order(tensors: &mut [TensorInfo]) {
    tensors.sort_by_key(|t| {
        let layer = t
            .name
            .strip_prefix("blk.")
            .and_then(|r| r.split('.').next())
            .and_then(|l| l.parse::<u64>().ok());
        match (t.name.as_str(), layer) {
            ("token_embd.weight", _) => (0, 0, t.name.clone()),
            (_, Some(l)) => (1, l, t.name.clone()),
            _ => (2, 0, t.name.clone()),
        }
    });
}

/// Reads a safetensors tensor's bytes for a [`TensorSource::Safetensors`] entry.
pub fn read_tensor(
    info: &TensorInfo,
    path: &Path,
    start: u64,
    rope_heads: Option<usize>,
) -> Result<Vec<u8>, HfError> {
    use std::io::{Read, Seek, SeekFrom};
    let io = io_err(path);
    let mut f = std::fs::File::open(path).map_err(&io)?;
    // Checked again: the file may have changed since it was opened.
    let len = f.metadata().map_err(&io)?.len();
    let bad = |what: String| HfError::Tensor {
        name: info.name.clone(),
        path: path.into(),
        what,
    };
    if start.checked_add(info.size).is_none_or(|end| end > len) {
        return Err(bad(format!(
            "data at byte {start} ({} bytes) lies past the end of the {len}-byte file",
            info.size
        )));
    }
    f.seek(SeekFrom::Start(start)).map_err(&io)?;
    let size = usize::try_from(info.size).map_err(|_| bad("too large".into()))?;
    let mut buf = vec![0u8; size];
    f.read_exact(&mut buf).map_err(&io)?;
    if let Some(heads) = rope_heads {
        let rows = match info.dims.len() {
            1 => info.dims[0],
            _ => info.dims[1..].iter().product(),
        };
        rope_permute(&mut buf, rows as usize, heads, true).map_err(bad)?;
    }
    Ok(buf)
}

/// Reorders the `rows` rows of `buf` between Hugging Face's rotary layout (each head's first
/// half of dimensions, then its second half) and GGUF's (the two halves interleaved), for
/// `heads` heads: convert_hf_to_gguf's `permute` when `to_gguf`, its inverse otherwise.
pub fn rope_permute(
    buf: &mut [u8],
    rows: usize,
    heads: usize,
    to_gguf: bool,
) -> Result<(), String> {
    if heads == 0 || rows == 0 || !rows.is_multiple_of(2 * heads) || !buf.len().is_multiple_of(rows)
    {
        return Err(format!(
            "{rows} rows ({} bytes) do not split into {heads} heads of an even size",
            buf.len()
        ));
    }
    let rb = buf.len() / rows;
    let hd = rows / heads;
    let half = hd / 2;
    let src = buf.to_vec();
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let g = h * hd + 2 * i + j;
                let f = h * hd + j * half + i;
                let (to, from) = if to_gguf { (g, f) } else { (f, g) };
                buf[to * rb..(to + 1) * rb].copy_from_slice(&src[from * rb..(from + 1) * rb]);
            }
        }
    }
    Ok(())
}

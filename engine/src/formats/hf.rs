//! Hugging Face model folders (`config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! `*.safetensors`, sharded or not) opened as the same [`GgufFile`] view a GGUF gives, the way
//! llama.cpp's `convert_hf_to_gguf.py` maps them: metadata under the GGUF keys, tensors under
//! GGUF names, Llama Q/K rows permuted into GGUF's rotary layout when read. So the config,
//! weights, tokenizer, chat template, perplexity and quantizer all work on a folder unchanged.
//!
//! This module reads the folder's files and tensors; which family maps a config, and how, is
//! the family's (`model::arch`), put together by `model::hf_folder`. Open one with
//! `GgufFile::open` on the folder.

use std::path::{Path, PathBuf};

use serde_json::{Map, Value as Json};

use crate::formats::gguf::TensorInfo;
use crate::formats::hf_map;
use crate::formats::safetensors::SafetensorsError;
use tpslab_kernels::WType;

/// JSON files past this size are not a model's config or tokenizer: refuse before reading.
const MAX_JSON: u64 = 256 << 20;
/// A `tokenizer.json` past this size is not a model's (the largest, Gemma 3's with 262k tokens,
/// is about 33 MB): refused before it is read or parsed.
pub const MAX_TOKENIZER_JSON: u64 = 64 << 20;
/// Vocabulary ids past this are not real (the largest vocabularies are ~260k).
pub const MAX_VOCAB: u64 = 1 << 22;

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
    #[error("{path}: model type '{found}' is not supported (supported: {supported})")]
    Arch {
        path: PathBuf,
        found: String,
        supported: String,
    },
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

pub use crate::formats::hf_config::HfConfig;
pub use crate::formats::hf_map::hf_name;

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> HfError + '_ {
    move |source| HfError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a JSON file, refusing one too large to be a model's.
pub fn read_json(path: &Path) -> Result<Json, HfError> {
    read_json_text(path, MAX_JSON).map(|(json, _)| json)
}

/// Reads a JSON file of at most `budget` bytes (checked before reading): the parsed value and
/// the text it was parsed from.
pub fn read_json_text(path: &Path, budget: u64) -> Result<(Json, String), HfError> {
    let len = std::fs::metadata(path).map_err(io_err(path))?.len();
    if len > budget {
        return Err(HfError::Json {
            path: path.into(),
            what: format!("{len} bytes is past the {budget}-byte budget for this JSON file"),
        });
    }
    // Read through the budget too: the file may have grown since its size was asked.
    let mut text = String::new();
    let file = std::fs::File::open(path).map_err(io_err(path))?;
    std::io::Read::read_to_string(&mut std::io::Read::take(file, budget), &mut text).map_err(
        |e| match e.kind() {
            std::io::ErrorKind::InvalidData => HfError::Json {
                path: path.into(),
                what: "not UTF-8 text".into(),
            },
            _ => io_err(path)(e),
        },
    )?;
    let json = serde_json::from_str(&text).map_err(|e| HfError::Json {
        path: path.into(),
        what: format!("not valid JSON: {e}"),
    })?;
    Ok((json, text))
}

/// A required file of the folder, with an error naming it when absent.
pub fn required(dir: &Path, file: &'static str) -> Result<PathBuf, HfError> {
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

/// The config object, with a multimodal config's `text_config` lifted to the top as the
/// converter does.
pub fn config_object(path: &Path) -> Result<Map<String, Json>, HfError> {
    let bad = |what: String| HfError::Config {
        path: path.into(),
        what,
    };
    let Json::Object(mut j) = read_json(path)? else {
        return Err(bad("not a JSON object".into()));
    };
    match j.remove("text_config") {
        None | Some(Json::Null) => {}
        Some(Json::Object(text)) => j.extend(text),
        Some(v) => return Err(bad(format!("text_config {v} is not an object"))),
    }
    // Checked by name first: serde's own error would not say which field is wrong.
    for key in [
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "max_position_embeddings",
        "vocab_size",
    ] {
        hf_map::uint(&j, key).map_err(bad)?;
    }
    Ok(j)
}

/// The safetensors files of the folder: the shards the index names, or `model.safetensors`.
pub fn shard_files(dir: &Path) -> Result<Vec<PathBuf>, HfError> {
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

pub use crate::formats::gguf::Edit;

/// GGUF order: embedding, blocks in order, then the output norm and head.
pub fn gguf_order(tensors: &mut [TensorInfo]) {
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
    edit: &Edit,
) -> Result<Vec<u8>, HfError> {
    use std::io::{Read, Seek, SeekFrom};
    if let Edit::Computed(bytes) = edit {
        return Ok(bytes.to_vec());
    }
    let bad = |what: String| HfError::Tensor {
        name: info.name.clone(),
        path: path.into(),
        what,
    };
    // The bytes in the file: a norm stored as `1 + w` in F32 was read in its own type.
    let stored = match edit {
        Edit::PlusOne(WType::F16 | WType::BF16) => info.size / 2,
        _ => info.size,
    };
    let io = io_err(path);
    let mut f = std::fs::File::open(path).map_err(&io)?;
    // Checked again: the file may have changed since it was opened.
    let len = f.metadata().map_err(&io)?.len();
    if start.checked_add(stored).is_none_or(|end| end > len) {
        return Err(bad(format!(
            "data at byte {start} ({stored} bytes) lies past the end of the {len}-byte file"
        )));
    }
    f.seek(SeekFrom::Start(start)).map_err(&io)?;
    let size = usize::try_from(stored).map_err(|_| bad("too large".into()))?;
    let mut buf = vec![0u8; size];
    f.read_exact(&mut buf).map_err(&io)?;
    match edit {
        Edit::Permute(heads) => {
            let rows = match info.dims.len() {
                1 => info.dims[0],
                _ => info.dims[1..].iter().product(),
            };
            rope_permute(&mut buf, rows as usize, *heads, true).map_err(|e| bad(e.to_string()))?;
        }
        Edit::PlusOne(ty) => buf = plus_one(&buf, *ty),
        Edit::None | Edit::Computed(_) => {}
    }
    Ok(buf)
}

/// `1 + w` in F32 for each weight of `buf` (stored as `ty`: F32, F16 or BF16).
fn plus_one(buf: &[u8], ty: WType) -> Vec<u8> {
    let value = |c: &[u8]| match (ty, c) {
        (WType::F16, &[a, b]) => half::f16::from_le_bytes([a, b]).to_f32(),
        (WType::BF16, &[a, b]) => half::bf16::from_le_bytes([a, b]).to_f32(),
        (_, &[a, b, c, d]) => f32::from_le_bytes([a, b, c, d]),
        _ => 0.0,
    };
    let width = if ty == WType::F32 { 4 } else { 2 };
    buf.chunks_exact(width)
        .flat_map(|c| (value(c) + 1.0).to_le_bytes())
        .collect()
}

/// Rows that do not split into heads of an even size (a tensor's shape against its config).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{rows} rows ({bytes} bytes) do not split into {heads} heads of an even size")]
pub struct HeadSplit {
    pub rows: usize,
    pub bytes: usize,
    pub heads: usize,
}

/// Reorders the `rows` rows of `buf` between Hugging Face's rotary layout (each head's first
/// half of dimensions, then its second half) and GGUF's (the two halves interleaved), for
/// `heads` heads: convert_hf_to_gguf's `permute` when `to_gguf`, its inverse otherwise.
pub fn rope_permute(
    buf: &mut [u8],
    rows: usize,
    heads: usize,
    to_gguf: bool,
) -> Result<(), HeadSplit> {
    if heads == 0 || rows == 0 || !rows.is_multiple_of(2 * heads) || !buf.len().is_multiple_of(rows)
    {
        return Err(HeadSplit {
            rows,
            bytes: buf.len(),
            heads,
        });
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

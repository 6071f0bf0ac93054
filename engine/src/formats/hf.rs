//! Hugging Face model folders (`config.json`, `tokenizer.json`, `tokenizer_config.json`,
//! `*.safetensors`, sharded or not) opened as the same [`GgufFile`] view a GGUF gives, the way
//! llama.cpp's `convert_hf_to_gguf.py` maps them: metadata under the GGUF keys, tensors under
//! GGUF names, Llama Q/K rows permuted into GGUF's rotary layout when read. So the config,
//! weights, tokenizer, chat template, perplexity and quantizer all work on a folder unchanged.
//!
//! Open one with [`GgufFile::open`] on the folder (or [`open_folder`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value as Json};

use crate::formats::gguf::{GgufFile, TensorInfo, TensorSource, Value};
use crate::formats::hf_arch::{self, Change, Family, Rope, Shape};
use crate::formats::safetensors::{SafetensorsError, SafetensorsFile};
use tpslab_kernels::WType;

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
    #[error("{path}: model type '{found}' is not supported (supported: {supported})", supported = hf_arch::supported())]
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

pub use crate::formats::hf_config::HfConfig;

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

/// The GGUF architecture of a `config.json`'s `architectures[0]` (else its `model_type`), or
/// the name found when the engine does not run it (the library's import check asks this too).
pub fn gguf_arch_of(
    model_type: Option<&str>,
    architectures: &[String],
) -> Result<&'static str, String> {
    Family::of(model_type, architectures).map(Family::gguf_arch)
}

/// The GGUF tokenizer keys of a folder (`formats::hf_tokenizer::metadata`, passed in by
/// `GgufFile::open` so this reader does not import the tokenizer mapping that reads its types).
pub type TokenizerKeys = fn(&Path, &HfConfig) -> Result<Vec<(String, Value)>, HfError>;

/// The config object, with a multimodal config's `text_config` lifted to the top as the
/// converter does.
fn config_object(path: &Path) -> Result<Map<String, Json>, HfError> {
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
        hf_arch::uint(&j, key).map_err(bad)?;
    }
    Ok(j)
}

/// Opens the Hugging Face model in `dir` as a [`GgufFile`] view.
pub fn open_folder(dir: &Path, tokenizer: TokenizerKeys) -> Result<GgufFile, HfError> {
    let config_path = required(dir, CONFIG)?;
    // Checked up front so a folder missing either file is named as such.
    let tokenizer_path = required(dir, TOKENIZER)?;
    let bad = |what: String| HfError::Config {
        path: config_path.clone(),
        what,
    };
    let mut j = config_object(&config_path)?;
    let mut cfg: HfConfig = serde_json::from_value(Json::Object(j.clone()))
        .map_err(|e| bad(format!("not a transformers model config: {e}")))?;
    let family = Family::of(cfg.model_type.as_deref(), &cfg.architectures).map_err(|found| {
        HfError::Arch {
            path: config_path.clone(),
            found,
        }
    })?;
    hf_arch::transformers_defaults(family, &mut cfg, &mut j);
    if cfg.vocab_size == 0 || cfg.vocab_size > MAX_VOCAB {
        return Err(bad(format!(
            "vocab_size {} is out of range",
            cfg.vocab_size
        )));
    }
    let shape = hf_arch::shape(family, &cfg).map_err(bad)?;
    let rope = Rope::of(&j).map_err(bad)?;
    let mut metadata = hf_arch::metadata(family, &cfg, &j, &rope, &shape).map_err(bad)?;
    let arch = family.gguf_arch();
    let name = dir
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().into_owned());
    metadata.insert("general.architecture".into(), Value::String(arch.into()));
    metadata.insert("general.name".into(), Value::String(name));
    metadata.extend(tokenizer(dir, &cfg)?);

    let vocab_rows = match family {
        Family::Gemma3 => hf_arch::gemma3_vocab(&read_json(&tokenizer_path)?),
        _ => None,
    };
    let layout = Layout {
        family,
        shape: &shape,
        layers: cfg.num_hidden_layers,
        vocab_rows,
    };
    let (mut tensors, file_len) = tensors(dir, &layout)?;
    let computed = hf_arch::computed(family, &cfg, &rope, &shape).map_err(bad)?;
    let source: Arc<Path> = Arc::from(config_path.as_path());
    for (name, values) in computed {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push(TensorInfo {
            name,
            dims: vec![values.len() as u64],
            ty: WType::F32,
            offset: 0,
            size: bytes.len() as u64,
            source: TensorSource::Safetensors {
                path: Arc::clone(&source),
                start: 0,
                edit: Edit::Computed(Arc::from(bytes)),
            },
        });
    }
    gguf_order(&mut tensors);
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
        Some(WType::F16) => 1,
        Some(WType::BF16) => 32,
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

/// GGUF name of a Hugging Face tensor name of the Llama family; `Some(None)` for tensors
/// convert_hf_to_gguf skips ([`hf_arch::gguf_name`] for every family).
pub fn gguf_name(hf: &str) -> Option<Option<String>> {
    hf_arch::gguf_name(Family::Llama, hf)
}

pub use hf_arch::hf_name;

/// What the tensors of a folder are checked against and changed by.
struct Layout<'a> {
    family: Family,
    shape: &'a Shape,
    layers: u64,
    /// Gemma 3: embedding rows past the tokenizer's vocabulary are dropped.
    vocab_rows: Option<u64>,
}

pub use crate::formats::gguf::Edit;

/// One safetensors tensor as a GGUF entry of `layout`'s family, checked against its shape.
fn entry(
    t: &crate::formats::safetensors::StTensor,
    name: String,
    layout: &Layout<'_>,
    path: &Arc<Path>,
) -> Result<TensorInfo, String> {
    if let Some(layer) = name
        .strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|l| l.parse::<u64>().ok())
        .filter(|&l| l >= layout.layers)
    {
        return Err(format!(
            "layer {layer}, but num_hidden_layers is {}",
            layout.layers
        ));
    }
    if t.shape.is_empty() || t.shape.len() > 4 {
        return Err(format!("rank {} (1..=4 allowed)", t.shape.len()));
    }
    let mut dims: Vec<u64> = t.shape.iter().rev().copied().collect();
    let (mut ty, mut size) = (t.dtype, t.size);
    let edit = match hf_arch::change(layout.family, &name, layout.shape) {
        Change::None => Edit::None,
        Change::Permute(h) => {
            let rows = t.shape[0];
            // h comes from config.json: checked, so a hostile count is an error, not a wrap.
            if h.checked_mul(2).is_none_or(|d| !rows.is_multiple_of(d)) {
                return Err(format!(
                    "{rows} rows do not split into {h} heads of an even size"
                ));
            }
            Edit::Permute(h as usize)
        }
        Change::PlusOne => {
            if !matches!(t.dtype, WType::F32 | WType::F16 | WType::BF16) {
                return Err(format!("a norm weight of type {:?}", t.dtype));
            }
            ty = WType::F32;
            size = dims.iter().product::<u64>() * 4;
            Edit::PlusOne(t.dtype)
        }
    };
    if name == "token_embd.weight"
        && let (Some(keep), [_, rows]) = (layout.vocab_rows, dims.as_mut_slice())
        && keep < *rows
    {
        // The rows are outermost: the first `keep` of them are a prefix of the data.
        size = size / *rows * keep;
        *rows = keep;
    }
    Ok(TensorInfo {
        name,
        dims,
        ty,
        offset: t.start,
        size,
        source: TensorSource::Safetensors {
            path: Arc::clone(path),
            start: t.start,
            edit,
        },
    })
}

/// Every weight of the folder as a GGUF tensor entry, and the safetensors files' total size.
fn tensors(dir: &Path, layout: &Layout<'_>) -> Result<(Vec<TensorInfo>, u64), HfError> {
    let mut out: Vec<TensorInfo> = Vec::new();
    let mut total = 0u64;
    for shard in shard_files(dir)? {
        let st = SafetensorsFile::open(&shard)?;
        total += st.file_len;
        let path: Arc<Path> = Arc::from(shard.as_path());
        for t in &st.tensors {
            let bad = |what: String| HfError::Tensor {
                name: t.name.clone(),
                path: shard.clone(),
                what,
            };
            let name = match hf_arch::gguf_name(layout.family, &t.name) {
                Some(Some(n)) => n,
                Some(None) => continue,
                None => {
                    return Err(bad(format!(
                        "no {} weight has this name (cannot map it to GGUF)",
                        layout.family.gguf_arch()
                    )));
                }
            };
            if out.iter().any(|o| o.name == name) {
                return Err(bad(format!("'{name}' appears twice in the folder")));
            }
            out.push(entry(t, name, layout, &path).map_err(bad)?);
        }
    }
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
            rope_permute(&mut buf, rows as usize, *heads, true).map_err(bad)?;
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

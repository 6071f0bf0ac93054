//! Describing a model for the library index from its headers: a GGUF's metadata and tensor
//! table, or a safetensors folder's `config.json` and each `*.safetensors` header (shapes and
//! dtypes, every length checked against the file before anything is read or allocated). Only
//! describes and validates; loading is [`crate::formats::gguf`]'s and [`crate::formats::hf`]'s.

use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::formats::gguf::{GgufFile, Value};
use crate::library;
use crate::library::entry::{
    IndexError, ModelEntry, ModelFile, ModelFormat, ModelSource, StoredType,
};
use crate::model::config::ModelConfig;
use crate::text::tokenizer::Tokenizer;

/// A manifest or config.json past this size is not ours: refuse before reading it.
const MAX_JSON: u64 = 64 << 20;

/// The safetensors crate's own limit on the JSON header.
const MAX_HEADER: u64 = 100 << 20;

/// Files of a Hugging Face model folder that the library keeps (config, tokenizer, weights,
/// chat template); anything else in a folder being imported is left behind.
pub fn is_model_file(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    !lower.starts_with('.')
        && [".json", ".safetensors", ".jinja", ".model", ".txt"]
            .iter()
            .any(|ext| lower.ends_with(ext))
}

fn dtype_size(dtype: &str) -> Option<u64> {
    Some(match dtype {
        "F64" | "I64" | "U64" => 8,
        "F32" | "I32" | "U32" => 4,
        "F16" | "BF16" | "I16" | "U16" => 2,
        "I8" | "U8" | "BOOL" | "F8_E4M3" | "F8_E5M2" => 1,
        _ => return None,
    })
}

/// Facts of a safetensors folder whose files are `listing` (name, size).
pub(crate) fn folder_facts(dir: &Path, listing: &[(String, u64)]) -> Result<Facts, IndexError> {
    let invalid = |reason: String| IndexError::Invalid {
        path: dir.to_path_buf(),
        reason,
    };
    let has = |f: &str| listing.iter().any(|(n, _)| n == f);
    for need in ["config.json", "tokenizer.json"] {
        if !has(need) {
            return Err(invalid(format!(
                "no GGUF file, and no {need} for a safetensors model"
            )));
        }
    }
    let weights: Vec<&(String, u64)> = listing
        .iter()
        .filter(|(n, _)| n.ends_with(".safetensors"))
        .collect();
    if weights.is_empty() {
        return Err(invalid("no *.safetensors weights".into()));
    }
    if has("model.safetensors.index.json") {
        let index = read_small_json(&dir.join("model.safetensors.index.json"))?;
        let map = index["weight_map"]
            .as_object()
            .ok_or_else(|| invalid("model.safetensors.index.json has no weight_map".into()))?;
        for shard in map.values().filter_map(|v| v.as_str()) {
            if !has(shard) {
                return Err(invalid(format!(
                    "shard {shard} named in model.safetensors.index.json is missing"
                )));
            }
        }
    }
    let config = read_small_json(&dir.join("config.json"))?;
    let arch = config["architectures"][0]
        .as_str()
        .or_else(|| config["model_type"].as_str())
        .unwrap_or("unknown")
        .to_string();
    let context_len = config["max_position_embeddings"].as_u64();
    let mut params = 0u64;
    let mut by_dtype: Vec<(String, u64)> = Vec::new();
    for (name, _) in weights {
        for (dtype, elements, bytes) in tensors(&dir.join(name))? {
            params = params.saturating_add(elements);
            match by_dtype.iter_mut().find(|(d, _)| *d == dtype) {
                Some((_, n)) => *n += bytes,
                None => by_dtype.push((dtype, bytes)),
            }
        }
    }
    let precision = by_dtype
        .iter()
        .max_by_key(|(_, n)| *n)
        .map(|(d, _)| d.clone())
        .or_else(|| config["torch_dtype"].as_str().map(torch_dtype_name))
        .map_or(StoredType::Unknown, |d| StoredType::from_dtype(&d));
    Ok(Facts {
        arch,
        params,
        precision,
        context_len,
    })
}

/// The safetensors name of a config's `torch_dtype` ("bfloat16" -> "BF16").
fn torch_dtype_name(torch: &str) -> String {
    match torch.to_ascii_lowercase().as_str() {
        "bfloat16" => "BF16".into(),
        "float16" | "half" => "F16".into(),
        "float32" | "float" => "F32".into(),
        _ => torch.to_uppercase(),
    }
}

/// (dtype, elements, bytes) of every tensor in one safetensors file, validated against it.
fn tensors(path: &Path) -> Result<Vec<(String, u64, u64)>, IndexError> {
    let invalid = |reason: String| IndexError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let mut f = std::fs::File::open(path).map_err(|e| invalid(e.to_string()))?;
    let len = f.metadata().map_err(|e| invalid(e.to_string()))?.len();
    let mut n = [0u8; 8];
    f.read_exact(&mut n)
        .map_err(|_| invalid("shorter than a safetensors header".into()))?;
    let n = u64::from_le_bytes(n);
    if n > MAX_HEADER || n > len.saturating_sub(8) {
        return Err(invalid(format!(
            "not a safetensors file or truncated: header of {n} bytes in a file of {len}"
        )));
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header)
        .map_err(|e| invalid(e.to_string()))?;
    let header: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(&header)
        .map_err(|e| invalid(format!("header is not a JSON object: {e}")))?;
    let data_len = len - 8 - n;
    let mut out = Vec::new();
    for (name, t) in header.iter().filter(|(k, _)| *k != "__metadata__") {
        let bad = |what: &str| invalid(format!("tensor '{name}': {what}"));
        let dtype = t["dtype"].as_str().ok_or_else(|| bad("no dtype"))?;
        let size = dtype_size(dtype).ok_or_else(|| bad(&format!("unknown dtype {dtype}")))?;
        let shape = t["shape"].as_array().ok_or_else(|| bad("no shape"))?;
        let elements = shape
            .iter()
            .try_fold(1u64, |acc, d| d.as_u64().and_then(|d| acc.checked_mul(d)));
        let elements = elements.ok_or_else(|| bad("bad shape"))?;
        let (begin, end) = match t["data_offsets"].as_array().map(Vec::as_slice) {
            Some([b, e]) => (b.as_u64(), e.as_u64()),
            _ => (None, None),
        };
        let (begin, end) = begin.zip(end).ok_or_else(|| bad("bad data_offsets"))?;
        if begin > end || end > data_len {
            return Err(bad(&format!(
                "data {begin}..{end} lies outside the {data_len} data bytes (truncated file?)"
            )));
        }
        if elements.checked_mul(size) != Some(end - begin) {
            return Err(bad("data size does not match its shape and dtype"));
        }
        out.push((dtype.to_string(), elements, end - begin));
    }
    Ok(out)
}

/// What to load for the model at `entry` (a library entry or a staged copy): a folder holding
/// one GGUF loads that file; a GGUF file or a safetensors folder loads as it is.
/// A folder holding a split GGUF loads its first part.
pub(crate) fn load_path(entry: &Path, format: ModelFormat, files: &[ModelFile]) -> PathBuf {
    match (format, files) {
        (ModelFormat::Gguf, [f]) if entry.is_dir() => entry.join(&f.name),
        (ModelFormat::Gguf, [f, ..]) if entry.is_dir() => {
            let first = files.iter().find(|f| is_first_part(&f.name)).unwrap_or(f);
            entry.join(&first.name)
        }
        _ => entry.to_path_buf(),
    }
}

/// `NAME-00001-of-0000N.gguf`: the part a split model opens from.
pub(crate) fn is_first_part(name: &str) -> bool {
    crate::formats::gguf_split::first_part(name).is_some()
}

/// `name` inside a model path: the path itself for a single file (or a sibling part of a split
/// GGUF), else a file of the folder.
pub(crate) fn file_at(model: &Path, name: &str) -> Option<PathBuf> {
    if model.is_file() {
        return if model.file_name()?.to_str()? == name {
            Some(model.to_path_buf())
        } else {
            Some(model.with_file_name(name))
        };
    }
    Some(model.join(name))
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

pub(crate) fn combined_sha(format: &ModelFormat, files: &[ModelFile]) -> String {
    match (format, files) {
        (ModelFormat::Gguf, [f]) => f.sha256.clone(),
        _ => {
            let mut sorted: Vec<&ModelFile> = files.iter().collect();
            sorted.sort_by(|a, b| a.name.cmp(&b.name));
            let listing: String = sorted
                .iter()
                .map(|f| format!("{}  {}\n", f.sha256, f.name))
                .collect();
            hex(&Sha256::digest(listing.as_bytes()))
        }
    }
}

/// Describes the model at `path` (a GGUF file, a folder with one GGUF, or a safetensors folder)
/// from its headers; with `hash`, also the sha256 of every file.
pub fn describe(
    path: &Path,
    name: &str,
    source: ModelSource,
    hash: bool,
) -> Result<ModelEntry, IndexError> {
    let invalid = |reason: String| IndexError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let md = std::fs::metadata(path).map_err(|e| invalid(e.to_string()))?;
    let (format, mut files, facts) = if md.is_file() {
        let (facts, parts) = gguf_facts(path)?;
        (ModelFormat::Gguf, parts, facts)
    } else {
        // A Hugging Face cache's snapshot is links into its blobs (each checked to resolve
        // inside the cache before it gets here): those are followed; a library folder's links
        // are not.
        let follow = matches!(source, ModelSource::HfCache { .. });
        let mut listing: Vec<(String, u64)> = std::fs::read_dir(path)
            .map_err(|e| invalid(e.to_string()))?
            .filter_map(Result::ok)
            .filter_map(|e| {
                let md = if follow {
                    std::fs::metadata(e.path()).ok()?
                } else {
                    e.metadata().ok()?
                };
                md.is_file()
                    .then(|| Some((e.file_name().into_string().ok()?, md.len())))?
            })
            .filter(|(n, _)| !n.starts_with('.'))
            .collect();
        listing.sort();
        let ggufs: Vec<&(String, u64)> = listing
            .iter()
            .filter(|(n, _)| n.to_ascii_lowercase().ends_with(".gguf"))
            .collect();
        let first_part = ggufs.iter().find(|(n, _)| is_first_part(n));
        if let [g] = ggufs.as_slice() {
            let (facts, _) = gguf_facts(&path.join(&g.0))?;
            (ModelFormat::Gguf, vec![(*g).clone()], facts)
        } else if let Some((first, _)) = first_part {
            // A split GGUF: its parts must be the folder's GGUF files.
            let (facts, parts) = gguf_facts(&path.join(first))?;
            let mut names: Vec<&str> = ggufs.iter().map(|(n, _)| n.as_str()).collect();
            let mut want: Vec<&str> = parts.iter().map(|(n, _)| n.as_str()).collect();
            names.sort_unstable();
            want.sort_unstable();
            if names != want {
                return Err(invalid(format!(
                    "the folder's GGUF files {names:?} are not the parts {want:?} of {first}"
                )));
            }
            (ModelFormat::Gguf, parts, facts)
        } else {
            let facts = folder_facts(path, &listing)?;
            let keep = listing
                .into_iter()
                .filter(|(n, _)| is_model_file(n))
                .collect();
            (ModelFormat::Safetensors, keep, facts)
        }
    };
    files.sort();
    let files: Vec<ModelFile> = files
        .into_iter()
        .map(|(fname, size)| {
            let sha256 = if hash {
                let p = file_at(path, &fname).unwrap_or_else(|| path.join(&fname));
                library::sha256_file(&p)?
            } else {
                String::new()
            };
            Ok(ModelFile {
                name: fname,
                size,
                sha256,
            })
        })
        .collect::<Result<_, IndexError>>()?;
    let sha256 = if hash {
        combined_sha(&format, &files)
    } else {
        String::new()
    };
    Ok(ModelEntry {
        name: name.to_string(),
        path: load_path(path, format, &files),
        format,
        source,
        size: files.iter().map(|f| f.size).sum(),
        files,
        arch: facts.arch,
        params: facts.params,
        precision: facts.precision,
        context_len: facts.context_len,
        sha256,
    })
}

/// Refuses a model the engine cannot load, before it enters the library: a GGUF without
/// tensors or of an architecture the engine does not run, a safetensors set without tensors or
/// whose `config.json` names such an architecture. (Not a GGUF and a folder without
/// `config.json` are refused by [`describe`] already.) The reason names what is wrong.
pub fn check_loadable(entry: &ModelEntry) -> Result<(), IndexError> {
    let invalid = |reason: String| IndexError::Invalid {
        path: entry.path.clone(),
        reason,
    };
    let unsupported = |arch: &str| invalid(crate::model::arch::unsupported(arch).to_string());
    match entry.format {
        ModelFormat::Gguf => {
            if crate::model::arch::lookup(&entry.arch).is_none() {
                return Err(unsupported(&entry.arch));
            }
        }
        ModelFormat::Safetensors => {
            let config = read_small_json(&entry.path.join("config.json"))?;
            let architectures: Vec<String> = config["architectures"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(String::from))
                        .collect()
                })
                .unwrap_or_default();
            crate::model::hf_folder::gguf_arch_of(config["model_type"].as_str(), &architectures)
                .map_err(|found| unsupported(&found.0))?;
        }
    }
    if entry.params == 0 {
        return Err(invalid("it holds no tensors".into()));
    }
    Ok(())
}

/// What `models import` asks besides [`check_loadable`]: the model's headers and names as the
/// engine loads them: its configuration, its tokenizer, and every tensor its architecture
/// needs, with its shape and a type the kernels run ([`crate::model::arch::probe`]; no
/// tensor data is read). A folder whose `config.json` says Llama over tensors that are not
/// one is refused here, not when it is first loaded.
pub fn check_headers(entry: &ModelEntry) -> Result<(), IndexError> {
    let invalid = |reason: String| IndexError::Invalid {
        path: entry.path.clone(),
        reason,
    };
    let file = GgufFile::open(&entry.path).map_err(|e| invalid(e.to_string()))?;
    let cfg = ModelConfig::from_gguf(&file).map_err(|e| invalid(e.to_string()))?;
    Tokenizer::from_gguf(&file).map_err(|e| invalid(format!("its tokenizer: {e}")))?;
    crate::model::arch::probe(&file, &cfg).map_err(|e| {
        invalid(format!(
            "its tensors are not a {} model as the engine loads one: {e}",
            entry.arch
        ))
    })
}

/// What a model's headers say about it.
pub(crate) struct Facts {
    pub arch: String,
    pub params: u64,
    pub precision: StoredType,
    pub context_len: Option<u64>,
}

/// The facts of the GGUF at `path`, and its files (name, size): the file itself, or every part
/// of a split model.
fn gguf_facts(path: &Path) -> Result<(Facts, Vec<(String, u64)>), IndexError> {
    let f = GgufFile::open(path).map_err(|e| IndexError::Invalid {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    let parts = crate::formats::gguf_split::model_files(&f)
        .iter()
        .map(|p| {
            let len = std::fs::metadata(p).map_err(|e| IndexError::Invalid {
                path: p.clone(),
                reason: e.to_string(),
            })?;
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            Ok((name, len.len()))
        })
        .collect::<Result<Vec<_>, IndexError>>()?;
    let (arch, context_len) = arch_and_context(&f);
    // The file's dominant type, named even where the kernels cannot run it: the library lists
    // every model it holds.
    let precision =
        crate::model::precision::dominant_type(&f).map_or(StoredType::Unknown, StoredType::Ggml);
    Ok((
        Facts {
            arch,
            params: f.tensors.iter().map(|t| t.n_elements()).sum(),
            precision,
            context_len,
        },
        parts,
    ))
}

pub(crate) fn read_small_json(path: &Path) -> Result<serde_json::Value, IndexError> {
    let invalid = |reason: String| IndexError::Invalid {
        path: path.to_path_buf(),
        reason,
    };
    let len = std::fs::metadata(path)
        .map_err(|e| invalid(e.to_string()))?
        .len();
    if len > MAX_JSON {
        return Err(invalid(format!("{len} bytes is too large for a JSON file")));
    }
    let bytes = std::fs::read(path).map_err(|e| invalid(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| invalid(format!("not valid JSON: {e}")))
}

/// A GGUF header's `general.architecture` ("unknown" without one) and its context length.
pub(crate) fn arch_and_context(f: &GgufFile) -> (String, Option<u64>) {
    let arch = f
        .get("general.architecture")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_string();
    let context_len = f
        .get(&format!("{arch}.context_length"))
        .and_then(Value::as_u64);
    (arch, context_len)
}

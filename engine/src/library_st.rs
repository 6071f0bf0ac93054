//! Safetensors folders as the library index sees them: `config.json` facts and the tensor shapes
//! and dtypes from each `*.safetensors` header, every length checked against the file before
//! anything is read or allocated. Only describes and validates; loading is [`crate::hf`]'s.

use std::io::Read;
use std::path::Path;

use crate::library_index::{Facts, IndexError, read_small_json};

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
        .or_else(|| config["torch_dtype"].as_str().map(str::to_uppercase))
        .unwrap_or_else(|| "unknown".into());
    Ok(Facts {
        arch,
        params,
        precision,
        context_len,
    })
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

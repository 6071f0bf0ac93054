//! Safetensors files: a validating reader of the header (tensor names, dtypes, shapes, offsets)
//! and a streaming writer, for the float dtypes the engine computes with (F32, F16, BF16).
//!
//! The format: an 8-byte little-endian header length `N`, `N` bytes of JSON
//! (`{"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {..}}`), then the
//! data, offsets relative to its start. As in [`crate::formats::gguf`], every length and offset is checked
//! against the real file size before anything is allocated for it, and unknown dtypes are refused
//! by name rather than guessed.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use tpslab_kernels::WType;

/// The safetensors crate's own limit on the JSON header; a real header is a few hundred KB.
pub const MAX_HEADER: u64 = 100 << 20;
/// Safetensors shapes are small; nothing real has more dimensions than this.
const MAX_RANK: usize = 8;

/// Why a safetensors file was refused.
#[derive(Debug, thiserror::Error)]
pub enum SafetensorsError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is not a safetensors file or is truncated: header of {header} bytes, but the file has {len} bytes"
    )]
    Header {
        path: PathBuf,
        header: u64,
        len: u64,
    },
    #[error("{path}: the header is not valid JSON: {err}")]
    Json { path: PathBuf, err: String },
    #[error(
        "{path}: tensor '{tensor}' has dtype {dtype}, which this engine does not load (F32, F16 and BF16 are supported)"
    )]
    Dtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("{path}: tensor '{tensor}': {what}")]
    Tensor {
        path: PathBuf,
        tensor: String,
        what: String,
    },
    #[error("cannot write safetensors: {0}")]
    Write(String),
}

/// One tensor of a safetensors file, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct StTensor {
    pub name: String,
    pub dtype: WType,
    /// Row-major, outermost first (PyTorch order: the reverse of ggml's `dims`).
    pub shape: Vec<u64>,
    /// Absolute byte offset of the data in the file.
    pub start: u64,
    /// Bytes of data (elements x dtype size).
    pub size: u64,
}

/// A parsed safetensors header; tensor data is read on demand by the caller.
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    pub path: PathBuf,
    /// Tensors in data order.
    pub tensors: Vec<StTensor>,
    /// The free-form `__metadata__` strings.
    pub metadata: BTreeMap<String, String>,
    pub file_len: u64,
}

/// The safetensors name of a dtype this engine loads.
pub fn dtype_name(ty: WType) -> Option<&'static str> {
    Some(match ty {
        WType::F32 => "F32",
        WType::F16 => "F16",
        WType::BF16 => "BF16",
        _ => return None,
    })
}

fn parse_dtype(s: &str) -> Option<WType> {
    Some(match s {
        "F32" => WType::F32,
        "F16" => WType::F16,
        "BF16" => WType::BF16,
        _ => return None,
    })
}

impl SafetensorsFile {
    /// Reads and validates the header of `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SafetensorsError> {
        let path = path.as_ref();
        let io = |source| SafetensorsError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = File::open(path).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let header_err = |header| SafetensorsError::Header {
            path: path.to_path_buf(),
            header,
            len,
        };
        if len < 8 {
            return Err(header_err(0));
        }
        let mut n = [0u8; 8];
        f.read_exact(&mut n).map_err(io)?;
        let n = u64::from_le_bytes(n);
        if n > len - 8 || !(2..=MAX_HEADER).contains(&n) {
            return Err(header_err(n));
        }
        // Bounded by the real file size and MAX_HEADER just above.
        let mut json = vec![0u8; n as usize];
        f.read_exact(&mut json).map_err(io)?;
        Self::parse(path, &json, len)
    }

    /// Validates a header `json` of a file of `len` bytes.
    fn parse(path: &Path, json: &[u8], len: u64) -> Result<Self, SafetensorsError> {
        let json_err = |err: String| SafetensorsError::Json {
            path: path.to_path_buf(),
            err,
        };
        let data_start = 8 + json.len() as u64;
        let data_len = len - data_start;
        let header: serde_json::Map<String, serde_json::Value> =
            serde_json::from_slice(json).map_err(|e| json_err(e.to_string()))?;
        let mut tensors = Vec::with_capacity(header.len());
        let mut metadata = BTreeMap::new();
        for (name, v) in header {
            let bad = |what: String| SafetensorsError::Tensor {
                path: path.to_path_buf(),
                tensor: name.clone(),
                what,
            };
            if name == "__metadata__" {
                let map = v
                    .as_object()
                    .ok_or_else(|| json_err("__metadata__ is not an object".into()))?;
                for (k, v) in map {
                    let s = v
                        .as_str()
                        .ok_or_else(|| json_err(format!("__metadata__ '{k}' is not a string")))?;
                    metadata.insert(k.clone(), s.to_string());
                }
                continue;
            }
            let dtype = v
                .get("dtype")
                .and_then(|d| d.as_str())
                .ok_or_else(|| bad("no dtype string".into()))?;
            let ty = parse_dtype(dtype).ok_or_else(|| SafetensorsError::Dtype {
                path: path.to_path_buf(),
                tensor: name.clone(),
                dtype: dtype.to_string(),
            })?;
            let shape: Vec<u64> = v
                .get("shape")
                .and_then(|s| s.as_array())
                .ok_or_else(|| bad("no shape array".into()))?
                .iter()
                .map(|d| d.as_u64().ok_or_else(|| bad(format!("shape entry {d}"))))
                .collect::<Result<_, _>>()?;
            if shape.len() > MAX_RANK {
                return Err(bad(format!("rank {} is over {MAX_RANK}", shape.len())));
            }
            let offsets: Vec<u64> = v
                .get("data_offsets")
                .and_then(|s| s.as_array())
                .filter(|a| a.len() == 2)
                .ok_or_else(|| bad("data_offsets is not [begin, end]".into()))?
                .iter()
                .map(|d| d.as_u64().ok_or_else(|| bad(format!("data offset {d}"))))
                .collect::<Result<_, _>>()?;
            let (begin, end) = (offsets[0], offsets[1]);
            if begin > end || end > data_len {
                return Err(bad(format!(
                    "data_offsets [{begin}, {end}] lie outside the {data_len} bytes of data"
                )));
            }
            let bytes = shape
                .iter()
                .try_fold(ty.type_size() as u64, |acc, &d| acc.checked_mul(d))
                .ok_or_else(|| bad(format!("shape {shape:?} overflows")))?;
            if bytes != end - begin {
                return Err(bad(format!(
                    "shape {shape:?} of {dtype} needs {bytes} bytes, but data_offsets span {}",
                    end - begin
                )));
            }
            tensors.push(StTensor {
                name,
                dtype: ty,
                shape,
                start: data_start + begin,
                size: bytes,
            });
        }
        tensors.sort_by_key(|t| t.start);
        for w in tensors.windows(2) {
            if w[0].start + w[0].size > w[1].start {
                return Err(SafetensorsError::Tensor {
                    path: path.to_path_buf(),
                    tensor: w[1].name.clone(),
                    what: format!("its data overlaps tensor '{}'", w[0].name),
                });
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            tensors,
            metadata,
            file_len: len,
        })
    }

    pub fn tensor(&self, name: &str) -> Option<&StTensor> {
        self.tensors.iter().find(|t| t.name == name)
    }
}

/// A tensor to write: name, dtype, PyTorch-order shape.
#[derive(Debug, Clone, PartialEq)]
pub struct StDesc {
    pub name: String,
    pub dtype: WType,
    pub shape: Vec<u64>,
}

impl StDesc {
    pub fn size(&self) -> u64 {
        self.shape.iter().product::<u64>() * self.dtype.type_size() as u64
    }
}

/// Writes a safetensors file: the header from the descriptions on [`StWriter::new`], then each
/// tensor's data in order, size-checked, so a model need not be held in memory at once.
#[derive(Debug)]
pub struct StWriter<W: Write> {
    out: W,
    tensors: Vec<StDesc>,
    next: usize,
}

impl<W: Write> StWriter<W> {
    pub fn new(
        mut out: W,
        tensors: Vec<StDesc>,
        metadata: &BTreeMap<String, String>,
    ) -> Result<Self, SafetensorsError> {
        let mut header = serde_json::Map::new();
        if !metadata.is_empty() {
            header.insert("__metadata__".into(), serde_json::json!(metadata));
        }
        let mut offset = 0u64;
        for t in &tensors {
            let dtype = dtype_name(t.dtype).ok_or_else(|| {
                SafetensorsError::Write(format!("tensor '{}': dtype {}", t.name, t.dtype))
            })?;
            if t.name == "__metadata__" || header.contains_key(&t.name) {
                return Err(SafetensorsError::Write(format!(
                    "tensor name '{}' repeated or reserved",
                    t.name
                )));
            }
            let end = offset + t.size();
            header.insert(
                t.name.clone(),
                serde_json::json!({"dtype": dtype, "shape": t.shape, "data_offsets": [offset, end]}),
            );
            offset = end;
        }
        let mut json = serde_json::to_vec(&header)
            .map_err(|e| SafetensorsError::Write(format!("header: {e}")))?;
        // Data starts 8-aligned, padded with spaces as the reference writer does.
        json.resize(json.len().next_multiple_of(8), b' ');
        let io = |e: std::io::Error| SafetensorsError::Write(e.to_string());
        out.write_all(&(json.len() as u64).to_le_bytes())
            .map_err(io)?;
        out.write_all(&json).map_err(io)?;
        Ok(Self {
            out,
            tensors,
            next: 0,
        })
    }

    /// Writes the next tensor's data (exactly its size).
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), SafetensorsError> {
        let t = self
            .tensors
            .get(self.next)
            .ok_or_else(|| SafetensorsError::Write("more data than tensors".into()))?;
        if data.len() as u64 != t.size() {
            return Err(SafetensorsError::Write(format!(
                "tensor '{}' needs {} bytes, got {}",
                t.name,
                t.size(),
                data.len()
            )));
        }
        self.out
            .write_all(data)
            .map_err(|e| SafetensorsError::Write(e.to_string()))?;
        self.next += 1;
        Ok(())
    }

    /// Checks every tensor was written, flushes and hands back the writer.
    pub fn finish(mut self) -> Result<W, SafetensorsError> {
        if let Some(t) = self.tensors.get(self.next) {
            return Err(SafetensorsError::Write(format!(
                "tensor '{}' was never written",
                t.name
            )));
        }
        self.out
            .flush()
            .map_err(|e| SafetensorsError::Write(e.to_string()))?;
        Ok(self.out)
    }
}

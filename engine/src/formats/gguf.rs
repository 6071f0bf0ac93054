//! GGUF model files: a validating reader (header, metadata, tensor table) and tensor data loading.
//!
//! Every count, length and offset in the file is checked against the bytes that actually remain
//! *before* anything is allocated for it, so a hostile or truncated file costs at most memory in
//! proportion to its real size and always ends in a [`GgufError`] naming the problem.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use tpslab_kernels::WType;

const MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
/// ggml's own limit on tensor rank.
const MAX_DIMS: usize = 4;
/// Arrays of arrays are legal GGUF; nothing real nests deeper than this.
const MAX_ARRAY_DEPTH: usize = 4;
/// Never reserve more than this many elements ahead of parsing them.
const MAX_PREALLOC: usize = 1 << 16;

/// Why a GGUF file was refused.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("cannot open model file {path}: {source}")]
    Open {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read model file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is empty (0 bytes): not a GGUF model file")]
    Empty { path: PathBuf },
    #[error("{path} is not a GGUF file (magic bytes {found:02x?}, expected \"GGUF\")")]
    BadMagic { path: PathBuf, found: Vec<u8> },
    #[error("{path}: unsupported GGUF version {version} (supported: 2, 3)")]
    Version { path: PathBuf, version: u32 },
    #[error(
        "{path} is truncated or corrupt: {what} at byte {offset} needs {needed} bytes, only {left} left"
    )]
    Truncated {
        path: PathBuf,
        what: String,
        offset: u64,
        needed: u64,
        left: u64,
    },
    #[error("{path} is corrupt: {what}")]
    Corrupt { path: PathBuf, what: String },
    /// Only from [`GgufFile::from_prefix`]: the header goes on past the bytes given, up to at
    /// least byte `upto` (which the whole file has).
    #[error("{path}: the header goes on past the {have} bytes read (to byte {upto} at least)")]
    Incomplete { path: PathBuf, have: u64, upto: u64 },
    #[error("{path}: tensor '{tensor}' has unsupported type id {type_id}")]
    UnknownTensorType {
        path: PathBuf,
        tensor: String,
        type_id: u32,
    },
    #[error("model file has no tensor named '{0}'")]
    MissingTensor(String),
    #[error("metadata key '{key}' is missing")]
    MissingKey { key: String },
    #[error("metadata key '{key}' has the wrong type: expected {expected}")]
    WrongType { key: String, expected: &'static str },
    /// A Hugging Face folder (config.json, tokenizer.json, safetensors) that could not be mapped
    /// (a `formats::hf::HfError`; boxed as an error so this reader does not name the folder
    /// reader that builds on it).
    #[error(transparent)]
    Hf(Box<dyn std::error::Error + Send + Sync>),
}

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    /// Any integer type that fits in a u64.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// One entry of the tensor table. `dims` are in ggml order: `dims[0]` is the contiguous one.
#[derive(Debug, Clone)]
pub struct TensorInfo {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: WType,
    /// Offset from the start of the data section.
    pub offset: u64,
    /// Size in bytes, already checked to lie inside the file.
    pub size: u64,
    /// Where the bytes are: this GGUF's data section, or a safetensors file.
    pub source: TensorSource,
}

/// Where a tensor's bytes are read from.
#[derive(Debug, Clone, Default, PartialEq)]
pub enum TensorSource {
    /// This GGUF's data section, at `TensorInfo::offset`.
    #[default]
    Gguf,
    /// A safetensors file of a Hugging Face folder ([`crate::formats::hf`]), at absolute byte `start`.
    /// `edit`: what convert_hf_to_gguf would do to the bytes (Llama's Q/K permutation, Gemma's
    /// `norm + 1`, or bytes it computes from the config).
    Safetensors {
        path: std::sync::Arc<Path>,
        start: u64,
        edit: Edit,
    },
    /// Another part of a split GGUF ([`crate::formats::gguf_split`]), whose data section starts at
    /// `data_offset`; the tensor is at `TensorInfo::offset` from there.
    GgufPart {
        path: std::sync::Arc<Path>,
        data_offset: u64,
    },
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A parsed GGUF header: metadata and tensor table. Tensor bytes are read on demand.
///
/// A Hugging Face folder opens as the same view ([`crate::formats::hf`]): metadata under the GGUF keys
/// convert_hf_to_gguf writes, tensors under GGUF names with their bytes in the safetensors files;
/// then `path` is the folder, `data_offset` 0 and `file_len` the size of its files.
#[derive(Debug)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    pub metadata: BTreeMap<String, Value>,
    pub tensors: Vec<TensorInfo>,
    pub data_offset: u64,
    pub file_len: u64,
}

/// A reader that knows how many bytes the file has left, so every length is checked first.
/// `len` bytes can be read; `whole` is the length of the file they begin (more than `len` when
/// only a prefix of it is at hand, [`GgufFile::from_prefix`]).
struct Cursor<'a, R: Read = BufReader<File>> {
    inner: R,
    pos: u64,
    len: u64,
    whole: u64,
    path: &'a Path,
}

impl<R: Read> Cursor<'_, R> {
    /// One tensor table entry, checked: rank, known type, whole blocks, size, alignment.
    fn tensor_entry(&mut self, alignment: u64) -> Result<TensorInfo, GgufError> {
        let name = self.string("tensor name")?;
        let n_dims = self.u32("tensor rank")? as usize;
        if n_dims == 0 || n_dims > MAX_DIMS {
            return Err(self.corrupt(format!("tensor '{name}' has rank {n_dims} (1..=4 allowed)")));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(self.u64("tensor dimension")?);
        }
        let type_id = self.u32("tensor type")?;
        let ty = WType::from_ggml_id(type_id).ok_or_else(|| GgufError::UnknownTensorType {
            path: self.path.to_path_buf(),
            tensor: name.clone(),
            type_id,
        })?;
        let offset = self.u64("tensor offset")?;
        let n_elem = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| self.corrupt(format!("tensor '{name}' dimensions {dims:?} overflow")))?;
        if !dims[0].is_multiple_of(ty.block_size() as u64) {
            return Err(self.corrupt(format!(
                "tensor '{name}': first dimension {} is not a multiple of the {ty} block size {}",
                dims[0],
                (ty.block_size() as u64)
            )));
        }
        let size = (n_elem / (ty.block_size() as u64))
            .checked_mul(ty.type_size() as u64)
            .ok_or_else(|| self.corrupt(format!("tensor '{name}' size overflows")))?;
        if !offset.is_multiple_of(alignment) {
            return Err(self.corrupt(format!("tensor '{name}' offset {offset} is not aligned")));
        }
        Ok(TensorInfo {
            name,
            dims,
            ty,
            offset,
            size,
            source: TensorSource::Gguf,
        })
    }

    fn left(&self) -> u64 {
        self.len.saturating_sub(self.pos)
    }

    fn need(&self, what: &str, n: u64) -> Result<(), GgufError> {
        if n > self.left() && self.len < self.whole && self.pos.saturating_add(n) <= self.whole {
            return Err(GgufError::Incomplete {
                path: self.path.to_path_buf(),
                have: self.len,
                upto: self.pos + n,
            });
        }
        if n > self.left() {
            return Err(GgufError::Truncated {
                path: self.path.to_path_buf(),
                what: what.to_string(),
                offset: self.pos,
                needed: n,
                left: self.left(),
            });
        }
        Ok(())
    }

    fn bytes<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        self.need(what, N as u64)?;
        let mut buf = [0u8; N];
        self.fill(&mut buf)?;
        Ok(buf)
    }

    /// Reads exactly `buf.len()` bytes (already checked with `need`) and advances.
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), GgufError> {
        self.inner.read_exact(buf).map_err(|source| GgufError::Io {
            path: self.path.to_path_buf(),
            source,
        })?;
        self.pos += buf.len() as u64;
        Ok(())
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        self.bytes::<4>(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        self.bytes::<8>(what).map(u64::from_le_bytes)
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let n = self.u64(what)?;
        self.need(what, n)?;
        // `need` bounded n by the real file size, so this allocation is backed by real bytes.
        let mut buf = vec![0u8; usize::try_from(n).map_err(|_| self.corrupt("string length"))?];
        self.fill(&mut buf)?;
        Ok(match String::from_utf8(buf) {
            Ok(s) => s,
            Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
        })
    }

    fn corrupt(&self, what: impl Into<String>) -> GgufError {
        GgufError::Corrupt {
            path: self.path.to_path_buf(),
            what: what.into(),
        }
    }

    /// Smallest number of bytes one value of this type can take: used to bound array counts.
    fn min_size(ty: u32) -> Option<u64> {
        Some(match ty {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 => 8,
            9 => 12,
            10..=12 => 8,
            _ => return None,
        })
    }

    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<Value, GgufError> {
        Ok(match ty {
            0 => Value::U8(self.bytes::<1>(key)?[0]),
            1 => Value::I8(self.bytes::<1>(key)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.bytes::<2>(key)?)),
            3 => Value::I16(i16::from_le_bytes(self.bytes::<2>(key)?)),
            4 => Value::U32(self.u32(key)?),
            5 => Value::I32(i32::from_le_bytes(self.bytes::<4>(key)?)),
            6 => Value::F32(f32::from_le_bytes(self.bytes::<4>(key)?)),
            7 => match self.bytes::<1>(key)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(self.corrupt(format!("metadata '{key}': bool byte {b}"))),
            },
            8 => Value::String(self.string(key)?),
            9 => {
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.corrupt(format!("metadata '{key}': arrays nested too deep")));
                }
                let item_ty = self.u32(key)?;
                let n = self.u64(key)?;
                let min = Self::min_size(item_ty).ok_or_else(|| {
                    self.corrupt(format!(
                        "metadata '{key}': unknown array item type {item_ty}"
                    ))
                })?;
                self.need(
                    &format!("array '{key}' of {n} items"),
                    n.saturating_mul(min),
                )?;
                let n = usize::try_from(n).map_err(|_| self.corrupt("array length"))?;
                let mut items = Vec::with_capacity(n.min(MAX_PREALLOC));
                for _ in 0..n {
                    items.push(self.value(item_ty, key, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(key)?),
            11 => Value::I64(i64::from_le_bytes(self.bytes::<8>(key)?)),
            12 => Value::F64(f64::from_le_bytes(self.bytes::<8>(key)?)),
            _ => return Err(self.corrupt(format!("metadata '{key}': unknown value type {ty}"))),
        })
    }
}

/// `general.alignment`, or the default; a power of two up to 1 MiB.
fn alignment(metadata: &BTreeMap<String, Value>) -> Result<u64, String> {
    match metadata.get("general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some(v) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => Ok(a),
            _ => Err(format!("general.alignment {v:?} is not a power of two")),
        },
    }
}

impl GgufFile {
    /// One GGUF file's header, validated against its own size (a split part on its own).
    pub(crate) fn open_single(path: &Path) -> Result<Self, GgufError> {
        let file = File::open(path).map_err(|source| GgufError::Open {
            path: path.to_path_buf(),
            source,
        })?;
        let len = file
            .metadata()
            .map_err(|source| GgufError::Io {
                path: path.to_path_buf(),
                source,
            })?
            .len();
        if len == 0 {
            return Err(GgufError::Empty {
                path: path.to_path_buf(),
            });
        }
        let mut c = Cursor {
            inner: BufReader::with_capacity(1 << 16, file),
            pos: 0,
            len,
            whole: len,
            path,
        };
        if len < 4 {
            let mut found = Vec::new();
            let _ = c.inner.read_to_end(&mut found);
            return Err(GgufError::BadMagic {
                path: path.to_path_buf(),
                found,
            });
        }
        Self::parse(c)
    }

    /// The header of a file of `file_len` bytes from its first bytes, `prefix` (a ranged
    /// download): the same checks as [`Self::open`] (tensor data must fit in `file_len`), and
    /// [`GgufError::Incomplete`] when the header goes on past the prefix. `name` names the file
    /// in errors. Memory stays within a small multiple of `prefix.len()`.
    pub fn from_prefix(name: &Path, prefix: &[u8], file_len: u64) -> Result<Self, GgufError> {
        if file_len == 0 {
            return Err(GgufError::Empty {
                path: name.to_path_buf(),
            });
        }
        let prefix = &prefix[..prefix
            .len()
            .min(usize::try_from(file_len).unwrap_or(usize::MAX))];
        Self::parse(Cursor {
            inner: prefix,
            pos: 0,
            len: prefix.len() as u64,
            whole: file_len,
            path: name,
        })
    }

    /// The header from its first byte, checked against the file's length (`c.whole`).
    fn parse<R: Read>(mut c: Cursor<'_, R>) -> Result<Self, GgufError> {
        let (path, len) = (c.path, c.whole);
        let magic = c.bytes::<4>("magic")?;
        if magic != MAGIC {
            return Err(GgufError::BadMagic {
                path: path.to_path_buf(),
                found: magic.to_vec(),
            });
        }
        let version = c.u32("version")?;
        if !(2..=3).contains(&version) {
            return Err(GgufError::Version {
                path: path.to_path_buf(),
                version,
            });
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        // Each key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor
        // entry at least 8 (name length) + 4 (rank) + 4 (type) + 8 (offset) bytes.
        c.need(&format!("{n_kv} metadata entries"), n_kv.saturating_mul(13))?;
        c.need(
            &format!("{n_tensors} tensor entries"),
            n_tensors.saturating_mul(24),
        )?;

        let mut metadata = BTreeMap::new();
        for _ in 0..n_kv {
            let key = c.string("metadata key")?;
            let ty = c.u32("metadata type")?;
            let value = c.value(ty, &key, 0)?;
            if metadata.insert(key.clone(), value).is_some() {
                return Err(c.corrupt(format!("metadata key '{key}' appears twice")));
            }
        }

        let alignment = alignment(&metadata).map_err(|e| c.corrupt(e))?;

        let n_tensors_usize = usize::try_from(n_tensors).map_err(|_| c.corrupt("tensor count"))?;
        let mut tensors = Vec::with_capacity(n_tensors_usize.min(MAX_PREALLOC));
        let mut names = std::collections::HashSet::new();
        for _ in 0..n_tensors {
            let t = c.tensor_entry(alignment)?;
            if !names.insert(t.name.clone()) {
                return Err(c.corrupt(format!("tensor '{}' appears twice", t.name)));
            }
            tensors.push(t);
        }

        let data_offset = c.pos.div_ceil(alignment) * alignment;
        let data_len = len.saturating_sub(data_offset);
        for t in &tensors {
            let end = t.offset.checked_add(t.size);
            if end.is_none_or(|end| end > data_len) {
                return Err(GgufError::Truncated {
                    path: path.to_path_buf(),
                    what: format!("tensor '{}' data ({} {:?})", t.name, t.ty, t.dims),
                    offset: data_offset.saturating_add(t.offset),
                    needed: t.size,
                    left: data_len.saturating_sub(t.offset),
                });
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            version,
            metadata,
            tensors,
            data_offset,
            file_len: len,
        })
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// Reads the bytes of one tensor stored in a GGUF file (this one or a split part); see
    /// `GgufFile::read_tensor` for every source.
    pub(crate) fn read_gguf_tensor(&self, info: &TensorInfo) -> Result<Vec<u8>, GgufError> {
        let (path, data_offset) = match &info.source {
            TensorSource::GgufPart { path, data_offset } => (&**path, *data_offset),
            _ => (self.path.as_path(), self.data_offset),
        };
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let mut f = File::open(path).map_err(io)?;
        // Checked again: the file may have changed since `open`.
        let len = f.metadata().map_err(io)?.len();
        let start = data_offset + info.offset;
        if start + info.size > len {
            return Err(GgufError::Truncated {
                path: path.to_path_buf(),
                what: format!("tensor '{}' data", info.name),
                offset: start,
                needed: info.size,
                left: len.saturating_sub(start),
            });
        }
        f.seek(SeekFrom::Start(start)).map_err(io)?;
        let size = usize::try_from(info.size).map_err(|_| GgufError::Corrupt {
            path: path.to_path_buf(),
            what: "tensor too large for this platform".into(),
        })?;
        let mut buf = vec![0u8; size];
        f.read_exact(&mut buf).map_err(io)?;
        Ok(buf)
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })?;
        v.as_u64().ok_or(GgufError::WrongType {
            key: key.into(),
            expected: "unsigned integer",
        })
    }

    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })?;
        v.as_f64().ok_or(GgufError::WrongType {
            key: key.into(),
            expected: "number",
        })
    }

    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })?;
        v.as_str().ok_or(GgufError::WrongType {
            key: key.into(),
            expected: "string",
        })
    }

    /// An array of strings (the tokenizer's vocabulary and merges).
    pub fn get_str_array(&self, key: &str) -> Result<Vec<&str>, GgufError> {
        let v = self
            .get(key)
            .ok_or_else(|| GgufError::MissingKey { key: key.into() })?;
        let wrong = || GgufError::WrongType {
            key: key.into(),
            expected: "array of strings",
        };
        v.as_array()
            .ok_or_else(wrong)?
            .iter()
            .map(|x| x.as_str().ok_or_else(wrong))
            .collect()
    }
}

/// What is done to a tensor's bytes when it is read from a folder, as convert_hf_to_gguf does
/// it when it converts (`formats::hf_map::Change`).
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Edit {
    #[default]
    None,
    /// Llama Q/K rows reordered from Hugging Face's rotary layout into GGUF's (`permute`) for
    /// that many heads.
    Permute(usize),
    /// Gemma's norm weights stored as `1 + w`, in F32 (the type the source holds them in).
    PlusOne(WType),
    /// A tensor the converter computes from `config.json` (Llama 3's `rope_freqs`, Phi-3's
    /// LongRoPE factors): its bytes, computed when the folder was opened.
    Computed(std::sync::Arc<[u8]>),
}

//! GGUF writer: metadata of every value type the reader accepts, and tensors streamed one by one
//! at offsets aligned to `general.alignment`, so a file far larger than memory can be written.
//!
//! The header (metadata and the whole tensor table with offsets) is written first, from the
//! tensors' names, shapes and types alone; then [`GgufWriter::write_tensor`] takes each tensor's
//! bytes in table order, checking its size. What [`crate::formats::gguf::GgufFile::open`] reads back is
//! what was written.

use std::collections::HashSet;
use std::io::Write;

use crate::formats::gguf::Value;
use tpslab_kernels::WType;

/// The alignment when the metadata names none (as the reader assumes).
const DEFAULT_ALIGNMENT: u64 = 32;

#[derive(Debug, thiserror::Error)]
pub enum GgufWriteError {
    #[error(transparent)]
    Io(#[from] std::io::Error),
    #[error("cannot write this GGUF: {0}")]
    Invalid(String),
}

/// A tensor table entry: `dims` in ggml order (`dims[0]` contiguous).
#[derive(Debug, Clone, PartialEq)]
pub struct TensorDesc {
    pub name: String,
    pub dims: Vec<u64>,
    pub ty: WType,
}

impl TensorDesc {
    pub fn new(name: impl Into<String>, dims: Vec<u64>, ty: WType) -> Self {
        Self {
            name: name.into(),
            dims,
            ty,
        }
    }

    /// Bytes of the tensor's data.
    pub fn size(&self) -> u64 {
        self.dims.iter().product::<u64>() / (self.ty.block_size() as u64)
            * (self.ty.type_size() as u64)
    }
}

/// GGUF value type ids.
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// Serializes one value's payload (without its type id).
fn put_value(buf: &mut Vec<u8>, key: &str, v: &Value) -> Result<(), GgufWriteError> {
    match v {
        Value::U8(x) => buf.push(*x),
        Value::I8(x) => buf.extend(x.to_le_bytes()),
        Value::U16(x) => buf.extend(x.to_le_bytes()),
        Value::I16(x) => buf.extend(x.to_le_bytes()),
        Value::U32(x) => buf.extend(x.to_le_bytes()),
        Value::I32(x) => buf.extend(x.to_le_bytes()),
        Value::F32(x) => buf.extend(x.to_le_bytes()),
        Value::Bool(x) => buf.push(u8::from(*x)),
        Value::String(s) => put_str(buf, s),
        Value::U64(x) => buf.extend(x.to_le_bytes()),
        Value::I64(x) => buf.extend(x.to_le_bytes()),
        Value::F64(x) => buf.extend(x.to_le_bytes()),
        Value::Array(items) => {
            // GGUF arrays are homogeneous; an empty one still needs an item type (any will do).
            let item_ty = items.first().map_or(type_id(&Value::U8(0)), type_id);
            if let Some(bad) = items.iter().find(|i| type_id(i) != item_ty) {
                return Err(GgufWriteError::Invalid(format!(
                    "metadata '{key}': array mixes item types ({:?} after {:?})",
                    bad, items[0]
                )));
            }
            buf.extend(item_ty.to_le_bytes());
            buf.extend((items.len() as u64).to_le_bytes());
            for i in items {
                put_value(buf, key, i)?;
            }
        }
    }
    Ok(())
}

fn put_str(buf: &mut Vec<u8>, s: &str) {
    buf.extend((s.len() as u64).to_le_bytes());
    buf.extend(s.as_bytes());
}

/// The alignment `metadata` asks for (validated as the reader does).
fn alignment_of(metadata: &[(String, Value)]) -> Result<u64, GgufWriteError> {
    match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => Ok(DEFAULT_ALIGNMENT),
        Some((_, v)) => match v.as_u64() {
            Some(a) if a > 0 && a.is_power_of_two() && a <= 1 << 20 => Ok(a),
            _ => Err(GgufWriteError::Invalid(format!(
                "general.alignment {v:?} is not a power of two"
            ))),
        },
    }
}

/// Writes a GGUF (version 3) to `W`: the header on [`GgufWriter::new`], then each tensor's data.
#[derive(Debug)]
pub struct GgufWriter<W: Write> {
    out: W,
    tensors: Vec<TensorDesc>,
    alignment: u64,
    /// Index of the next tensor to write.
    next: usize,
    /// Bytes written into the data section so far.
    data_pos: u64,
}

impl<W: Write> GgufWriter<W> {
    /// Validates and writes the header: `metadata` in the order given, then the tensor table
    /// (offsets laid out in the order of `tensors`, each aligned), then padding to the data
    /// section.
    pub fn new(
        mut out: W,
        metadata: &[(String, Value)],
        tensors: Vec<TensorDesc>,
    ) -> Result<Self, GgufWriteError> {
        let alignment = alignment_of(metadata)?;
        let mut buf = Vec::with_capacity(1 << 16);
        buf.extend(b"GGUF");
        buf.extend(3u32.to_le_bytes());
        buf.extend((tensors.len() as u64).to_le_bytes());
        buf.extend((metadata.len() as u64).to_le_bytes());
        let mut keys = HashSet::new();
        for (k, v) in metadata {
            if !keys.insert(k.as_str()) {
                return Err(GgufWriteError::Invalid(format!(
                    "metadata key '{k}' appears twice"
                )));
            }
            put_str(&mut buf, k);
            buf.extend(type_id(v).to_le_bytes());
            put_value(&mut buf, k, v)?;
        }
        let mut names = HashSet::new();
        let mut offset = 0u64;
        for t in &tensors {
            if !names.insert(t.name.as_str()) {
                return Err(GgufWriteError::Invalid(format!(
                    "tensor '{}' appears twice",
                    t.name
                )));
            }
            if t.dims.is_empty() || t.dims.len() > 4 {
                return Err(GgufWriteError::Invalid(format!(
                    "tensor '{}' has rank {} (1..=4 allowed)",
                    t.name,
                    t.dims.len()
                )));
            }
            if !t.dims[0].is_multiple_of(t.ty.block_size() as u64) {
                return Err(GgufWriteError::Invalid(format!(
                    "tensor '{}': first dimension {} is not a multiple of the {} block size {}",
                    t.name,
                    t.dims[0],
                    t.ty,
                    (t.ty.block_size() as u64)
                )));
            }
            put_str(&mut buf, &t.name);
            buf.extend((t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                buf.extend(d.to_le_bytes());
            }
            buf.extend(t.ty.ggml_id().to_le_bytes());
            buf.extend(offset.to_le_bytes());
            offset = (offset + t.size()).next_multiple_of(alignment);
        }
        let header = buf.len() as u64;
        buf.resize(header.next_multiple_of(alignment) as usize, 0);
        out.write_all(&buf)?;
        Ok(Self {
            out,
            tensors,
            alignment,
            next: 0,
            data_pos: 0,
        })
    }

    /// The tensor whose data [`Self::write_tensor`] expects next, if any.
    pub fn next_tensor(&self) -> Option<&TensorDesc> {
        self.tensors.get(self.next)
    }

    /// Writes the next tensor's data (exactly its size) and the padding after it.
    pub fn write_tensor(&mut self, data: &[u8]) -> Result<(), GgufWriteError> {
        let t = self.tensors.get(self.next).ok_or_else(|| {
            GgufWriteError::Invalid("more tensor data than tensors in the table".into())
        })?;
        if data.len() as u64 != t.size() {
            return Err(GgufWriteError::Invalid(format!(
                "tensor '{}' ({} {:?}) needs {} bytes, got {}",
                t.name,
                t.ty,
                t.dims,
                t.size(),
                data.len()
            )));
        }
        self.out.write_all(data)?;
        let end = self.data_pos + data.len() as u64;
        let padded = end.next_multiple_of(self.alignment);
        self.out.write_all(&vec![0u8; (padded - end) as usize])?;
        self.data_pos = padded;
        self.next += 1;
        Ok(())
    }

    /// The underlying writer as it is, written or not (what the header alone takes: a plan's
    /// size estimate).
    pub fn into_inner(self) -> W {
        self.out
    }

    /// Checks every tensor was written, flushes, and hands back the writer.
    pub fn finish(mut self) -> Result<W, GgufWriteError> {
        if let Some(t) = self.tensors.get(self.next) {
            return Err(GgufWriteError::Invalid(format!(
                "tensor '{}' was never written ({} of {} written)",
                t.name,
                self.next,
                self.tensors.len()
            )));
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Writes a whole GGUF held in memory to `out`.
pub fn write_gguf<W: Write>(
    out: W,
    metadata: &[(String, Value)],
    tensors: &[(TensorDesc, Vec<u8>)],
) -> Result<W, GgufWriteError> {
    let descs = tensors.iter().map(|(d, _)| d.clone()).collect();
    let mut w = GgufWriter::new(out, metadata, descs)?;
    for (_, data) in tensors {
        w.write_tensor(data)?;
    }
    w.finish()
}

/// Copies the GGUF at `src` to `dst` with metadata keys set (added or replaced) from `set`, as
/// gguf-py's `gguf_new_metadata` does; tensors are copied one at a time.
pub fn copy_with_metadata(
    src: &std::path::Path,
    dst: &std::path::Path,
    set: &[(String, Value)],
) -> Result<(), GgufWriteError> {
    let file = crate::formats::gguf::GgufFile::open_gguf(src)
        .map_err(|e| GgufWriteError::Invalid(format!("{}: {e}", src.display())))?;
    let mut metadata: Vec<(String, Value)> = file
        .metadata
        .iter()
        .filter(|(k, _)| !set.iter().any(|(s, _)| s == *k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.extend(set.iter().cloned());
    let descs = file
        .tensors
        .iter()
        .map(|t| TensorDesc::new(t.name.clone(), t.dims.clone(), t.ty))
        .collect();
    let out = std::io::BufWriter::new(std::fs::File::create(dst)?);
    let mut w = GgufWriter::new(out, &metadata, descs)?;
    for t in &file.tensors {
        let data = file
            .read_tensor(t)
            .map_err(|e| GgufWriteError::Invalid(format!("{}: {e}", t.name)))?;
        w.write_tensor(&data)?;
    }
    w.finish()?.flush()?;
    Ok(())
}

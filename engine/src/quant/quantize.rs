//! Re-quantizing a GGUF model to a preset (`tpslab quantize`): the plan (each tensor's type by
//! llama.cpp's rules, `preset`), the predicted output size, and the conversion itself, written
//! to `OUT.tmp` and renamed to `OUT` only when whole.
//!
//! Each matrix is dequantized row by row to f32 and quantized again with ggml's reference
//! quantizers ([`tpslab_kernels::quantize`]), on several threads, a tensor at a time: memory
//! holds one tensor's source and output bytes, never an f32 copy of the model.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use tpslab_kernels::WType;

use crate::formats::gguf::{GgufError, GgufFile, TensorInfo, Value};
use crate::formats::gguf_write::{GgufWriteError, GgufWriter, TensorDesc};
use crate::quant::preset::{ModelShape, Preset, tensor_types};

#[derive(Debug, thiserror::Error)]
pub enum QuantizeError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    // The causes are part of the message (not `source`), so a chain prints each once.
    #[error("writing {path}: {err}")]
    Write { path: PathBuf, err: GgufWriteError },
    #[error("{what} {path}: {err}")]
    Io {
        what: &'static str,
        path: PathBuf,
        err: std::io::Error,
    },
    #[error("quantization cancelled; nothing was written to {0}")]
    Cancelled(PathBuf),
}

/// One tensor of the output: its source and the type it is written in.
#[derive(Debug, Clone)]
pub struct TensorPlan {
    pub info: TensorInfo,
    pub to: WType,
}

impl TensorPlan {
    pub fn desc(&self) -> TensorDesc {
        TensorDesc::new(self.info.name.clone(), self.info.dims.clone(), self.to)
    }

    /// Whether the source bytes are copied as they are (same type: no second rounding).
    pub fn copied(&self) -> bool {
        self.info.ty == self.to
    }
}

/// What `quantize` will do: every tensor's target type, the metadata, and the sizes.
#[derive(Debug, Clone)]
pub struct QuantizePlan {
    pub preset: Preset,
    pub tensors: Vec<TensorPlan>,
    pub metadata: Vec<(String, Value)>,
    pub input_bytes: u64,
    /// The exact size of the output file.
    pub output_bytes: u64,
}

impl QuantizePlan {
    /// "Q4_K_M (Q5_0 x 166, Q6_K x 14, ...)": the preset and the type mix.
    pub fn summary(&self) -> String {
        let mut counts: Vec<(WType, usize)> = Vec::new();
        for t in &self.tensors {
            match counts.iter_mut().find(|(ty, _)| *ty == t.to) {
                Some((_, n)) => *n += 1,
                None => counts.push((t.to, 1)),
            }
        }
        let mix: Vec<String> = counts.iter().map(|(ty, n)| format!("{ty} x {n}")).collect();
        format!("{} ({})", self.preset, mix.join(", "))
    }
}

/// Plans quantizing `f` to `preset` (a [`WType`] converts to the preset of its `_M` mix): the
/// metadata is kept (tokenizer, chat template and all) with `general.file_type` and
/// `general.quantization_version` set.
pub fn plan(f: &GgufFile, preset: impl Into<Preset>) -> Result<QuantizePlan, QuantizeError> {
    let preset = preset.into();
    let tensors: Vec<TensorPlan> = f
        .tensors
        .iter()
        .zip(tensor_types(&f.tensors, preset, ModelShape::of_file(f)))
        .map(|(t, to)| TensorPlan {
            info: t.clone(),
            to,
        })
        .collect();
    // general.architecture first, as llama.cpp writes it; the rest in the reader's order.
    let mut metadata: Vec<(String, Value)> = f
        .metadata
        .iter()
        .filter(|(k, _)| *k != "general.file_type" && *k != "general.quantization_version")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort_by_key(|(k, _)| k != "general.architecture");
    metadata.push(("general.file_type".into(), Value::U32(preset.file_type())));
    metadata.push(("general.quantization_version".into(), Value::U32(2)));
    // The header's exact size: write it to memory (metadata is small next to the weights).
    let descs: Vec<TensorDesc> = tensors.iter().map(TensorPlan::desc).collect();
    let header = GgufWriter::new(Vec::new(), &metadata, descs.clone())
        .map_err(|err| QuantizeError::Write {
            path: PathBuf::from("(plan)"),
            err,
        })?
        .into_inner()
        .len() as u64;
    let alignment = f
        .get("general.alignment")
        .and_then(Value::as_u64)
        .unwrap_or(32);
    let data: u64 = descs
        .iter()
        .map(|d| d.size().next_multiple_of(alignment))
        .sum();
    Ok(QuantizePlan {
        preset,
        tensors,
        metadata,
        input_bytes: f.file_len,
        output_bytes: header + data,
    })
}

/// Where the conversion is.
#[derive(Debug, Clone)]
pub struct Progress<'a> {
    /// Tensors finished.
    pub done: usize,
    pub total: usize,
    /// Output bytes finished, of `total_bytes`.
    pub bytes_done: u64,
    pub total_bytes: u64,
    /// The tensor just finished.
    pub name: &'a str,
}

/// How to run a conversion.
#[derive(Debug, Default, Clone, Copy)]
pub struct QuantizeOptions<'a> {
    /// Threads (0 = one per core).
    pub threads: usize,
    /// Set from another thread to stop between tensors; nothing is left at the output path.
    pub cancel: Option<&'a AtomicBool>,
}

/// What a finished conversion did.
#[derive(Debug, Clone)]
pub struct QuantizeReport {
    pub output_bytes: u64,
    pub seconds: f64,
    /// Tensors dequantized and quantized again (the rest were copied).
    pub converted: usize,
}

/// The temporary name `output` is written under until it is whole.
pub fn temp_path(output: &Path) -> PathBuf {
    let mut name = output.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    output.with_file_name(name)
}

/// Quantizes the model `input` (opened as `f`) per `plan` into `output`. The file is written as
/// `output` + `.tmp` and renamed only when complete and synced, so a failure, a cancel or a
/// killed process never leaves a partial file at `output`; on an error the temporary file is
/// removed.
pub fn quantize_file(
    f: &GgufFile,
    plan: &QuantizePlan,
    output: &Path,
    opts: QuantizeOptions<'_>,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<QuantizeReport, QuantizeError> {
    let tmp = temp_path(output);
    let result = write_tmp(f, plan, &tmp, output, opts, progress);
    match result {
        Ok(report) => {
            std::fs::rename(&tmp, output).map_err(|err| {
                let _ = std::fs::remove_file(&tmp);
                QuantizeError::Io {
                    what: "cannot rename the finished file to",
                    path: output.to_path_buf(),
                    err,
                }
            })?;
            Ok(report)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

fn write_tmp(
    f: &GgufFile,
    plan: &QuantizePlan,
    tmp: &Path,
    output: &Path,
    opts: QuantizeOptions<'_>,
    progress: &mut dyn FnMut(&Progress<'_>),
) -> Result<QuantizeReport, QuantizeError> {
    let start = Instant::now();
    let threads = match opts.threads {
        0 => std::thread::available_parallelism().map_or(1, |p| p.get()),
        n => n,
    };
    let write_err = |err| QuantizeError::Write {
        path: tmp.to_path_buf(),
        err,
    };
    let file = File::create(tmp).map_err(|err| QuantizeError::Io {
        what: "cannot create",
        path: tmp.to_path_buf(),
        err,
    })?;
    let descs = plan.tensors.iter().map(TensorPlan::desc).collect();
    let mut w = GgufWriter::new(
        BufWriter::with_capacity(1 << 20, file),
        &plan.metadata,
        descs,
    )
    .map_err(write_err)?;
    let total_bytes: u64 = plan.tensors.iter().map(|t| t.desc().size()).sum();
    let (mut bytes_done, mut converted) = (0u64, 0usize);
    for (i, t) in plan.tensors.iter().enumerate() {
        if opts.cancel.is_some_and(|c| c.load(Ordering::Relaxed)) {
            return Err(QuantizeError::Cancelled(output.to_path_buf()));
        }
        let src = f.read_tensor(&t.info)?;
        let data = if t.copied() {
            src
        } else {
            converted += 1;
            convert(t.info.ty, t.to, &src, t.info.dims[0] as usize, threads)
        };
        w.write_tensor(&data).map_err(write_err)?;
        bytes_done += data.len() as u64;
        progress(&Progress {
            done: i + 1,
            total: plan.tensors.len(),
            bytes_done,
            total_bytes,
            name: &t.info.name,
        });
    }
    let file = w
        .finish()
        .map_err(write_err)?
        .into_inner()
        .map_err(|e| write_err(GgufWriteError::Io(e.into_error())))?;
    file.sync_all().map_err(|err| QuantizeError::Io {
        what: "cannot sync",
        path: tmp.to_path_buf(),
        err,
    })?;
    let output_bytes = file
        .metadata()
        .map(|m| m.len())
        .unwrap_or(plan.output_bytes);
    Ok(QuantizeReport {
        output_bytes,
        seconds: start.elapsed().as_secs_f64(),
        converted,
    })
}

/// Converts rows of `k` elements from `from` to `to` bytes, the rows split over `threads`.
pub fn convert(from: WType, to: WType, src: &[u8], k: usize, threads: usize) -> Vec<u8> {
    let (src_rb, dst_rb) = (from.row_bytes(k), to.row_bytes(k));
    let rows = src.len() / src_rb;
    let mut out = vec![0u8; rows * dst_rb];
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        for (o, i) in out.chunks_mut(per * dst_rb).zip(src.chunks(per * src_rb)) {
            s.spawn(move || {
                let mut row = vec![0f32; k];
                for (o, i) in o.chunks_exact_mut(dst_rb).zip(i.chunks_exact(src_rb)) {
                    tpslab_kernels::dequantize_row(from, i, &mut row);
                    tpslab_kernels::quantize_row(to, &row, o);
                }
            });
        }
    });
    out
}

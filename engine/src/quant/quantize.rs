//! Re-quantizing a GGUF model to another weight type (`tpslab quantize`): which type each tensor
//! gets (llama.cpp's rules), the predicted output size, and the conversion itself, written to
//! `OUT.tmp` and renamed to `OUT` only when whole.
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

use crate::formats::gguf::{GgmlType, GgufError, GgufFile, TensorInfo, Value};
use crate::formats::gguf_write::{GgufWriteError, GgufWriter, TensorDesc};
use crate::model::synthetic::matrix_type;
use crate::model::weights::kernel_type;

/// The targets `tpslab quantize --type` accepts, with a note on each.
pub const TARGETS: [(WType, &str); 9] = [
    (WType::F32, "32-bit float: exact, 4 bytes per weight"),
    (
        WType::F16,
        "16-bit float: practically lossless, 2 bytes per weight",
    ),
    (
        WType::BF16,
        "bfloat16: float range, fewer mantissa bits than F16",
    ),
    (
        WType::Q8_0,
        "8-bit, 32-weight blocks: near-lossless, 8.5 bits per weight",
    ),
    (
        WType::Q6K,
        "6-bit K-quant: very close to F16, 6.56 bits per weight",
    ),
    (
        WType::Q5K,
        "5-bit K-quant (Q5_K_M mix: Q6_K for some attn_v / ffn_down): 5.5 bits per weight",
    ),
    (
        WType::Q4K,
        "4-bit K-quant with 6-bit sub-block scales: 4.5 bits per weight",
    ),
    (
        WType::Q4_1,
        "4-bit with scale and min per 32 weights: 5 bits per weight",
    ),
    (
        WType::Q4_0,
        "4-bit with one scale per 32 weights: 4.5 bits, the lowest quality",
    ),
];

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
    #[error("tensor '{name}' is {ty}, which this engine cannot dequantize")]
    Unsupported { name: String, ty: GgmlType },
    #[error("quantization cancelled; nothing was written to {0}")]
    Cancelled(PathBuf),
}

/// The ggml type of a kernel weight type.
pub fn ggml_type(ty: WType) -> GgmlType {
    match ty {
        WType::F32 => GgmlType::F32,
        WType::F16 => GgmlType::F16,
        WType::BF16 => GgmlType::BF16,
        WType::Q4_0 => GgmlType::Q4_0,
        WType::Q4_1 => GgmlType::Q4_1,
        WType::Q8_0 => GgmlType::Q8_0,
        WType::Q4K => GgmlType::Q4K,
        WType::Q5K => GgmlType::Q5K,
        WType::Q6K => GgmlType::Q6K,
    }
}

/// llama.cpp's `general.file_type` (`llama_ftype`) for a model quantized to `target`. Our Q4_K
/// keeps every matrix at Q4_K (no Q6_K for some attn_v / ffn_down), close to llama.cpp's Q4_K_S
/// (which also gives its first attn_v and ffn_down Q5_K); our Q5_K is llama.cpp's Q5_K_M mix.
pub fn file_type(target: WType) -> u32 {
    match target {
        WType::F32 => 0,
        WType::F16 => 1,
        WType::Q4_0 => 2,
        WType::Q4_1 => 3,
        WType::Q8_0 => 7,
        WType::Q4K => 14,
        WType::Q5K => 17,
        WType::Q6K => 18,
        WType::BF16 => 32,
    }
}

/// The type tensor `t` gets in a model quantized to `target`, as llama.cpp's quantizer chooses
/// it without an importance matrix:
/// - vectors (norms, biases) and anything not named `*.weight` stay or become F32;
/// - float targets apply to every matrix;
/// - the output projection (`output.weight`, or `token_embd.weight` when the two are tied) gets
///   Q6_K, or Q8_0 when its rows are not whole 256-element blocks or the target is Q8_0;
/// - for Q5_K (llama.cpp's Q5_K_M), `attn_v` and `ffn_down` matrices at positions where
///   llama.cpp's `use_more_bits` holds (`more_bits`, see [`tensor_types`]) get Q6_K;
/// - other matrices get the target, with K-quants falling back for rows that are not whole
///   256-element blocks ([`matrix_type`]); rows not whole blocks of any type stay F16.
pub fn tensor_type(t: &TensorInfo, target: WType, has_output: bool, more_bits: bool) -> WType {
    let matrix = t.dims.iter().filter(|&&d| d > 1).count() >= 2 && t.name.ends_with(".weight");
    if !matrix {
        return WType::F32;
    }
    let k = t.dims[0] as usize;
    let is_output = t.name == "output.weight" || (!has_output && t.name == "token_embd.weight");
    let ty = match target {
        WType::F32 | WType::F16 | WType::BF16 => target,
        _ if is_output => {
            if k.is_multiple_of(256) && target != WType::Q8_0 {
                WType::Q6K
            } else {
                WType::Q8_0
            }
        }
        WType::Q5K if more_bits => matrix_type(WType::Q6K, k),
        _ => matrix_type(target, k),
    };
    if k.is_multiple_of(ty.block_size()) {
        ty
    } else {
        WType::F16
    }
}

/// llama.cpp's `use_more_bits`: the first and last eighth of the layers and every third one
/// between get more bits in the `_M` mixes.
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2
}

/// The layer number of a `blk.N.*` tensor name (-1 for others, as llama.cpp's `sscanf`).
fn layer_of(name: &str) -> i64 {
    name.strip_prefix("blk.")
        .and_then(|r| r.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(-1)
}

/// Each tensor's position among those `pick` selects, in llama.cpp's processing order (by layer
/// number, then name: its loader's `weight_name_comparer`), and how many it selects.
fn ranks(
    tensors: &[TensorInfo],
    pick: impl Fn(&TensorInfo) -> bool,
) -> (Vec<Option<usize>>, usize) {
    let mut picked: Vec<usize> = (0..tensors.len()).filter(|&i| pick(&tensors[i])).collect();
    picked.sort_by(|&a, &b| {
        let (ta, tb) = (&tensors[a], &tensors[b]);
        (layer_of(&ta.name), &ta.name).cmp(&(layer_of(&tb.name), &tb.name))
    });
    let mut rank = vec![None; tensors.len()];
    for (r, &i) in picked.iter().enumerate() {
        rank[i] = Some(r);
    }
    (rank, picked.len())
}

/// The type of each of `tensors` in a model quantized to `target` ([`tensor_type`]):
/// `attn_v` and `ffn_down` matrices are numbered among their kind in the order llama.cpp's
/// quantizer visits them, to pick those that get more bits.
pub fn tensor_types(tensors: &[TensorInfo], target: WType) -> Vec<WType> {
    let has_output = tensors.iter().any(|t| t.name == "output.weight");
    let matrix = |t: &TensorInfo| t.dims.iter().filter(|&&d| d > 1).count() >= 2;
    let (v_rank, n_v) = ranks(tensors, |t| matrix(t) && t.name.contains("attn_v.weight"));
    let (down_rank, n_down) = ranks(tensors, |t| {
        matrix(t) && t.name.contains("ffn_down") && t.name.ends_with(".weight")
    });
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let more_bits = match (v_rank[i], down_rank[i]) {
                (Some(r), _) => use_more_bits(r, n_v),
                (None, Some(r)) => use_more_bits(r, n_down),
                (None, None) => false,
            };
            tensor_type(t, target, has_output, more_bits)
        })
        .collect()
}

/// One tensor of the output: its source and the type it is written in.
#[derive(Debug, Clone)]
pub struct TensorPlan {
    pub info: TensorInfo,
    pub to: WType,
}

impl TensorPlan {
    pub fn desc(&self) -> TensorDesc {
        TensorDesc::new(
            self.info.name.clone(),
            self.info.dims.clone(),
            ggml_type(self.to),
        )
    }

    /// Whether the source bytes are copied as they are (same type: no second rounding).
    pub fn copied(&self) -> bool {
        self.info.ty == ggml_type(self.to)
    }
}

/// What `quantize` will do: every tensor's target type, the metadata, and the sizes.
#[derive(Debug, Clone)]
pub struct QuantizePlan {
    pub target: WType,
    pub tensors: Vec<TensorPlan>,
    pub metadata: Vec<(String, Value)>,
    pub input_bytes: u64,
    /// The exact size of the output file.
    pub output_bytes: u64,
}

impl QuantizePlan {
    /// "Q4_K (Q4_1 x 180, Q4_K x 30, Q8_0 x 1, F32 x 61)": the target and the type mix.
    pub fn summary(&self) -> String {
        let mut counts: Vec<(WType, usize)> = Vec::new();
        for t in &self.tensors {
            match counts.iter_mut().find(|(ty, _)| *ty == t.to) {
                Some((_, n)) => *n += 1,
                None => counts.push((t.to, 1)),
            }
        }
        let mix: Vec<String> = counts.iter().map(|(ty, n)| format!("{ty} x {n}")).collect();
        format!("{} ({})", self.target, mix.join(", "))
    }
}

/// Plans quantizing `f` to `target`: the metadata is kept (tokenizer, chat template and all)
/// with `general.file_type` and `general.quantization_version` set.
pub fn plan(f: &GgufFile, target: WType) -> Result<QuantizePlan, QuantizeError> {
    let tensors: Vec<TensorPlan> = f
        .tensors
        .iter()
        .zip(tensor_types(&f.tensors, target))
        .map(|(t, to)| TensorPlan {
            info: t.clone(),
            to,
        })
        .collect();
    for t in &tensors {
        if !t.copied() && kernel_type(t.info.ty).is_none() {
            return Err(QuantizeError::Unsupported {
                name: t.info.name.clone(),
                ty: t.info.ty,
            });
        }
    }
    // general.architecture first, as llama.cpp writes it; the rest in the reader's order.
    let mut metadata: Vec<(String, Value)> = f
        .metadata
        .iter()
        .filter(|(k, _)| *k != "general.file_type" && *k != "general.quantization_version")
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    metadata.sort_by_key(|(k, _)| k != "general.architecture");
    metadata.push(("general.file_type".into(), Value::U32(file_type(target))));
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
        target,
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
            let from = kernel_type(t.info.ty).ok_or_else(|| QuantizeError::Unsupported {
                name: t.info.name.clone(),
                ty: t.info.ty,
            })?;
            convert(from, t.to, &src, t.info.dims[0] as usize, threads)
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

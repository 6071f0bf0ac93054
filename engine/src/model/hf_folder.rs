//! A Hugging Face model folder opened as the [`GgufFile`] view a GGUF gives, mapped by the
//! family of its `config.json` (`model::arch`: each family's `hf_*` answers) as llama.cpp's
//! `convert_hf_to_gguf.py` maps it: metadata under the GGUF keys, tensors under GGUF names,
//! the converter's edits applied when read. And [`GgufFile::open`], the one open for every
//! format: it lives here, above the formats, because a folder needs the families to be read.

use std::path::Path;
use std::sync::Arc;

use serde_json::Value as Json;

use tpslab_kernels::WType;

use crate::formats::gguf::{Edit, GgufError, GgufFile, TensorInfo, TensorSource, Value};
use crate::formats::hf::{
    CONFIG, HfConfig, HfError, MAX_VOCAB, TOKENIZER, TOKENIZER_CONFIG, config_object, gguf_order,
    read_json, required, shard_files,
};
use crate::formats::hf_map::{self, Change, Md, Rope, Shape};
use crate::formats::safetensors::SafetensorsFile;
use crate::formats::{gguf_split, hf_tokenizer};
use crate::model::arch::family::{FamilyDef, HfClass, HfInput};
use crate::model::arch::{UnknownClass, hf_class_of, hf_names};

impl GgufFile {
    /// Parses and validates the header of `path`. Tensor data is not read. A folder is opened
    /// as a Hugging Face model ([`open_folder`]); the first part of a split model
    /// (`NAME-00001-of-0000N.gguf`) opens every part ([`gguf_split::join`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        if path.is_dir() {
            return open_folder(path).map_err(|e| GgufError::Hf(Box::new(e)));
        }
        gguf_split::join(Self::open_single(path)?)
    }
}

/// The GGUF architecture of a `config.json`'s `architectures[0]` (else its `model_type`), or
/// the name found when the engine does not run it (the library's import check asks this too).
pub fn gguf_arch_of(
    model_type: Option<&str>,
    architectures: &[String],
) -> Result<&'static str, UnknownClass> {
    hf_class_of(model_type, architectures).map(|(_, c)| c.gguf_arch)
}

/// Opens the Hugging Face model in `dir` as a [`GgufFile`] view.
pub fn open_folder(dir: &Path) -> Result<GgufFile, HfError> {
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
    let (family, class) =
        hf_class_of(cfg.model_type.as_deref(), &cfg.architectures).map_err(|found| {
            HfError::Arch {
                path: config_path.clone(),
                found: found.0,
                supported: hf_names(),
            }
        })?;
    let def = family.def();
    def.hf_defaults(class, &mut cfg, &mut j);
    if cfg.vocab_size == 0 || cfg.vocab_size > MAX_VOCAB {
        return Err(bad(format!(
            "vocab_size {} is out of range",
            cfg.vocab_size
        )));
    }
    let shape = hf_map::shape(&cfg, def.hf_shape_defaults(class)).map_err(bad)?;
    let rope = Rope::of(&j).map_err(bad)?;
    let input = HfInput {
        cfg: &cfg,
        j: &j,
        rope: &rope,
        shape: &shape,
    };
    let arch = class.gguf_arch;
    let mut md = Md::new(arch);
    def.hf_metadata(class, &mut md, &input).map_err(bad)?;
    let mut metadata = md.map;
    let name = dir
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().into_owned());
    metadata.insert("general.architecture".into(), Value::String(arch.into()));
    metadata.insert("general.name".into(), Value::String(name));
    metadata.extend(hf_tokenizer::metadata(dir, &cfg)?);

    let tokenizer_json = || read_json(&tokenizer_path).map_err(|e| e.to_string());
    let vocab_rows = def.hf_vocab_rows(class, &tokenizer_json).map_err(bad)?;
    let layout = Layout {
        def,
        class,
        shape: &shape,
        layers: cfg.num_hidden_layers,
        vocab_rows,
    };
    let (mut tensors, file_len) = tensors(dir, &layout)?;
    let computed = def.hf_computed(class, &input).map_err(bad)?;
    tensors.extend(computed_entries(computed, &config_path));
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

/// Tensors the converter computes from the config, as entries whose bytes are held in memory
/// (`Edit::Computed`), sourced to `config.json`.
fn computed_entries(
    computed: Vec<(String, Vec<f32>)>,
    config_path: &Path,
) -> impl Iterator<Item = TensorInfo> {
    let source: Arc<Path> = Arc::from(config_path);
    computed.into_iter().map(move |(name, values)| {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        TensorInfo {
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
        }
    })
}

/// What the tensors of a folder are checked against and changed by.
struct Layout<'a> {
    def: &'static dyn FamilyDef,
    class: &'static HfClass,
    shape: &'a Shape,
    layers: u64,
    /// Gemma 3: embedding rows past the tokenizer's vocabulary are dropped.
    vocab_rows: Option<u64>,
}

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
    let edit = match layout.def.hf_change(layout.class, &name, layout.shape) {
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
            let name = match layout.def.hf_tensor_name(layout.class, &t.name) {
                Some(Some(n)) => n,
                Some(None) => continue,
                None => {
                    return Err(bad(format!(
                        "no {} weight has this name (cannot map it to GGUF)",
                        layout.class.gguf_arch
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

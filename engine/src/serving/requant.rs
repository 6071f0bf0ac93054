//! Precision as a live knob: the loaded model's weight matrices re-quantized in memory to another
//! type (no file written) while the engine keeps serving on the old ones.
//!
//! The source is the model file's own tensors when there is a file, so a step up in precision
//! starts from the file, not from a lossy copy, and asking for the file's own type gives back
//! the file's weights exactly (Q4_1 -> Q8_0 -> Q4_1 ends where it began); a synthetic model, or
//! one whose file is gone, converts the weights it has. Every matrix, the
//! embedding and the output projection take the target type, except where the target's block
//! does not divide a row ([`matrix_type`]). Norm vectors and biases stay f32.

use std::time::Instant;

use tpslab_kernels::WType;

use crate::model::LoadedModel;
use crate::model::Model;
use crate::model::precision::Precision;
use crate::model::weights::{Linear, Weights};
use crate::quant::quantize::convert;

/// The weight types the live knob offers, most bits per weight first: every type the CPU kernels
/// quantize and run (on CUDA, a type its kernels lack is refused by the backend and the
/// precision stays as it was).
pub const LIVE_TYPES: [WType; 15] = [
    WType::F32,
    WType::F16,
    WType::BF16,
    WType::Q8_0,
    WType::Q6K,
    WType::Q5_1,
    WType::Q5K,
    WType::Q5_0,
    WType::Q4_1,
    WType::Q4K,
    WType::IQ4NL,
    WType::Q4_0,
    WType::IQ4XS,
    WType::Q3K,
    WType::Q2K,
];

/// The type a matrix with rows of `k` elements gets when the target is `target`: the fallbacks
/// of the file quantizer and the synthetic models ([`crate::model::synthetic::matrix_type`]: a K-quant
/// whose block does not divide the row falls back), then F16 where even that block does not.
pub fn matrix_type(target: WType, k: usize) -> WType {
    let t = crate::model::synthetic::matrix_type(target, k);
    if k.is_multiple_of(t.block_size()) {
        t
    } else {
        WType::F16
    }
}

/// What [`requantize`] did.
#[derive(Debug, Clone)]
pub struct RequantReport {
    pub from: Precision,
    pub to: Precision,
    pub weights_bytes_before: usize,
    pub weights_bytes_after: usize,
    /// Whether the source was the model file (else the weights in memory).
    pub from_file: bool,
    pub seconds: f64,
}

/// Why a model could not be re-quantized (the loaded one stays as it is).
#[derive(Debug, thiserror::Error)]
pub enum RequantError {
    #[error("re-reading {path} for its weights: {source}")]
    Reread {
        path: std::path::PathBuf,
        source: Box<crate::model::ModelError>,
    },
    #[error("{0} no longer holds the loaded model (it changed on disk)")]
    Changed(std::path::PathBuf),
}

/// A copy of `lm` whose weights are `target` (tokenizer and template shared by clone), built on
/// `threads` threads. Errors (the file changed or vanished since it was loaded) leave `lm` as it is.
pub fn requantize(
    lm: &LoadedModel,
    target: WType,
    threads: usize,
) -> Result<(LoadedModel, RequantReport), RequantError> {
    let t0 = Instant::now();
    let threads = threads.max(1);
    let before = lm.model.weights.bytes();
    let from_file = !lm.is_synthetic() && lm.path.exists();
    // The file's own precision comes back as the file has it (mixed types and all).
    let mut label = None;
    let weights = if from_file {
        let (file_model, file) = Model::load(&lm.path).map_err(|e| RequantError::Reread {
            path: lm.path.clone(),
            source: Box::new(e),
        })?;
        if file_model.cfg != lm.model.cfg {
            return Err(RequantError::Changed(lm.path.clone()));
        }
        label = Precision::of_file(&file).filter(|p| p.main == target);
        if label.is_some() {
            file_model.weights
        } else {
            convert_weights(&file_model.weights, target, threads)
        }
    } else {
        convert_weights(&lm.model.weights, target, threads)
    };
    let model = Model {
        cfg: lm.model.cfg.clone(),
        weights,
    };
    let after = model.weights.bytes();
    let to = label.unwrap_or_else(|| Precision::built(&lm.model.cfg, target));
    let out = LoadedModel {
        path: lm.path.clone(),
        model,
        tokenizer: lm.tokenizer.clone(),
        template: lm.template.clone(),
        precision: to,
    };
    crate::model::loaded::release_free_memory();
    Ok((
        out,
        RequantReport {
            from: lm.precision,
            to,
            weights_bytes_before: before,
            weights_bytes_after: after,
            from_file,
            seconds: t0.elapsed().as_secs_f64(),
        },
    ))
}

fn convert_linear(l: &Linear, target: WType, threads: usize) -> Linear {
    let to = matrix_type(target, l.k);
    let one = |p: &Linear| {
        if to == p.ty {
            p.ggml_bytes().into_owned()
        } else {
            convert(p.ty, to, &p.ggml_bytes(), p.k, threads)
        }
    };
    // A matrix stacked from several types becomes one block of `to` rows.
    let data = if l.parts.is_empty() {
        one(l)
    } else {
        l.parts.iter().flat_map(one).collect()
    };
    Linear {
        bias: l.bias.clone(),
        ..Linear::new(to, l.n, l.k, data)
    }
}

fn convert_weights(w: &Weights, target: WType, threads: usize) -> Weights {
    let converted = w.try_map(
        |l| Ok::<_, std::convert::Infallible>(convert_linear(l, target, threads)),
        |v| Ok(v.clone()),
    );
    match converted {
        Ok(w) => w.into_arena(),
        Err(never) => match never {},
    }
}

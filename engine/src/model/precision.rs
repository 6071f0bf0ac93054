//! A loaded model's weight precision ([`Precision`]): the type of its matrices and the type some
//! fell back to, compared as types and written as the label users see ("Q4_1", "Q4_K+Q4_1").

use std::fmt;
use std::str::FromStr;

use serde::Serializer;
use tpslab_kernels::{UnknownWType, WType};

use crate::formats::gguf::GgufFile;
use crate::model::config::ModelConfig;

/// The weight precision of a model: what the engine serves at, what the live knob changes and
/// what every figure is labelled with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Precision {
    /// The type asked for (a synthetic model, a re-quantization), or the type holding most
    /// matrix bytes of a file.
    pub main: WType,
    /// The type of the matrices whose rows `main`'s block does not divide (a K-quant on
    /// SmolLM2's 576-element rows falls back: Q4_K -> Q4_1), when there are such matrices.
    pub fallback: Option<WType>,
}

impl From<WType> for Precision {
    fn from(main: WType) -> Self {
        Self {
            main,
            fallback: None,
        }
    }
}

impl Precision {
    /// The precision of a model of shape `cfg` built with every matrix in `target`: the
    /// fallback ([`matrix_type`]) of its hidden or FFN rows, if any.
    pub fn built(cfg: &ModelConfig, target: WType) -> Self {
        let fallback = [cfg.hidden, cfg.ffn]
            .iter()
            .map(|&k| matrix_type(target, k))
            .find(|&t| t != target);
        Self {
            main: target,
            fallback,
        }
    }

    /// The precision of a GGUF file: its dominant type ([`dominant_type`]) when the kernels run
    /// it. The file's own mix (a Q4_K_M file's Q6_K tensors) is not part of the label.
    pub fn of_file(file: &GgufFile) -> Option<Self> {
        dominant_type(file).map(Self::from)
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fallback {
            Some(t) => f.pad(&format!("{}+{t}", self.main)),
            None => f.pad(self.main.name()),
        }
    }
}

// Serialized as its label ("Q4_K+Q4_1"), as reports and the server have always written it;
// read back from it (saved sweeps and tables).
serde_as_label!(Precision);

/// Its label ("Q4_1", "Q4_K+Q4_1") read back.
impl FromStr for Precision {
    type Err = UnknownWType;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (main, fallback) = match s.split_once('+') {
            Some((m, f)) => (m, Some(f.parse()?)),
            None => (s, None),
        };
        Ok(Self {
            main: main.parse()?,
            fallback,
        })
    }
}

/// The type holding most matrix (2-D and up) bytes of `file`: what a user calls its precision.
/// `None` for a file without matrices.
pub fn dominant_type(file: &GgufFile) -> Option<WType> {
    let mut by_type: Vec<(WType, u64)> = Vec::new();
    for t in file.tensors.iter().filter(|t| t.dims.len() >= 2) {
        match by_type.iter_mut().find(|(ty, _)| *ty == t.ty) {
            Some((_, n)) => *n += t.size,
            None => by_type.push((t.ty, t.size)),
        }
    }
    by_type.iter().max_by_key(|(_, n)| *n).map(|&(ty, _)| ty)
}

/// The type a matrix with `k` inputs gets in a synthetic model. K-quants need rows in whole
/// 256-element blocks; rows that aren't fall back to a 32-element type: Q6_K -> Q8_0 (as
/// llama.cpp), Q4_K -> Q4_1 (llama.cpp picks Q5_0, which the CUDA kernels lack; Q4_1 is the
/// nearest in bytes), Q5_K -> Q8_0 (llama.cpp picks Q5_1, which the CUDA kernels lack too),
/// and as llama.cpp Q2_K / Q3_K -> Q4_0 and IQ4_XS -> IQ4_NL. SmolLM2's hidden 576 and
/// Qwen2.5's 896 are such rows. (Re-quantized files follow llama.cpp exactly:
/// `quant::preset`.)
pub fn matrix_type(precision: WType, k: usize) -> WType {
    if k.is_multiple_of(256) {
        return precision;
    }
    match precision {
        WType::Q4K => WType::Q4_1,
        WType::Q5K | WType::Q6K => WType::Q8_0,
        WType::Q2K | WType::Q3K => WType::Q4_0,
        WType::IQ4XS => WType::IQ4NL,
        t => t,
    }
}

/// Serializes an optional weight type as its name (`null` when absent), for serde's
/// `serialize_with` (the kernels' [`WType`] has no serde of its own).
pub fn serialize_type<S: Serializer>(ty: &Option<WType>, s: S) -> Result<S::Ok, S::Error> {
    match ty {
        Some(t) => s.collect_str(t),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(hidden: usize, ffn: usize) -> ModelConfig {
        let spec = crate::model::synthetic::arch("smollm2-135m").expect("arch");
        ModelConfig {
            hidden,
            ffn,
            ..spec.config
        }
    }

    #[test]
    fn labels_read_as_they_always_have() {
        assert_eq!(Precision::from(WType::Q4_1).to_string(), "Q4_1");
        let smol = cfg(576, 1536);
        assert_eq!(Precision::built(&smol, WType::Q4K).to_string(), "Q4_K+Q4_1");
        assert_eq!(Precision::built(&smol, WType::Q6K).to_string(), "Q6_K+Q8_0");
        assert_eq!(Precision::built(&smol, WType::F16).to_string(), "F16");
        // Rows of whole 256-element blocks: no fallback.
        let llama = cfg(4096, 14336);
        assert_eq!(Precision::built(&llama, WType::Q4K), WType::Q4K.into());
        assert_eq!(
            format!("[{:<10}]", Precision::built(&smol, WType::Q4K)),
            "[Q4_K+Q4_1 ]"
        );
    }

    #[test]
    fn serialized_as_the_label() {
        let p = Precision::built(&cfg(576, 1536), WType::Q4K);
        assert_eq!(
            serde_json::to_string(&p).ok().as_deref(),
            Some("\"Q4_K+Q4_1\"")
        );
        #[derive(serde::Serialize)]
        struct S {
            #[serde(serialize_with = "serialize_type")]
            t: Option<WType>,
        }
        let json = |t| serde_json::to_string(&S { t }).ok();
        assert_eq!(json(Some(WType::Q8_0)).as_deref(), Some(r#"{"t":"Q8_0"}"#));
        assert_eq!(json(None).as_deref(), Some(r#"{"t":null}"#));
    }
}

//! What a GGUF file will need to run, read from its header alone (before a download): its
//! architecture and whether this build runs it, its quant type, parameters, weight bytes, and
//! the KV cache at a chosen context and batch, sized by the KV pool's own rule
//! ([`KvTypes::budget_for_tokens`]) so the figure is the one the engine will allocate.

use crate::formats::gguf::GgufFile;
use crate::kv::KvTypes;
use crate::model::config::ModelConfig;
use crate::model::precision::dominant_type;

/// The KV block size the engine serves with (its default), for the KV figure.
pub const KV_BLOCK: usize = 16;

/// A GGUF file's needs, from its header.
#[derive(Debug, Clone)]
pub struct GgufNeeds {
    /// `general.architecture`.
    pub arch: String,
    /// Why this build cannot run it (an unknown architecture, or metadata the engine refuses);
    /// `None` when it can.
    pub unsupported: Option<String>,
    /// The dominant tensor type ("Q4_K"), as the library names a model's precision.
    pub quant: String,
    pub params: u64,
    /// Bytes of tensor data (the file less its header; every part of a split GGUF when
    /// `weights_total` is given).
    pub weights: u64,
    pub context_len: Option<u64>,
    /// The engine's configuration of the model, when it runs it: what the KV is sized from.
    cfg: Option<ModelConfig>,
}

impl GgufNeeds {
    /// From a parsed header. `weights_total`: the tensor bytes of all parts of a split GGUF
    /// (whose first part's header lists only its own tensors); `None` for a single file.
    pub fn of(f: &GgufFile, weights_total: Option<u64>) -> Self {
        let (arch, context_len) = crate::library::describe::arch_and_context(f);
        let (cfg, unsupported) = match ModelConfig::from_gguf(f) {
            Ok(cfg) => (Some(cfg), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let own: u64 = f.tensors.iter().map(|t| t.size).sum();
        Self {
            arch,
            unsupported,
            quant: dominant_type(f).map_or("unknown".to_string(), |t| t.name().to_string()),
            params: f.tensors.iter().map(|t| t.n_elements()).sum(),
            weights: weights_total.unwrap_or(own),
            context_len,
            cfg,
        }
    }

    pub fn runs(&self) -> bool {
        self.unsupported.is_none()
    }

    /// KV cache bytes for `batch` sequences of `ctx` tokens each, as the engine's pool would
    /// hold them (`None` for a model this build does not run).
    pub fn kv_bytes(&self, ctx: usize, batch: usize) -> Option<u64> {
        let cfg = self.cfg.as_ref()?;
        let one = KvTypes::F16.budget_for_tokens(cfg, KV_BLOCK, ctx) as u64;
        Some(one.saturating_mul(batch as u64))
    }

    /// Weights plus KV at `ctx` and `batch`.
    pub fn need_bytes(&self, ctx: usize, batch: usize) -> Option<u64> {
        Some(self.weights.saturating_add(self.kv_bytes(ctx, batch)?))
    }
}

/// Whether a need fits a memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub enum Verdict {
    Fits,
    DoesNotFit,
    /// No such memory here (no GPU), or the need is unknown (a model this build does not run).
    Unknown,
}

impl Verdict {
    pub fn of(need: Option<u64>, have: Option<u64>) -> Self {
        match (need, have) {
            (Some(n), Some(h)) if n <= h => Self::Fits,
            (Some(_), Some(_)) => Self::DoesNotFit,
            _ => Self::Unknown,
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            Self::Fits => "fits",
            Self::DoesNotFit => "does not fit",
            Self::Unknown => "—",
        }
    }
}

//! The KV cache's element types ([`KvType`]: llama.cpp's `--cache-type-k/-v` names f16, bf16,
//! q8_0, q4_0) and the pair a cache is built with ([`KvTypes`], K and V apart as in llama.cpp),
//! which owns the bytes a token costs: every figure that turns a KV budget into blocks or tokens
//! (the pool, the fit, the dashboard's memory) asks [`KvTypes`].
//!
//! A quantized row is stored as ggml's blocks of 32 (`block_q8_0`: an f16 scale and 32 int8;
//! `block_q4_0`: an f16 scale and 16 bytes of nibbles), quantized by the kernels' ggml-exact
//! quantizers, so a head's slice of a row is whole blocks when the head size is a multiple of 32.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use tpslab_kernels::WType;

use crate::kv::KvError;
use crate::model::config::ModelConfig;

/// One element type of the K or V cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvType {
    /// Half precision (the default, as llama.cpp's and vLLM's).
    #[default]
    F16,
    BF16,
    /// ggml Q8_0: 34 bytes per 32 elements.
    Q8_0,
    /// ggml Q4_0: 18 bytes per 32 elements.
    Q4_0,
}

impl KvType {
    /// Every type, in the order menus list them.
    pub const ALL: [KvType; 4] = [Self::F16, Self::BF16, Self::Q8_0, Self::Q4_0];

    /// llama.cpp's name of the type (`--cache-type-k q8_0`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Q8_0 => "q8_0",
            Self::Q4_0 => "q4_0",
        }
    }

    /// The ggml block type the rows are stored as.
    pub const fn wtype(self) -> WType {
        match self {
            Self::F16 => WType::F16,
            Self::BF16 => WType::BF16,
            Self::Q8_0 => WType::Q8_0,
            Self::Q4_0 => WType::Q4_0,
        }
    }

    /// Elements per block: a head must be a whole number of them.
    pub const fn block(self) -> usize {
        self.wtype().block_size()
    }

    /// Bytes of a row of `n` elements (`n` a multiple of [`Self::block`]).
    pub const fn row_bytes(self, n: usize) -> usize {
        self.wtype().row_bytes(n)
    }
}

impl fmt::Display for KvType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A name that is not a KV cache type; the message lists those that are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown KV cache type '{0}' (known: {known})", known = KvType::ALL.map(KvType::name).join(", "))]
pub struct UnknownKvType(pub String);

impl FromStr for KvType {
    type Err = UnknownKvType;

    /// llama.cpp's names, ignoring case and surrounding blanks.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let name = s.trim();
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| UnknownKvType(s.to_string()))
    }
}

impl Serialize for KvType {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for KvType {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = <std::borrow::Cow<'de, str> as Deserialize>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// The element types of a cache's K and of its V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct KvTypes {
    pub k: KvType,
    pub v: KvType,
}

impl KvTypes {
    /// f16 K and V: the default.
    pub const F16: Self = Self::same(KvType::F16);

    /// The same type for K and V.
    pub const fn same(t: KvType) -> Self {
        Self { k: t, v: t }
    }

    /// Whether both are f16 (what every device runs).
    pub fn is_f16(self) -> bool {
        self == Self::F16
    }

    /// Refused when a head of `cfg` is not whole blocks of a type.
    pub fn check(self, cfg: &ModelConfig) -> Result<(), KvError> {
        for t in [self.k, self.v] {
            if !cfg.head_dim.is_multiple_of(t.block()) {
                return Err(KvError::HeadNotBlocks {
                    ty: t,
                    head_dim: cfg.head_dim,
                });
            }
        }
        Ok(())
    }

    /// Bytes of one token's K and V over every layer of `cfg`: the one figure every KV size is
    /// computed from.
    pub fn bytes_per_token(self, cfg: &ModelConfig) -> usize {
        self.bytes_per_token_of(cfg.n_layers, cfg.kv_dim())
    }

    /// [`Self::bytes_per_token`] of a model of `n_layers` layers of `kv_dim` K (and V) values
    /// per token (the planner's shapes carry these, not a configuration).
    pub fn bytes_per_token_of(self, n_layers: usize, kv_dim: usize) -> usize {
        n_layers * (self.k.row_bytes(kv_dim) + self.v.row_bytes(kv_dim))
    }

    /// Bytes of one block of `block_size` tokens.
    pub fn bytes_per_block(self, cfg: &ModelConfig, block_size: usize) -> usize {
        block_size * self.bytes_per_token(cfg)
    }

    /// How many blocks a memory budget of `bytes` holds.
    pub fn blocks_for_budget(self, cfg: &ModelConfig, block_size: usize, bytes: usize) -> usize {
        bytes / self.bytes_per_block(cfg, block_size).max(1)
    }

    /// The pool a budget of `bytes` sizes: its block count, refused when not even one block
    /// fits. Every place that turns a KV budget into a pool asks this.
    pub fn pool_for_budget(
        self,
        cfg: &ModelConfig,
        block_size: usize,
        bytes: usize,
    ) -> Result<usize, KvError> {
        match self.blocks_for_budget(cfg, block_size.max(1), bytes) {
            0 => Err(KvError::NoBlock {
                budget: bytes,
                block_size,
            }),
            n => Ok(n),
        }
    }

    /// The budget that holds `tokens` token slots in blocks of `block_size` (the inverse of
    /// [`Self::pool_for_budget`], for a pool sized to one request).
    pub fn budget_for_tokens(self, cfg: &ModelConfig, block_size: usize, tokens: usize) -> usize {
        self.bytes_per_block(cfg, block_size)
            .saturating_mul(tokens.div_ceil(block_size.max(1)))
    }
}

/// "q8_0" when K and V agree, else "K q8_0, V f16".
impl fmt::Display for KvTypes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.k == self.v {
            f.pad(self.k.name())
        } else {
            f.pad(&format!("K {}, V {}", self.k, self.v))
        }
    }
}

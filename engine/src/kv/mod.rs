//! Paged KV storage and the batch description the forward pass reads it through.
//!
//! The cache is a pool of fixed-size blocks per layer; a sequence owns a list of block ids (its
//! block table) handed out by whoever schedules it. The model writes each new token's K and V
//! into its slot (`block * block_size + offset`) and attention reads them back through the
//! block table, so nothing is ever copied when a sequence grows.
//!
//! Modules:
//! - [`block_pool`]: KV block pool (free list, ref counts, prefix-cache hashes) and per-request
//!   block tables.
//! - [`kv_type`]: the cache's element types (f16, bf16, q8_0, q4_0) and the bytes a token
//!   costs in them.

pub mod block_pool;
pub mod kv_type;

use half::f16;
use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
use serde::{Deserialize, Serialize};
use tpslab_kernels::attn::KvRows;
use tpslab_kernels::quantize_row;

use crate::model::config::ModelConfig;

pub use kv_type::{KvType, KvTypes, UnknownKvType};

#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error(
        "KV cache of {blocks} blocks x {block_size} tokens does not fit in memory ({bytes} bytes)"
    )]
    TooLarge {
        blocks: usize,
        block_size: usize,
        bytes: u128,
    },
    #[error("KV block size must be between 1 and 1024, got {0}")]
    BlockSize(usize),
    #[error("a KV budget of {budget} bytes holds no block of {block_size} tokens")]
    NoBlock { budget: usize, block_size: usize },
    #[error(
        "a KV cache of type {ty} stores blocks of {} values, and a head of {head_dim} is not \
         whole blocks; use f16 or bf16",
        ty.block()
    )]
    HeadNotBlocks { ty: KvType, head_dim: usize },
}

/// Settings that take a rebuild of the KV pool when they change.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct KvSettings {
    /// Memory for the KV pool, in bytes.
    pub budget_bytes: usize,
    /// Tokens per KV block.
    pub block_size: usize,
    /// The element types K and V are stored as (`--cache-type-k/-v`).
    pub types: KvTypes,
}

impl Default for KvSettings {
    fn default() -> Self {
        Self {
            budget_bytes: 512 << 20,
            block_size: 16,
            types: KvTypes::F16,
        }
    }
}

/// One layer's K or V: f16 values, or the bytes of ggml blocks of another type.
#[derive(Debug)]
enum Store {
    // Raw f16 bits: `vec![0u16; n]` (and `vec![0u8; n]`) come from calloc, so untouched blocks
    // cost no resident memory until a sequence first writes them.
    F16(Vec<u16>),
    Blocks(Vec<u8>),
}

impl Store {
    /// Room for `slots` rows of `kv_dim` elements of `ty`.
    fn new(ty: KvType, slots: usize, kv_dim: usize) -> Self {
        match ty {
            KvType::F16 => Self::F16(vec![0; slots * kv_dim]),
            _ => Self::Blocks(vec![0; slots * ty.row_bytes(kv_dim)]),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Self::F16(x) => x.len() * 2,
            Self::Blocks(x) => x.len(),
        }
    }

    /// Stores `x` (one token's row) in `slot`.
    fn write(&mut self, ty: KvType, slot: usize, x: &[f32]) {
        match self {
            Self::F16(d) => d[slot * x.len()..][..x.len()]
                .reinterpret_cast_mut::<f16>()
                .convert_from_f32_slice(x),
            Self::Blocks(d) => {
                let n = ty.row_bytes(x.len());
                quantize_row(ty.wtype(), x, &mut d[slot * n..][..n]);
            }
        }
    }

    fn rows(&self, ty: KvType) -> KvRows<'_> {
        match self {
            Self::F16(x) => KvRows::F16(x.reinterpret_cast()),
            Self::Blocks(data) => KvRows::Blocks {
                ty: ty.wtype(),
                data,
            },
        }
    }
}

/// K and V for every layer, `num_blocks * block_size` token slots each, stored as f16 by default
/// (as llama.cpp and vLLM do: half the memory of f32 for a rounding well below the activation
/// quantization error), or as the [`KvTypes`] the cache was built with (each token's row
/// quantized to 32-element blocks as it is written).
#[derive(Debug)]
pub struct KvCache {
    pub block_size: usize,
    pub num_blocks: usize,
    kv_dim: usize,
    types: KvTypes,
    k: Vec<Store>,
    v: Vec<Store>,
}

impl KvCache {
    /// A cache of the default (f16) types.
    pub fn new(cfg: &ModelConfig, block_size: usize, num_blocks: usize) -> Result<Self, KvError> {
        Self::with_types(cfg, block_size, num_blocks, KvTypes::F16)
    }

    /// A cache whose K and V are stored as `types`.
    pub fn with_types(
        cfg: &ModelConfig,
        block_size: usize,
        num_blocks: usize,
        types: KvTypes,
    ) -> Result<Self, KvError> {
        if block_size == 0 || block_size > 1024 {
            return Err(KvError::BlockSize(block_size));
        }
        types.check(cfg)?;
        let slots = num_blocks
            .checked_mul(block_size)
            .filter(|&s| {
                s.checked_mul(cfg.kv_dim())
                    .is_some_and(|n| n <= isize::MAX as usize / 4)
            })
            .ok_or(KvError::TooLarge {
                blocks: num_blocks,
                block_size,
                bytes: types.bytes_per_block(cfg, block_size) as u128 * num_blocks as u128,
            })?;
        let alloc = |ty| {
            (0..cfg.n_layers)
                .map(|_| Store::new(ty, slots, cfg.kv_dim()))
                .collect::<Vec<_>>()
        };
        Ok(Self {
            block_size,
            num_blocks,
            kv_dim: cfg.kv_dim(),
            types,
            k: alloc(types.k),
            v: alloc(types.v),
        })
    }

    pub fn bytes(&self) -> usize {
        self.k.iter().chain(&self.v).map(Store::bytes).sum()
    }

    pub fn kv_dim(&self) -> usize {
        self.kv_dim
    }

    /// The element types K and V are stored as.
    pub fn types(&self) -> KvTypes {
        self.types
    }

    /// Stores one token's K and V for `layer` in `slot` (quantized to the cache's types).
    pub fn write(&mut self, layer: usize, slot: usize, k: &[f32], v: &[f32]) {
        debug_assert!(k.len() == self.kv_dim && v.len() == self.kv_dim);
        self.k[layer].write(self.types.k, slot, k);
        self.v[layer].write(self.types.v, slot, v);
    }

    /// All K and V slots of one layer, as attention reads them.
    pub fn layer(&self, layer: usize) -> (KvRows<'_>, KvRows<'_>) {
        (
            self.k[layer].rows(self.types.k),
            self.v[layer].rows(self.types.v),
        )
    }
}

/// One forward step's input: every scheduled token of every sequence, flattened.
#[derive(Debug, Clone, Default)]
pub struct Batch {
    pub tokens: Vec<u32>,
    /// Position of each token in its sequence.
    pub positions: Vec<usize>,
    /// Index into `block_tables` of each token's sequence.
    pub seq_of: Vec<usize>,
    /// Block table of each sequence in the batch.
    pub block_tables: Vec<Vec<u32>>,
    /// Token indices whose logits are wanted (the last scheduled token of each sequence that
    /// will sample, and the positions of its proposed tokens in a speculative step), in the
    /// order the logits rows come back.
    pub logit_rows: Vec<usize>,
    /// Token indices whose output-normed states are wanted (embeddings), in the order they
    /// come back ([`crate::device::StepOutput::hidden`]).
    pub hidden_rows: Vec<usize>,
}

impl Batch {
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// Adds `tokens` of sequence `block_table` starting at position `start`; when `logits` is
    /// set, the last one's logits are computed.
    pub fn push_seq(&mut self, block_table: Vec<u32>, start: usize, tokens: &[u32], logits: bool) {
        self.push_seq_rows(block_table, start, tokens, usize::from(logits));
    }

    /// As [`Self::push_seq`], with the logits of the last `n_logits` tokens (a speculative step
    /// verifies each proposed token from the logits of the position before it).
    pub fn push_seq_rows(
        &mut self,
        block_table: Vec<u32>,
        start: usize,
        tokens: &[u32],
        n_logits: usize,
    ) {
        let s = self.block_tables.len();
        self.block_tables.push(block_table);
        for (i, &t) in tokens.iter().enumerate() {
            self.tokens.push(t);
            self.positions.push(start + i);
            self.seq_of.push(s);
        }
        let end = self.tokens.len();
        self.logit_rows
            .extend(end - n_logits.min(tokens.len())..end);
    }

    /// KV slot of token `i`.
    pub fn slot(&self, i: usize, block_size: usize) -> usize {
        let pos = self.positions[i];
        self.block_tables[self.seq_of[i]][pos / block_size] as usize * block_size + pos % block_size
    }
}

/// A request the KV pool can never hold whole: the K/V of every token but the last generated
/// one must fit at once, or the request could never complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "request needs {needed_blocks} KV blocks ({tokens} tokens) but the cache has only \
     {num_blocks}; shorten the prompt or max_tokens, or enlarge the KV budget"
)]
pub struct KvNeverFits {
    pub tokens: usize,
    pub needed_blocks: usize,
    pub num_blocks: usize,
}

/// A KV pool's shape as admission sees it: blocks of `block_size` token slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvPool {
    pub num_blocks: usize,
    pub block_size: usize,
}

impl KvPool {
    /// Token slots in the whole pool: the most any one request can have computed at once.
    pub fn tokens(&self) -> usize {
        self.num_blocks.saturating_mul(self.block_size)
    }

    /// Whether a request of `prompt_len` tokens generating up to `max_tokens` can complete in
    /// the pool (see [`KvNeverFits`]).
    pub fn fit(&self, prompt_len: usize, max_tokens: usize) -> Result<(), KvNeverFits> {
        let tokens = prompt_len.saturating_add(max_tokens.saturating_sub(1));
        let needed_blocks = tokens.div_ceil(self.block_size.max(1));
        if needed_blocks > self.num_blocks {
            return Err(KvNeverFits {
                tokens,
                needed_blocks,
                num_blocks: self.num_blocks,
            });
        }
        Ok(())
    }
}

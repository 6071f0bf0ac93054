//! Paged attention on the GPU: the per-token kernels (attention.cu, lanes over keys or the wide
//! variant) and FlashAttention-2-style prefill tiles (flash.cu), and how a batch's tokens split
//! between them ([`flash_split`]).

use super::{Arg, CudaError, Gpu, Result, WIDE_ATTN_TOKENS};

/// Most query tokens in one flash.cu tile (4 warps of 16 rows).
pub const FLASH_MAX_TILE: usize = 64;

/// Shape of attention for the RoPE and attention kernels, and how scores are made: `scale` on
/// q.k, a sliding `window` of positions (0: none), soft-capping at `softcap` (0: none), and the
/// device address of one sink logit per query head (0: none; gpt-oss).
#[derive(Debug, Clone, Copy)]
pub struct AttnGeom {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    pub block_size: usize,
    pub scale: f32,
    pub window: usize,
    pub softcap: f32,
    pub sinks: u64,
}

impl AttnGeom {
    /// Plain causal attention with the usual `1 / sqrt(head_dim)`.
    pub fn plain(n_heads: usize, n_kv_heads: usize, head_dim: usize, block_size: usize) -> Self {
        Self {
            n_heads,
            n_kv_heads,
            head_dim,
            block_size,
            scale: 1.0 / (head_dim as f32).sqrt(),
            window: 0,
            softcap: 0.0,
            sinks: 0,
        }
    }
}

/// Device addresses and sizes of one attention launch: `n` tokens whose Q/K/V rows are `stride`
/// floats apart in `qkv`, one layer's K and V caches, the tokens' positions, block-table offsets
/// and the block tables (i32), and the output (`n` rows of `n_heads * head_dim` floats).
#[derive(Debug, Clone, Copy)]
pub struct AttnIo {
    pub qkv: u64,
    pub stride: usize,
    pub kc: u64,
    pub vc: u64,
    pub pos: u64,
    pub bt_off: u64,
    pub bt: u64,
    pub out: u64,
    pub n: usize,
}

/// How an attention launch's tokens split between flash.cu and the per-token kernels: device
/// addresses of `n_tiles` `[first token, count]` pairs and of `n_rest` token indices (i32).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttnSplit {
    pub tiles: u64,
    pub n_tiles: usize,
    pub rest: u64,
    pub n_rest: usize,
}

/// Splits a batch's tokens (each token's sequence and position) for [`Gpu::attention_split`]:
/// every run of at least `min_run` consecutive tokens of one sequence at consecutive positions
/// (a prefill chunk) becomes tiles of up to [`FLASH_MAX_TILE`] tokens (`[first, count]` pairs,
/// flattened); every other token is listed in the second vector.
pub fn flash_split(seq_of: &[usize], positions: &[usize], min_run: usize) -> (Vec<i32>, Vec<i32>) {
    let (mut tiles, mut rest) = (Vec::new(), Vec::new());
    let mut start = 0;
    while start < seq_of.len() {
        let mut end = start + 1;
        while end < seq_of.len()
            && seq_of[end] == seq_of[start]
            && positions[end] == positions[end - 1] + 1
        {
            end += 1;
        }
        if end - start >= min_run.max(1) {
            for first in (start..end).step_by(FLASH_MAX_TILE) {
                tiles.extend([first as i32, (end - first).min(FLASH_MAX_TILE) as i32]);
            }
        } else {
            rest.extend((start..end).map(|i| i as i32));
        }
        start = end;
    }
    (tiles, rest)
}

/// The arguments every attention kernel takes, in their order: `list` is the per-token kernels'
/// token list or flash's tiles.
fn attn_args(io: &AttnIo, g: &AttnGeom, list: u64) -> [Arg; 16] {
    [
        Arg::P(io.qkv),
        Arg::I(io.stride as i32),
        Arg::P(io.kc),
        Arg::P(io.vc),
        Arg::P(io.pos),
        Arg::P(io.bt_off),
        Arg::P(io.bt),
        Arg::P(io.out),
        Arg::I(g.n_heads as i32),
        Arg::I(g.n_kv_heads as i32),
        Arg::I(g.block_size as i32),
        Arg::F(g.scale),
        Arg::P(list),
        Arg::I(g.window as i32),
        Arg::F(g.softcap),
        Arg::P(g.sinks),
    ]
}

impl Gpu {
    /// Whether the attention kernel takes this head size.
    pub fn supports_head_dim(head_dim: usize) -> bool {
        head_dim.is_multiple_of(32) && matches!(head_dim / 32, 1..=6 | 8)
    }

    /// Paged attention of `io.n` tokens: token `i` (position `pos[i]`) attends to positions
    /// `0..=pos[i]` of its sequence, whose block table starts at `bt[bt_off[i]]`. From
    /// [`WIDE_ATTN_TOKENS`] tokens on, the wide kernel (one key per warp step) runs.
    pub fn paged_attention(&self, io: &AttnIo, g: &AttnGeom) -> Result<()> {
        self.paged_attention_with(io.n >= WIDE_ATTN_TOKENS, io, g)
    }

    /// [`Gpu::paged_attention`] with the kernel variant chosen by the caller.
    pub fn paged_attention_with(&self, wide: bool, io: &AttnIo, g: &AttnGeom) -> Result<()> {
        self.per_token(wide, io, g, 0, io.n)
    }

    /// The per-token kernels over `count` tokens: `which` (device i32 token indices) or, when
    /// 0, tokens `0..count`.
    fn per_token(
        &self,
        wide: bool,
        io: &AttnIo,
        g: &AttnGeom,
        which: u64,
        count: usize,
    ) -> Result<()> {
        let table = if wide {
            &self.k.attn_wide
        } else {
            &self.k.attn
        };
        let f = table
            .get(g.head_dim / 32)
            .and_then(Option::as_ref)
            .filter(|_| Self::supports_head_dim(g.head_dim))
            .ok_or(CudaError::HeadDim(g.head_dim))?;
        let group = g.n_heads / g.n_kv_heads.max(1);
        let y = g.n_kv_heads * group.div_ceil(8);
        self.run(f, (count as u32, y as u32), 128, &attn_args(io, g, which))
    }

    /// Attention of `io.n` tokens split as [`flash_split`] split them: flash.cu's prefill
    /// tiles, then the per-token kernels over the other tokens.
    pub fn attention_split(&self, io: &AttnIo, g: &AttnGeom, split: &AttnSplit) -> Result<()> {
        if split.n_tiles > 0 {
            let f = self
                .k
                .flash
                .get(g.head_dim / 32)
                .and_then(Option::as_ref)
                .filter(|_| Self::supports_head_dim(g.head_dim))
                .ok_or(CudaError::HeadDim(g.head_dim))?;
            let a = attn_args(io, g, split.tiles);
            self.run(f, (split.n_tiles as u32, g.n_heads as u32), 128, &a)?;
        }
        if split.n_rest > 0 {
            let wide = split.n_rest >= WIDE_ATTN_TOKENS;
            self.per_token(wide, io, g, split.rest, split.n_rest)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_runs_become_tiles_and_the_rest_is_listed() {
        // Two decodes, a chunk of 150 (tiles of 64, 64, 22), a short chunk of 3, a decode of the
        // long chunk's sequence at a later position (not the same run).
        let mut seq = vec![0, 1];
        let mut pos = vec![40, 7];
        seq.extend([2; 150]);
        pos.extend(10..160);
        seq.extend([3; 3]);
        pos.extend(0..3);
        seq.push(2);
        pos.push(300);
        let (tiles, rest) = flash_split(&seq, &pos, 16);
        assert_eq!(tiles, vec![2, 64, 66, 64, 130, 22]);
        assert_eq!(rest, vec![0, 1, 152, 153, 154, 155]);
        // Below the threshold everything is per token.
        let (tiles, rest) = flash_split(&seq, &pos, 200);
        assert!(tiles.is_empty());
        assert_eq!(rest.len(), seq.len());
    }
}

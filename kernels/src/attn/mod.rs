//! Paged attention on the CPU: causal attention of a batch of query tokens over K/V caches (f16,
//! or BF16 / Q8_0 / Q4_0 blocks) read through per-sequence block tables, with grouped-query heads.
//!
//! Modules: `x86` (the AVX2 kernels, and their 512-bit dots and V sums), `kv_rows` ([`KvRows`]: a cache of one element type and
//! its conversion to f32).
//!
//! Layout of the work: a *tile* is up to [`TILE_TOKENS`] consecutive batch tokens of one
//! sequence; a work item is (tile, kv group). Each K and V row is converted to f32 once per
//! item and used by every query of the item (tile tokens x the group's query heads), which is
//! where the speed comes from at prefill (and, for the heads of a group, at decode).
//!
//! Arithmetic per query, the same whatever tile, batch or thread count (batch invariance):
//! q is rounded to f16 (as llama.cpp does, for parity with it); positions `0..=pos` are taken in
//! blocks of [`BLOCK`] counted from position 0; per block the scores are `dot(q16, k) * scale`
//! (eight partial sums over the head, then a fixed tree), the block maximum rescales the f32
//! accumulator and the running sum once, then `w = exp(s - max)` and `acc += w * v` in position
//! order. Tiles share loads and conversions, never arithmetic; a query skips the blocks and
//! positions past its own position.
//!
//! The AVX2 path (AVX2 + FMA + F16C) and the portable one compute the same scores bit for bit
//! (f16 x f16 products are exact in f32, so FMA or not does not matter there); they differ in
//! the exp and in fused vs separate multiply-add when accumulating V, so outputs agree only
//! within rounding. A quantized cache's rows are dequantized to f32 (ggml's formulas) and then
//! go through the same arithmetic.

use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

use half::f16;

use crate::{Backend, SendPtr, ThreadPool};

mod kv_rows;

pub use kv_rows::KvRows;

/// Largest head dimension supported.
pub const MAX_HEAD_DIM: usize = 256;
/// Positions per softmax block (block boundaries are multiples of this from position 0).
pub const BLOCK: usize = 32;
/// Most batch tokens in one tile.
pub const TILE_TOKENS: usize = 8;
/// Tiles are cut so that tokens x heads per group stays about this (accumulators in L1).
const TILE_QUERIES: usize = 32;

/// Shapes of one attention call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AttnShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// KV-cache slots per block of the block tables.
    pub block_size: usize,
}

/// Inputs of one paged attention call over a batch of `positions.len()` query tokens.
#[derive(Debug, Clone, Copy)]
pub struct AttnInput<'a, T> {
    pub shape: AttnShape,
    /// Position of each token in its sequence; token `t` attends over `0..=positions[t]`.
    pub positions: &'a [usize],
    /// Index into `tables` of each token's sequence.
    pub seq_of: &'a [usize],
    /// Block table of each sequence: position `p` lives in slot
    /// `table[p / block_size] * block_size + p % block_size`.
    pub tables: &'a [T],
    /// Query rows, `q_stride` floats apart, each `n_heads * head_dim` long.
    pub q: &'a [f32],
    pub q_stride: usize,
    /// Caches of one layer: `n_kv_heads * head_dim` values per slot (K and V may differ in
    /// type, not in length).
    pub k_cache: KvRows<'a>,
    pub v_cache: KvRows<'a>,
    /// How scores are formed: `dot(q, k) * scale`, then `tanh(s / cap) * cap` with a soft-cap.
    pub scale: f32,
    pub softcap: Option<f32>,
    /// Sliding window: token `t` sees positions `positions[t] + 1 - window ..= positions[t]`.
    pub window: Option<usize>,
    /// One logit per query head that joins its softmax's denominator and attends to nothing
    /// (gpt-oss's sinks): `w_p = exp(s_p) / (sum_p exp(s_p) + exp(sink))`, as ggml's
    /// `soft_max` with sinks forms it.
    pub sinks: Option<&'a [f32]>,
}

impl<T> AttnInput<'_, T> {
    /// The first position token `pos` attends to.
    fn first_pos(&self, pos: usize) -> usize {
        self.window.map_or(0, |w| (pos + 1).saturating_sub(w))
    }
}

/// `out[t]` (`n_heads * head_dim` floats per token) = attention of token `t`'s query heads over
/// positions `0..=positions[t]` of its sequence (the window's part of them, with one), on the
/// fastest backend this CPU has.
pub fn paged_attention<T: AsRef<[u32]> + Sync>(
    pool: &ThreadPool,
    input: &AttnInput<'_, T>,
    out: &mut [f32],
) {
    paged_attention_with(Backend::detect(), pool, input, out);
}

/// One work item: tokens `t0..t0 + nt` (one sequence) and kv group `g`.
#[derive(Clone, Copy)]
struct Item {
    cost: u64,
    t0: usize,
    nt: usize,
    g: usize,
}

/// [`paged_attention`] on a chosen backend (panics if this CPU lacks it).
pub fn paged_attention_with<T: AsRef<[u32]> + Sync>(
    backend: Backend,
    pool: &ThreadPool,
    input: &AttnInput<'_, T>,
    out: &mut [f32],
) {
    assert!(
        backend.is_available(),
        "{backend:?} is not supported by this CPU"
    );
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        block_size,
    } = input.shape;
    assert!(
        n_kv_heads > 0 && n_heads % n_kv_heads == 0,
        "n_heads is not a multiple of n_kv_heads"
    );
    assert!(hd > 0 && hd <= MAX_HEAD_DIM, "head_dim {hd} out of range");
    assert!(block_size > 0, "block_size is 0");
    assert!(input.window != Some(0), "a window of 0 positions");
    let n = input.positions.len();
    let hidden = n_heads * hd;
    assert_eq!(
        input.seq_of.len(),
        n,
        "seq_of and positions differ in length"
    );
    assert_eq!(
        out.len(),
        n * hidden,
        "out is not tokens x n_heads x head_dim"
    );
    if n == 0 {
        return;
    }
    assert!(
        input.q_stride >= hidden && input.q.len() >= (n - 1) * input.q_stride + hidden,
        "q is too short for the batch"
    );
    assert_eq!(
        input.k_cache.len(),
        input.v_cache.len(),
        "K and V caches differ"
    );
    for c in [input.k_cache, input.v_cache] {
        let ty = c.ty();
        assert!(
            hd.is_multiple_of(ty.block_size()),
            "head_dim {hd} is not whole blocks of {ty}"
        );
    }
    assert!(
        input.sinks.is_none_or(|s| s.len() == n_heads),
        "not one sink per query head"
    );
    // The SIMD kernels step through the head 8 floats at a time. Attention has no integer
    // dots: every x86 path runs the AVX2 code, its dots and V sums on 512-bit vectors where
    // the backend's tiles are (the same bits).
    let wide = backend == Backend::Avx512Zmm;
    let backend = if hd.is_multiple_of(8) {
        backend.float_path()
    } else {
        Backend::Portable
    };
    let group = n_heads / n_kv_heads;
    let tile_tokens = (TILE_QUERIES / group).clamp(1, TILE_TOKENS);

    // Items, most expensive first, handed out dynamically: long prompts' late tiles cost the
    // most, so no thread ends up with all of them (the result does not depend on who runs what).
    let mut items = Vec::with_capacity(n.div_ceil(tile_tokens) * n_kv_heads);
    let mut t0 = 0;
    while t0 < n {
        let seq = input.seq_of[t0];
        let mut nt = 1;
        while nt < tile_tokens && t0 + nt < n && input.seq_of[t0 + nt] == seq {
            nt += 1;
        }
        let pos = &input.positions[t0..t0 + nt];
        let max_pos = pos.iter().copied().max().unwrap_or(0);
        let min_first = pos.iter().map(|&p| input.first_pos(p)).min().unwrap_or(0);
        // Query work (scores and V accumulation) plus converting K and V rows.
        let span: usize = pos.iter().map(|&p| p + 1 - input.first_pos(p)).sum();
        let cost = (group * span + 2 * (max_pos + 1 - min_first)) as u64;
        items.extend((0..n_kv_heads).map(|g| Item { cost, t0, nt, g }));
        t0 += nt;
    }
    items.sort_by_key(|it| std::cmp::Reverse(it.cost));

    let next = AtomicUsize::new(0);
    let outp = SendPtr(out.as_mut_ptr());
    pool.run(&|_, _| {
        SCRATCH.with_borrow_mut(|scratch| {
            scratch.reserve(tile_tokens * group, hd);
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&item) = items.get(i) else { break };
                run_item(backend, wide, input, item, scratch, outp);
            }
        });
    });
}

/// Per-thread buffers, reused across calls (pool workers are persistent).
#[derive(Default)]
struct Scratch {
    /// Up to `BLOCK` converted K rows, and V rows, each `hd` long.
    k: Vec<f32>,
    v: Vec<f32>,
    /// Rounded queries and their accumulators, `hd` each.
    q: Vec<f32>,
    acc: Vec<f32>,
    /// Running (max, sum) of each query.
    state: Vec<(f32, f32)>,
}

impl Scratch {
    fn reserve(&mut self, nq: usize, hd: usize) {
        // Zero-filled once, so lanes past the last converted row hold finite values (they are
        // masked out anyway).
        for (buf, len) in [
            (&mut self.k, BLOCK * hd),
            (&mut self.v, BLOCK * hd),
            (&mut self.q, nq * hd),
            (&mut self.acc, nq * hd),
        ] {
            if buf.len() < len {
                buf.resize(len, 0.0);
            }
        }
        if self.state.len() < nq {
            self.state.resize(nq, (0.0, 0.0));
        }
    }
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

fn run_item<T: AsRef<[u32]>>(
    backend: Backend,
    wide: bool,
    input: &AttnInput<'_, T>,
    item: Item,
    s: &mut Scratch,
    out: SendPtr<f32>,
) {
    let AttnShape {
        n_heads,
        n_kv_heads,
        head_dim: hd,
        block_size: bs,
    } = input.shape;
    let group = n_heads / n_kv_heads;
    let kv_dim = n_kv_heads * hd;
    let (scale, softcap) = (input.scale, input.softcap);
    let Item { t0, nt, g, .. } = item;
    let positions = &input.positions[t0..t0 + nt];
    let max_pos = positions.iter().copied().max().unwrap_or(0);
    // Blocks wholly before every token's window are skipped (block boundaries stay multiples of
    // `BLOCK` from position 0, so a token's arithmetic does not depend on its tile).
    let start = positions
        .iter()
        .map(|&p| input.first_pos(p))
        .min()
        .unwrap_or(0)
        / BLOCK
        * BLOCK;
    let table = input.tables[input.seq_of[t0]].as_ref();

    load_queries(backend, input, item, group, s);

    // Cache offsets of the rows of this block and of the next (prefetched while this one is
    // worked on: rows come from scattered blocks, which the hardware prefetcher cannot follow).
    let cache_len = input.k_cache.len();
    let mut offs = [0usize; BLOCK];
    let mut next = [0usize; BLOCK];
    let rows_at = |base: usize| BLOCK.min((max_pos + 1).saturating_sub(base));
    row_offsets(
        table,
        bs,
        kv_dim,
        g * hd,
        hd,
        cache_len,
        start,
        &mut next[..rows_at(start)],
    );
    for base in (start..=max_pos).step_by(BLOCK) {
        let rows = rows_at(base);
        offs[..rows].copy_from_slice(&next[..rows]);
        let next_rows = rows_at(base + BLOCK);
        let next = &mut next[..next_rows];
        row_offsets(table, bs, kv_dim, g * hd, hd, cache_len, base + BLOCK, next);
        let (k, v) = (&mut s.k[..rows * hd], &mut s.v[..rows * hd]);
        match (backend, input.k_cache, input.v_cache) {
            // SAFETY: AVX2/F16C checked available; `hd % 8 == 0` on this backend.
            #[cfg(target_arch = "x86_64")]
            (Backend::Avx2, KvRows::F16(kc), KvRows::F16(vc)) => unsafe {
                x86::convert_rows(kc, vc, &offs[..rows], k, v);
                x86::prefetch_rows(kc, vc, next, hd);
            },
            // SAFETY: as above; a quantized cache's head is whole blocks of 32.
            #[cfg(target_arch = "x86_64")]
            (Backend::Avx2, kc, vc) => unsafe {
                x86::convert_cache(kc, &offs[..rows], k);
                x86::convert_cache(vc, &offs[..rows], v);
            },
            (_, kc, vc) => {
                for (r, &off) in offs[..rows].iter().enumerate() {
                    let dst = r * hd..(r + 1) * hd;
                    kc.to_f32(off, &mut k[dst.clone()]);
                    vc.to_f32(off, &mut v[dst]);
                }
            }
        }
        for (i, &pos) in positions.iter().enumerate() {
            let first = input.first_pos(pos);
            if pos < base || first >= base + BLOCK {
                continue;
            }
            let nv = rows.min(pos + 1 - base);
            for qi in i * group..(i + 1) * group {
                let blk = Block {
                    q: &s.q[qi * hd..][..hd],
                    k: &s.k[..BLOCK * hd],
                    v: &s.v[..BLOCK * hd],
                    lo: first.saturating_sub(base),
                    nv,
                    scale,
                    softcap,
                };
                let acc = &mut s.acc[qi * hd..][..hd];
                match backend {
                    // SAFETY: the backend was checked available (AVX2, FMA, F16C detected) and
                    // `hd % 8 == 0` (checked when choosing it).
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx2 if wide => unsafe { x86::block_zmm(&blk, &mut s.state[qi], acc) },
                    // SAFETY: as above.
                    #[cfg(target_arch = "x86_64")]
                    Backend::Avx2 => unsafe { x86::block(&blk, &mut s.state[qi], acc) },
                    _ => block_portable(&blk, &mut s.state[qi], acc),
                }
            }
        }
    }

    write_out(input.shape, input.sinks, item, s, out);
}

/// The item's queries rounded to f16 into the scratch, their accumulators and states reset.
fn load_queries<T>(
    backend: Backend,
    input: &AttnInput<'_, T>,
    item: Item,
    group: usize,
    s: &mut Scratch,
) {
    let hd = input.shape.head_dim;
    let Item { t0, nt, g, .. } = item;
    for i in 0..nt {
        let row = (t0 + i) * input.q_stride;
        for j in 0..group {
            let qi = i * group + j;
            let src = &input.q[row + (g * group + j) * hd..][..hd];
            round_to_f16(backend, src, &mut s.q[qi * hd..][..hd]);
            s.acc[qi * hd..][..hd].fill(0.0);
            s.state[qi] = (f32::NEG_INFINITY, 0.0);
        }
    }
}

/// Each query's accumulator divided by its softmax sum, into its (token, head) row of `out`.
/// A head's sink joins the sum here: the maximum becomes the larger of the scores' and the
/// sink's (rescaling what was summed), and `exp(sink - max)` is added.
fn write_out(shape: AttnShape, sinks: Option<&[f32]>, item: Item, s: &Scratch, out: SendPtr<f32>) {
    let (hd, group) = (shape.head_dim, shape.n_heads / shape.n_kv_heads);
    let hidden = shape.n_heads * hd;
    let Item { t0, nt, g, .. } = item;
    for i in 0..nt {
        for j in 0..group {
            let qi = i * group + j;
            let (max, mut sum) = s.state[qi];
            let mut rescale = 1.0;
            if let Some(sink) = sinks.map(|sk| sk[g * group + j]) {
                let m = max.max(sink);
                if max > f32::NEG_INFINITY {
                    rescale = (max - m).exp();
                }
                sum = sum * rescale + (sink - m).exp();
            }
            let inv = if sum > 0.0 { rescale / sum } else { 0.0 };
            let at = (t0 + i) * hidden + (g * group + j) * hd;
            // SAFETY: `out` holds `n * hidden` floats (checked by the caller) and each
            // (token, head) row is written by exactly one item: the one of its tile and group.
            let o = unsafe { std::slice::from_raw_parts_mut(out.get().add(at), hd) };
            for (o, &a) in o.iter_mut().zip(&s.acc[qi * hd..][..hd]) {
                *o = a * inv;
            }
        }
    }
}

/// One query against one block of converted K/V rows: rows `lo..nv` are its positions.
struct Block<'a> {
    q: &'a [f32],
    /// `BLOCK` rows of `q.len()` floats (rows outside `lo..nv` may hold anything finite).
    k: &'a [f32],
    v: &'a [f32],
    lo: usize,
    nv: usize,
    scale: f32,
    softcap: Option<f32>,
}

/// `tanh(s / cap) * cap`, as ggml soft-caps scores.
fn cap_score(s: f32, cap: Option<f32>) -> f32 {
    match cap {
        Some(c) => (s / c).tanh() * c,
        None => s,
    }
}

fn round_to_f16(backend: Backend, src: &[f32], dst: &mut [f32]) {
    match backend {
        // SAFETY: AVX2/F16C checked available; `hd % 8 == 0` on this backend.
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => unsafe { x86::round_to_f16(src, dst) },
        _ => {
            for (d, &x) in dst.iter_mut().zip(src) {
                *d = f16::from_f32(x).to_f32();
            }
        }
    }
}

/// Cache offsets of the `out.len()` rows from position `base` (column `col` of each slot),
/// walking the table without a division per row; panics if a row lies outside the cache.
#[allow(clippy::too_many_arguments)]
fn row_offsets(
    table: &[u32],
    bs: usize,
    kv_dim: usize,
    col: usize,
    hd: usize,
    cache_len: usize,
    base: usize,
    out: &mut [usize],
) {
    let (mut b, mut r) = (base / bs, base % bs);
    for o in out {
        let off = (table[b] as usize * bs + r) * kv_dim + col;
        assert!(
            off + hd <= cache_len,
            "block table points outside the KV cache"
        );
        *o = off;
        r += 1;
        if r == bs {
            (b, r) = (b + 1, 0);
        }
    }
}

/// `dot(q, k)` with eight partial sums and a fixed tree, the order the AVX2 path uses (so the
/// two agree bit for bit on f16-valued inputs, whose products are exact).
fn dot_portable(q: &[f32], k: &[f32]) -> f32 {
    let mut a = [0f32; 8];
    let (cq, ck) = (q.chunks_exact(8), k.chunks_exact(8));
    let (rq, rk) = (cq.remainder(), ck.remainder());
    for (x, y) in cq.zip(ck) {
        for l in 0..8 {
            a[l] += x[l] * y[l];
        }
    }
    // Heads that are not a multiple of 8 only run here; their tail goes to lanes in order.
    for (l, (x, y)) in rq.iter().zip(rk).enumerate() {
        a[l] += x * y;
    }
    ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]))
}

fn block_portable(b: &Block<'_>, state: &mut (f32, f32), acc: &mut [f32]) {
    let hd = b.q.len();
    let mut s = [f32::NEG_INFINITY; BLOCK];
    for (p, s) in s[..b.nv].iter_mut().enumerate().skip(b.lo) {
        *s = cap_score(dot_portable(b.q, &b.k[p * hd..][..hd]) * b.scale, b.softcap);
    }
    let m = s[b.lo..b.nv]
        .iter()
        .copied()
        .fold(f32::NEG_INFINITY, f32::max);
    if m > state.0 {
        if state.0 > f32::NEG_INFINITY {
            let r = (state.0 - m).exp();
            acc.iter_mut().for_each(|a| *a *= r);
            state.1 *= r;
        }
        state.0 = m;
    }
    let mut sum = 0f32;
    for (p, &sp) in s[..b.nv].iter().enumerate().skip(b.lo) {
        let w = (sp - state.0).exp();
        sum += w;
        for (a, &v) in acc.iter_mut().zip(&b.v[p * hd..][..hd]) {
            *a += w * v;
        }
    }
    state.1 += sum;
}

/// `x[i] = exp(x[i])` with the kernel's own exp (exposed so tests can check its accuracy): on
/// AVX2 a vectorized range reduction and polynomial, within 2 ulp of the exact result; portable
/// uses `f32::exp`.
pub fn exp_in_place(backend: Backend, x: &mut [f32]) {
    assert!(
        backend.is_available(),
        "{backend:?} is not supported by this CPU"
    );
    match backend.float_path() {
        // SAFETY: AVX2/FMA checked available.
        #[cfg(target_arch = "x86_64")]
        Backend::Avx2 => unsafe { x86::exp_slice(x) },
        _ => x.iter_mut().for_each(|v| *v = v.exp()),
    }
}

#[cfg(target_arch = "x86_64")]
mod x86;

//! Activation quantization (Q8_0, Q8_1, Q8_K) and the per-element dot formulas (those of the
//! types added later, and the dispatch over all, in `dots`), portable; the SIMD kernels are tested
//! bit-equal against these. The K-quant formulas but Q4_K's, Q5_K's and Q6_K's do exactly the
//! float operations of ggml's AVX2 code; Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K do not (below).
//!
//! The K-quant dots have ggml's shape: an exact integer dot per 4-element group, summed into 8
//! i32 "lanes" (lane `l` holds elements `4l..4l+4` of every 32), then
//! `acc[l] = fma(d_w * d_x, lanes[l], acc[l])` in f32 per block, and at the end ggml's
//! `hsum_float_8(acc)` plus any scalar correction term. Q4_0, Q4_1 and Q8_0 ([`dot_q32`]),
//! Q4_K ([`dot_q4k`]), Q5_K and Q6_K take the whole block's exact integers and FMAs per block
//! instead, the shape a repacked panel of 8 weight rows computes in its lanes. The integer part is exact, so
//! any evaluation order gives the same values; the float part is fixed here and in `avx2*`.

use crate::WType;
use crate::dequant::{KVALUES_IQ4NL, f16_at, q5_level, q6k_at, scale_min_k4, u32_at};

/// Elements per Q8_0/Q8_1 block.
pub const QK8: usize = 32;
/// Elements per Q8_K block.
pub const QK_K: usize = 256;

/// The activation format a weight type is dotted with (ggml's `vec_dot_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActType {
    /// Not quantized (f32/f16/bf16 weights).
    #[default]
    F32,
    Q8_0,
    Q8_1,
    Q8K,
}

impl ActType {
    pub fn for_weight(ty: WType) -> Self {
        match ty {
            WType::F32 | WType::F16 | WType::BF16 => Self::F32,
            WType::Q4_0 | WType::Q8_0 | WType::Q5_0 | WType::IQ4NL | WType::MXFP4 => Self::Q8_0,
            WType::Q4_1 | WType::Q5_1 => Self::Q8_1,
            WType::Q4K | WType::Q5K | WType::Q6K | WType::Q2K | WType::Q3K | WType::IQ4XS => {
                Self::Q8K
            }
        }
    }
    pub fn block_size(self) -> usize {
        match self {
            Self::F32 => 1,
            Self::Q8_0 | Self::Q8_1 => QK8,
            Self::Q8K => QK_K,
        }
    }
}

/// `m` rows of `k` quantized activations, struct-of-arrays (row `i`'s quants at `i * k`, its
/// block `b`'s scale at `i * (k / block) + b`).
#[derive(Debug, Default, Clone)]
pub struct QActs {
    pub ty: ActType,
    pub m: usize,
    pub k: usize,
    pub qs: Vec<i8>,
    /// The scale as the dot uses it: f16-rounded for Q8_0/Q8_1 (ggml stores f16), f32 for Q8_K.
    pub d: Vec<f32>,
    /// Q8_1 only: f16-rounded `d * sum(qs)` (ggml's `s`).
    pub s: Vec<f32>,
    /// Q8_K only: sums of each 16 quants.
    pub bsums: Vec<i16>,
    /// Q8_0/Q8_1: each block's integer sum of its quants (the batched tiles take it off dots
    /// whose weight bytes sit above the weights' values).
    pub sums: Vec<i32>,
}

impl QActs {
    /// Sizes the buffers for `m` rows of `k` (reusing their capacity).
    pub fn reset(&mut self, ty: ActType, m: usize, k: usize) {
        let nb = k / ty.block_size();
        self.ty = ty;
        self.m = m;
        self.k = k;
        self.qs.resize(m * k, 0);
        self.d.resize(m * nb, 0.0);
        self.s
            .resize(if ty == ActType::Q8_1 { m * nb } else { 0 }, 0.0);
        self.bsums
            .resize(if ty == ActType::Q8K { m * nb * 16 } else { 0 }, 0);
        let q8 = matches!(ty, ActType::Q8_0 | ActType::Q8_1);
        self.sums.resize(if q8 { m * nb } else { 0 }, 0);
    }

    /// Blocks per row.
    pub fn nb(&self) -> usize {
        self.k / self.ty.block_size()
    }

    /// Row `i`'s blocks in ggml's byte layout (`block_q8_0`, `block_q8_1` or `block_q8_K`),
    /// for comparing with other implementations.
    pub fn row_ggml_bytes(&self, i: usize) -> Vec<u8> {
        let nb = self.nb();
        let bs = self.ty.block_size();
        let mut out = Vec::new();
        for b in 0..nb {
            let row = i * nb + b;
            let qs = &self.qs[i * self.k + b * bs..i * self.k + (b + 1) * bs];
            match self.ty {
                ActType::F32 => {}
                ActType::Q8_0 | ActType::Q8_1 => {
                    out.extend(half::f16::from_f32(self.d[row]).to_le_bytes());
                    if self.ty == ActType::Q8_1 {
                        out.extend(half::f16::from_f32(self.s[row]).to_le_bytes());
                    }
                    out.extend(qs.iter().map(|&q| q as u8));
                }
                ActType::Q8K => {
                    out.extend(self.d[row].to_le_bytes());
                    out.extend(qs.iter().map(|&q| q as u8));
                    for s in &self.bsums[row * 16..row * 16 + 16] {
                        out.extend(s.to_le_bytes());
                    }
                }
            }
        }
        out
    }
}

/// f32 -> f16 -> f32, as storing a scale in a ggml f16 field does.
pub(crate) fn round_f16(x: f32) -> f32 {
    half::f16::from_f32(x).to_f32()
}

/// One Q8_0/Q8_1 block as ggml's AVX2 `quantize_row_q8_0/1` does it: `d = amax / 127`,
/// `q = round_half_even(x * (127 / amax))`. Returns (d unrounded, sum of the quants).
pub(crate) fn quantize_block_q8(x: &[f32], qs: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let mut sum = 0;
    for (q, &v) in qs.iter_mut().zip(x) {
        let r = (v * id).round_ties_even() as i32;
        *q = r as i8;
        sum += r;
    }
    (d, sum)
}

/// One Q8_K block as ggml's `quantize_row_q8_K_ref` (the x86 path too): the scale comes from
/// the signed value of largest magnitude, `d = 1 / (-127 / max)`, ggml's `nearest_int` rounds
/// half to even. Inlined, so the AVX2 quantizer's copy rounds with `vroundps` instead of calling
/// libm's `rintf` per element (the same values).
#[inline(always)]
pub(crate) fn quantize_block_q8k(x: &[f32], qs: &mut [i8], bsums: &mut [i16]) -> f32 {
    let (max, amax) = crate::quantize_lowbit::signed_absmax(x);
    if amax == 0.0 {
        qs.fill(0);
        bsums.fill(0);
        return 0.0;
    }
    let iscale = -127.0 / max;
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = ((iscale * v).round_ties_even() as i32).min(127) as i8;
    }
    for (s, c) in bsums.iter_mut().zip(qs.chunks_exact(16)) {
        *s = c.iter().map(|&q| q as i16).sum();
    }
    1.0 / iscale
}

/// Quantizes rows `rows` of `x` (each `out.k` long) into `out` (already `reset`), portably.
#[inline(always)]
pub(crate) fn quantize_rows_portable(x: &[f32], out: &mut QActsRows<'_>) {
    let k = out.k;
    let bs = out.ty.block_size();
    let nb = k / bs;
    for (i, xr) in x.chunks_exact(k).enumerate() {
        for b in 0..nb {
            let xb = &xr[b * bs..(b + 1) * bs];
            let qs = &mut out.qs[i * k + b * bs..i * k + (b + 1) * bs];
            let row = i * nb + b;
            match out.ty {
                ActType::F32 => {}
                ActType::Q8_0 | ActType::Q8_1 => {
                    let (d, sum) = quantize_block_q8(xb, qs);
                    out.d[row] = round_f16(d);
                    out.sums[row] = sum;
                    if out.ty == ActType::Q8_1 {
                        out.s[row] = round_f16(d * sum as f32);
                    }
                }
                ActType::Q8K => {
                    let bsums = &mut out.bsums[row * 16..row * 16 + 16];
                    out.d[row] = quantize_block_q8k(xb, qs, bsums);
                }
            }
        }
    }
}

/// Mutable views of a row range of a [`QActs`] (so threads can quantize disjoint rows).
pub(crate) struct QActsRows<'a> {
    pub ty: ActType,
    pub k: usize,
    pub qs: &'a mut [i8],
    pub d: &'a mut [f32],
    pub s: &'a mut [f32],
    pub bsums: &'a mut [i16],
    pub sums: &'a mut [i32],
}

impl QActs {
    /// Views of rows `lo..hi`.
    pub(crate) fn rows_mut(&mut self, lo: usize, hi: usize) -> QActsRows<'_> {
        let nb = self.nb();
        let (s_lo, s_hi) = if self.s.is_empty() {
            (0, 0)
        } else {
            (lo * nb, hi * nb)
        };
        let (b_lo, b_hi) = if self.bsums.is_empty() {
            (0, 0)
        } else {
            (lo * nb * 16, hi * nb * 16)
        };
        let (q_lo, q_hi) = if self.sums.is_empty() {
            (0, 0)
        } else {
            (lo * nb, hi * nb)
        };
        QActsRows {
            ty: self.ty,
            k: self.k,
            qs: &mut self.qs[lo * self.k..hi * self.k],
            d: &mut self.d[lo * nb..hi * nb],
            s: &mut self.s[s_lo..s_hi],
            bsums: &mut self.bsums[b_lo..b_hi],
            sums: &mut self.sums[q_lo..q_hi],
        }
    }
}

/// ggml's `hsum_float_8`: fold the high 4 lanes onto the low, then (0+2)+(1+3).
#[inline(always)]
pub(crate) fn hsum8(a: [f32; 8]) -> f32 {
    let r = [a[4] + a[0], a[5] + a[1], a[6] + a[2], a[7] + a[3]];
    (r[0] + r[2]) + (r[1] + r[3])
}

/// One quantized activation row, as the dot formulas read it.
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub s: &'a [f32],
    pub bsums: &'a [i16],
}

impl QActs {
    pub(crate) fn row(&self, i: usize) -> ActRow<'_> {
        let nb = self.nb();
        ActRow {
            qs: &self.qs[i * self.k..(i + 1) * self.k],
            d: &self.d[i * nb..(i + 1) * nb],
            s: if self.s.is_empty() {
                &[]
            } else {
                &self.s[i * nb..(i + 1) * nb]
            },
            bsums: if self.bsums.is_empty() {
                &[]
            } else {
                &self.bsums[i * nb * 16..(i + 1) * nb * 16]
            },
        }
    }
}

/// The types of 32-element blocks with one f16 scale (and Q4_1's and Q5_1's f16 min) against
/// Q8_0 / Q8_1 activations, over a row: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1 and IQ4_NL. Per block the
/// exact integer dot, then `acc = fma(d_w * d_x, dot, acc)` in block order, and the mins'
/// `summs` chain added at the end. Not ggml's 8-lane sum (the other types keep that): one float
/// multiply-add per block is what lets the batched tiles (`x86::panel32`) reach the integer-dot
/// rate, and every tile of every path does these same operations.
#[inline(always)]
pub(crate) fn dot_q32(ty: WType, w: &[u8], x: ActRow<'_>) -> f32 {
    let ts = ty.type_size();
    let mut acc = 0f32;
    let mut summs = 0f32;
    for (b, blk) in w.chunks_exact(ts).enumerate() {
        let xq = &x.qs[b * QK8..(b + 1) * QK8];
        let mut dot = 0i32;
        match ty {
            WType::Q4_0 => {
                for j in 0..16 {
                    dot += ((blk[2 + j] & 0x0f) as i32 - 8) * xq[j] as i32;
                    dot += ((blk[2 + j] >> 4) as i32 - 8) * xq[16 + j] as i32;
                }
            }
            WType::Q4_1 => {
                for j in 0..16 {
                    dot += (blk[4 + j] & 0x0f) as i32 * xq[j] as i32;
                    dot += (blk[4 + j] >> 4) as i32 * xq[16 + j] as i32;
                }
                summs = f16_at(blk, 2).mul_add(x.s[b], summs);
            }
            WType::Q5_0 => {
                let (qh, qs) = (u32_at(blk, 2), &blk[6..22]);
                for (j, &xe) in xq.iter().enumerate() {
                    dot += (q5_level(qh, qs, j) as i32 - 16) * xe as i32;
                }
            }
            WType::Q5_1 => {
                let (qh, qs) = (u32_at(blk, 4), &blk[8..24]);
                for (j, &xe) in xq.iter().enumerate() {
                    dot += q5_level(qh, qs, j) as i32 * xe as i32;
                }
                summs = f16_at(blk, 2).mul_add(x.s[b], summs);
            }
            WType::IQ4NL => {
                for j in 0..16 {
                    dot += KVALUES_IQ4NL[(blk[2 + j] & 0x0f) as usize] as i32 * xq[j] as i32;
                    dot += KVALUES_IQ4NL[(blk[2 + j] >> 4) as usize] as i32 * xq[16 + j] as i32;
                }
            }
            _ => {
                for j in 0..32 {
                    dot += (blk[2 + j] as i8) as i32 * xq[j] as i32;
                }
            }
        }
        let dd = f16_at(blk, 0) * x.d[b];
        acc = dd.mul_add(dot as f32, acc);
    }
    if matches!(ty, WType::Q4_1 | WType::Q5_1) {
        acc + summs
    } else {
        acc
    }
}

/// Q4_K x Q8_K over a row. Not ggml's lane-split float sum: per block two exact integers,
/// `isum = sum_s sc_s * dot_s` (the sub-blocks' 6-bit scales times their integer dots) and
/// `imin = sum_s m_s * (bsum_2s + bsum_2s+1)`, then two FMAs into one f32 accumulator,
/// `acc = fma(d_x * d, isum, acc)` and `acc = fma(-(d_x * dmin), imin, acc)`. A dot that keeps
/// the 8 rows of a repacked panel in one vector's lanes (`x86::panel_k`) does the same float
/// operations as one row alone, so decode and batches give the same bits. Both integers are
/// exact (`|isum| <= 8 * 63 * 32 * 15 * 128`, under 2^31).
#[inline(always)]
pub(crate) fn dot_q4k(w: &[u8], x: ActRow<'_>) -> f32 {
    dot_k4(w, 144, x, |blk, e| {
        let q = blk[16 + 32 * (e / 64) + e % 32];
        (if e % 64 < 32 { q & 0x0f } else { q >> 4 }) as i32
    })
}

/// Q5_K x Q8_K over a row, in [`dot_q4k`]'s shape with 5-bit levels (the fifth bit from `qh`):
/// per block the exact `isum` and `imin`, then two FMAs.
#[inline(always)]
pub(crate) fn dot_q5k(w: &[u8], x: ActRow<'_>) -> f32 {
    dot_k4(w, 176, x, |blk, e| {
        let (g, l) = (e / 64, e % 32);
        let q = blk[48 + 32 * g + l];
        let hi = e % 64 >= 32;
        let nib = if hi { q >> 4 } else { q & 0x0f };
        let bit = (blk[16 + l] >> (2 * g + hi as usize)) & 1;
        (nib + 16 * bit) as i32
    })
}

/// The shape [`dot_q4k`] describes, for Q4_K and Q5_K rows of `ts`-byte blocks (`d`, `dmin`
/// and the 12 scale bytes first) whose element `e` of a block has level `level(blk, e)`.
#[inline(always)]
fn dot_k4(w: &[u8], ts: usize, x: ActRow<'_>, level: impl Fn(&[u8], usize) -> i32) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(ts).enumerate() {
        let xq = &x.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &x.bsums[b * 16..b * 16 + 16];
        let d = x.d[b] * f16_at(blk, 0);
        let dmin = x.d[b] * f16_at(blk, 2);
        let (mut isum, mut imin) = (0i32, 0i32);
        for s in 0..8 {
            let (sc, m) = scale_min_k4(s, &blk[4..16]);
            let dot: i32 = (32 * s..32 * s + 32)
                .map(|e| level(blk, e) * xq[e] as i32)
                .sum();
            isum += sc as i32 * dot;
            imin += m as i32 * (bsums[2 * s] as i32 + bsums[2 * s + 1] as i32);
        }
        acc = d.mul_add(isum as f32, acc);
        acc = (-dmin).mul_add(imin as f32, acc);
    }
    acc
}

/// Q6_K x Q8_K over a row, in [`dot_q4k`]'s shape: the levels are dotted unsigned (0..63), the
/// offset of 32 comes off as `32 * sum_s bsums[s] * sc[s]`, all in one exact integer per block
/// (`|isum| <= 16 * 128 * (16 * 63 * 128 + 32 * 2048)`, under 2^31), then one FMA per block.
#[inline(always)]
pub(crate) fn dot_q6k(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(210).enumerate() {
        let xq = &x.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &x.bsums[b * 16..b * 16 + 16];
        let d = x.d[b] * f16_at(blk, 208);
        let sc = |i: usize| (blk[192 + i] as i8) as i32;
        let mut isum = 0i32;
        for (e, &xe) in xq.iter().enumerate() {
            let (q, is) = q6k_at(blk, e);
            isum += sc(is) * (q + 32) * xe as i32;
        }
        for (s, &bs) in bsums.iter().enumerate() {
            isum -= 32 * bs as i32 * sc(s);
        }
        acc = d.mul_add(isum as f32, acc);
    }
    acc
}

/// Plain f32 dot for float weights (`w` already converted): 8 FMA lanes, [`hsum8`], then the
/// tail in order.
#[inline(always)]
pub(crate) fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (xc, xt) = x.as_chunks::<8>();
    let (wc, wt) = w.as_chunks::<8>();
    for (xs, ws) in xc.iter().zip(wc) {
        for l in 0..8 {
            acc[l] = xs[l].mul_add(ws[l], acc[l]);
        }
    }
    let mut s = hsum8(acc);
    for (&a, &b) in xt.iter().zip(wt) {
        s = a.mul_add(b, s);
    }
    s
}

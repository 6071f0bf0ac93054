//! The portable dot of any quantized weight row with its activations ([`dot_row`], over the
//! formulas of `quant` and those here), and the formulas of Q2_K, Q3_K, IQ4_XS and MXFP4 weight
//! rows with quantized activations, doing exactly the float operations of ggml's AVX2 code
//! (`ggml_vec_dot_*` in ggml-cpu/arch/x86/quants.c), in the shape `quant` describes: exact
//! integer lanes (lane `l` holds elements `4l..4l+4` of every 32), one f32 FMA per lane and
//! block, ggml's `hsum_float_8` at the end.

use crate::WType;
use crate::dequant::{
    KVALUES_IQ4NL, KVALUES_MXFP4, e8m0_half, f16_at, iq4xs_scale, k_low2, q3k_level, q3k_scales,
};
use crate::quant::{self, ActRow, QK_K, QK8, hsum8};

/// Dot of one weight row (ggml bytes) with one activation row, portably; the AVX2 kernels
/// produce bit-identical results.
pub(crate) fn dot_row(ty: WType, w: &[u8], x: ActRow<'_>) -> f32 {
    match ty {
        WType::Q4_0 | WType::Q4_1 | WType::Q8_0 | WType::Q5_0 | WType::Q5_1 | WType::IQ4NL => {
            quant::dot_q32(ty, w, x)
        }
        WType::Q4K => quant::dot_q4k(w, x),
        WType::Q5K => quant::dot_q5k(w, x),
        WType::Q6K => quant::dot_q6k(w, x),
        WType::Q2K => dot_q2k(w, x),
        WType::Q3K => dot_q3k(w, x),
        WType::MXFP4 => dot_grid4(&MXFP4_GRID, w, x),
        WType::IQ4XS => dot_iq4xs(w, x),
        WType::F32 | WType::F16 | WType::BF16 => unreachable!("float weights take the f32 path"),
    }
}

/// Q2_K x Q8_K over a row, in `quant::dot_q4k`'s shape: per block the exact integers of the
/// scaled levels (`isum`) and of the mins against the activation's 16-element sums (`imin`),
/// then two FMAs (so that a row packed 8 at a time, whose lanes are rows, gives the same bits).
#[inline(always)]
pub(crate) fn dot_q2k(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(84).enumerate() {
        let xq = &x.qs[b * QK_K..(b + 1) * QK_K];
        let bsums = &x.bsums[b * 16..b * 16 + 16];
        let (scales, qs) = (&blk[..16], &blk[16..80]);
        let d = x.d[b] * f16_at(blk, 80);
        let dmin = x.d[b] * f16_at(blk, 82);
        let isum: i32 = xq
            .iter()
            .enumerate()
            .map(|(e, &xe)| (scales[e / 16] & 0xf) as i32 * k_low2(qs, e) as i32 * xe as i32)
            .sum();
        let imin: i32 = (0..16)
            .map(|s| (scales[s] >> 4) as i32 * bsums[s] as i32)
            .sum();
        acc = d.mul_add(isum as f32, acc);
        acc = (-dmin).mul_add(imin as f32, acc);
    }
    acc
}

/// Q3_K x Q8_K over a row: signed 3-bit levels times their sub-block's signed 6-bit scale,
/// summed exactly over the block, one FMA per block (as the K-quants, so that a row packed 8 at
/// a time, whose lanes are rows, gives the same bits).
#[inline(always)]
pub(crate) fn dot_q3k(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(110).enumerate() {
        let xq = &x.qs[b * QK_K..(b + 1) * QK_K];
        let (hmask, qs) = (&blk[..32], &blk[32..96]);
        let scales = q3k_scales(&blk[96..108]);
        let d = x.d[b] * f16_at(blk, 108);
        let isum: i32 = xq
            .iter()
            .enumerate()
            .map(|(e, &xe)| scales[e / 16] as i32 * q3k_level(hmask, qs, e) * xe as i32)
            .sum();
        acc = d.mul_add(isum as f32, acc);
    }
    acc
}

/// A 32-element block type of one scale and 16 bytes of 4-bit indices into a 16-value grid:
/// MXFP4 (an e8m0 scale, `kvalues_mxfp4`), whose dot with Q8_0 activations is ggml's
/// `ggml_vec_dot_mxfp4_q8_0` (IQ4_NL, of the same shape with an f16 scale, takes `quant`'s
/// one-FMA-per-block formula instead, as the other f16-scaled 32-element types do).
pub(crate) struct Grid4 {
    /// Bytes per block.
    pub ts: usize,
    /// Where the 16 bytes of indices start.
    pub qs: usize,
    pub values: &'static [i8; 16],
}

impl Grid4 {
    /// The scale of block `blk`: its e8m0 exponent in byte 0, halved.
    #[inline(always)]
    pub fn scale(&self, blk: &[u8]) -> f32 {
        e8m0_half(blk[0])
    }
}

pub(crate) const MXFP4_GRID: Grid4 = Grid4 {
    ts: 17,
    qs: 1,
    values: &KVALUES_MXFP4,
};

/// The exact integer lanes of 32 grid values (indices in 16 bytes, low nibbles first) times
/// 32 activations.
#[inline(always)]
pub(crate) fn grid4_lanes(grid: &[i8; 16], qs: &[u8], xq: &[i8]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for j in 0..16 {
        lanes[j / 4] += grid[(qs[j] & 0xf) as usize] as i32 * xq[j] as i32;
        lanes[4 + j / 4] += grid[(qs[j] >> 4) as usize] as i32 * xq[16 + j] as i32;
    }
    lanes
}

/// MXFP4 x Q8_0 over a row (ggml `ggml_vec_dot_mxfp4_q8_0`, AVX2): blocks in pairs, even blocks into one accumulator and odd
/// into another, `hsum8(acc1 + acc2)`; an odd last block is added as a scalar
/// `sumf += d * sumi` (contracted to an FMA). The scale is `d_x * d_w`.
#[inline(always)]
pub(crate) fn dot_grid4(g: &Grid4, w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = [[0f32; 8]; 2];
    let nb = w.len() / g.ts;
    let pairs = nb / 2 * 2;
    for (b, blk) in w.chunks_exact(g.ts).take(pairs).enumerate() {
        let lanes = grid4_lanes(
            g.values,
            &blk[g.qs..g.qs + 16],
            &x.qs[b * QK8..(b + 1) * QK8],
        );
        let dd = x.d[b] * g.scale(blk);
        for (a, &l) in acc[b % 2].iter_mut().zip(&lanes) {
            *a = dd.mul_add(l as f32, *a);
        }
    }
    let mut sumf = hsum8(std::array::from_fn(|l| acc[0][l] + acc[1][l]));
    if pairs < nb {
        let b = pairs;
        let blk = &w[g.ts * b..g.ts * (b + 1)];
        let sumi: i32 = grid4_lanes(
            g.values,
            &blk[g.qs..g.qs + 16],
            &x.qs[b * QK8..(b + 1) * QK8],
        )
        .iter()
        .sum();
        sumf = (x.d[b] * g.scale(blk)).mul_add(sumi as f32, sumf);
    }
    sumf
}

/// IQ4_XS x Q8_K over a row (ggml `ggml_vec_dot_iq4_xs_q8_K`'s integers): per 32 elements the
/// grid values times the signed 6-bit scale, summed exactly over the block, then one FMA per
/// block with `d_w * d_x` (one accumulator, as the K-quants: a row's bits are the same whether
/// its lanes are a row's sub-blocks, in place, or 8 rows, packed).
#[inline(always)]
pub(crate) fn dot_iq4xs(w: &[u8], x: ActRow<'_>) -> f32 {
    let mut acc = 0f32;
    for (b, blk) in w.chunks_exact(136).enumerate() {
        let mut sumi = 0i32;
        for ib in 0..8 {
            let ls = iq4xs_scale(blk, ib) - 32;
            let xq = &x.qs[b * QK_K + 32 * ib..b * QK_K + 32 * ib + 32];
            let lanes = grid4_lanes(&KVALUES_IQ4NL, &blk[8 + 16 * ib..24 + 16 * ib], xq);
            sumi += ls * lanes.iter().sum::<i32>();
        }
        let d = f16_at(blk, 0) * x.d[b];
        acc = d.mul_add(sumi as f32, acc);
    }
    acc
}

//! Dequantization of one row of weight blocks (ggml layouts) to f32: the plain reference.

use crate::WType;

pub(crate) fn f16_at(b: &[u8], i: usize) -> f32 {
    half::f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

/// Scale and min of sub-block `j` (0..8) of a Q4_K block, from its 12 packed bytes
/// (ggml's `get_scale_min_k4`).
pub(crate) fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// Dequantizes one row (`out.len()` elements) of type `ty` from `data`.
pub fn dequantize_row(ty: WType, data: &[u8], out: &mut [f32]) {
    let bs = ty.block_size();
    let ts = ty.type_size();
    assert_eq!(
        out.len() % bs,
        0,
        "row length {} is not a multiple of {bs}",
        out.len()
    );
    for (b, chunk) in out.chunks_mut(bs).enumerate() {
        let blk = &data[b * ts..(b + 1) * ts];
        match ty {
            WType::F32 => chunk[0] = f32::from_le_bytes([blk[0], blk[1], blk[2], blk[3]]),
            WType::F16 => chunk[0] = f16_at(blk, 0),
            WType::BF16 => chunk[0] = half::bf16::from_le_bytes([blk[0], blk[1]]).to_f32(),
            WType::Q4_0 => {
                let d = f16_at(blk, 0);
                for j in 0..16 {
                    chunk[j] = d * ((blk[2 + j] & 0x0f) as f32 - 8.0);
                    chunk[j + 16] = d * ((blk[2 + j] >> 4) as f32 - 8.0);
                }
            }
            WType::Q4_1 => {
                let d = f16_at(blk, 0);
                let m = f16_at(blk, 2);
                for j in 0..16 {
                    chunk[j] = d * (blk[4 + j] & 0x0f) as f32 + m;
                    chunk[j + 16] = d * (blk[4 + j] >> 4) as f32 + m;
                }
            }
            WType::Q8_0 => {
                let d = f16_at(blk, 0);
                for j in 0..32 {
                    chunk[j] = d * (blk[2 + j] as i8) as f32;
                }
            }
            WType::Q4K => dequantize_q4k(blk, chunk),
            WType::Q5K => dequantize_q5k(blk, chunk),
            WType::Q6K => dequantize_q6k(blk, chunk),
            WType::Q5_0 | WType::Q5_1 => dequantize_q5(ty, blk, chunk),
            WType::Q2K => dequantize_q2k(blk, chunk),
            WType::Q3K => dequantize_q3k(blk, chunk),
            WType::IQ4NL => dequantize_grid4(&KVALUES_IQ4NL, f16_at(blk, 0), &blk[2..18], chunk),
            WType::MXFP4 => dequantize_grid4(&KVALUES_MXFP4, e8m0_half(blk[0]), &blk[1..17], chunk),
            WType::IQ4XS => dequantize_iq4xs(blk, chunk),
        }
    }
}

// ggml dequantize_row_q4_K: 4 groups of 64, each 32 bytes of nibbles (low half then high half).
fn dequantize_q4k(blk: &[u8], out: &mut [f32]) {
    let d = f16_at(blk, 0);
    let dmin = f16_at(blk, 2);
    let scales = &blk[4..16];
    let qs = &blk[16..144];
    for g in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * g..32 * g + 32];
        for l in 0..32 {
            out[64 * g + l] = d1 * (q[l] & 0x0f) as f32 - m1;
            out[64 * g + 32 + l] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

// ggml dequantize_row_q5_K: as Q4_K, each nibble gaining a fifth bit from `qh` (bit 2g for the
// low half of group g, 2g + 1 for the high half).
fn dequantize_q5k(blk: &[u8], out: &mut [f32]) {
    let d = f16_at(blk, 0);
    let dmin = f16_at(blk, 2);
    let scales = &blk[4..16];
    let qh = &blk[16..48];
    let qs = &blk[48..176];
    for g in 0..4 {
        let (sc1, m1) = scale_min_k4(2 * g, scales);
        let (sc2, m2) = scale_min_k4(2 * g + 1, scales);
        let (d1, m1) = (d * sc1 as f32, dmin * m1 as f32);
        let (d2, m2) = (d * sc2 as f32, dmin * m2 as f32);
        let q = &qs[32 * g..32 * g + 32];
        let (u1, u2) = (1u8 << (2 * g), 2u8 << (2 * g));
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            out[64 * g + l] = d1 * ((q[l] & 0x0f) + h1) as f32 - m1;
            out[64 * g + 32 + l] = d2 * ((q[l] >> 4) + h2) as f32 - m2;
        }
    }
}

/// The signed 6-bit value of element `e` (0..256) of a Q6_K block, and its scale index.
pub(crate) fn q6k_at(blk: &[u8], e: usize) -> (i32, usize) {
    let (h, r) = (e / 128, e % 128);
    let (quarter, l) = (r / 32, r % 32);
    let ql = &blk[64 * h..64 * h + 64];
    let qh = blk[128 + 32 * h + l];
    let lo = match quarter {
        0 => ql[l] & 0x0f,
        1 => ql[32 + l] & 0x0f,
        2 => ql[l] >> 4,
        _ => ql[32 + l] >> 4,
    };
    let hi = (qh >> (2 * quarter)) & 3;
    ((lo | (hi << 4)) as i32 - 32, 8 * h + 2 * quarter + l / 16)
}

// ggml dequantize_row_q6_K.
fn dequantize_q6k(blk: &[u8], out: &mut [f32]) {
    let d = f16_at(blk, 208);
    for (e, o) in out.iter_mut().enumerate() {
        let (q, is) = q6k_at(blk, e);
        *o = d * (blk[192 + is] as i8) as f32 * q as f32;
    }
}

/// The 5-bit level of element `j` (0..32) of a Q5_0 / Q5_1 block: low nibble from `qs`
/// (elements 16.. in the high nibbles), fifth bit `j` of the little-endian `qh` word.
#[inline(always)]
pub(crate) fn q5_level(qh: u32, qs: &[u8], j: usize) -> u8 {
    let lo = if j < 16 {
        qs[j] & 0x0f
    } else {
        qs[j - 16] >> 4
    };
    lo | ((((qh >> j) & 1) as u8) << 4)
}

pub(crate) fn u32_at(b: &[u8], i: usize) -> u32 {
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

// ggml dequantize_row_q5_0 (d * (q - 16)) / dequantize_row_q5_1 (q * d + m).
fn dequantize_q5(ty: WType, blk: &[u8], out: &mut [f32]) {
    let d = f16_at(blk, 0);
    if ty == WType::Q5_0 {
        let (qh, qs) = (u32_at(blk, 2), &blk[6..22]);
        for (j, o) in out.iter_mut().enumerate() {
            *o = (q5_level(qh, qs, j) as i32 - 16) as f32 * d;
        }
    } else {
        let m = f16_at(blk, 2);
        let (qh, qs) = (u32_at(blk, 4), &blk[8..24]);
        for (j, o) in out.iter_mut().enumerate() {
            *o = q5_level(qh, qs, j) as f32 * d + m;
        }
    }
}

/// The 2-bit level of element `e` (0..256) of a Q2_K / Q3_K `qs` array (64 bytes): byte
/// `32 * (e / 128) + e % 32`, bits `2 * ((e % 128) / 32)`.
#[inline(always)]
pub(crate) fn k_low2(qs: &[u8], e: usize) -> u8 {
    (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3
}

// ggml dequantize_row_q2_K: per 16 elements, dl = d * (sc & 15) and ml = dmin * (sc >> 4);
// x = dl * q - ml.
fn dequantize_q2k(blk: &[u8], out: &mut [f32]) {
    let (scales, qs) = (&blk[..16], &blk[16..80]);
    let (d, dmin) = (f16_at(blk, 80), f16_at(blk, 82));
    for (e, o) in out.iter_mut().enumerate() {
        let sc = scales[e / 16];
        let (dl, ml) = (d * (sc & 0xf) as f32, dmin * (sc >> 4) as f32);
        *o = dl * k_low2(qs, e) as f32 - ml;
    }
}

/// The 16 signed 6-bit scales of a Q3_K block from its 12 packed bytes (low nibbles in bytes
/// 0..8, two high bits each in bytes 8..12), minus 32: ggml's `aux` unpacking.
pub(crate) fn q3k_scales(sc: &[u8]) -> [i8; 16] {
    std::array::from_fn(|j| {
        let lo = if j < 8 { sc[j] & 0xf } else { sc[j - 8] >> 4 };
        let hi = (sc[8 + j % 4] >> (2 * (j / 4))) & 3;
        (lo | (hi << 4)) as i8 - 32
    })
}

/// The signed 3-bit level (-4..=3) of element `e` of a Q3_K block: the 2 low bits, minus 4
/// when its bit in `hmask` (byte `e % 32`, bit `e / 32`) is clear.
#[inline(always)]
pub(crate) fn q3k_level(hmask: &[u8], qs: &[u8], e: usize) -> i32 {
    let high = (hmask[e % 32] >> (e / 32)) & 1;
    k_low2(qs, e) as i32 - if high != 0 { 0 } else { 4 }
}

// ggml dequantize_row_q3_K: x = (d * (scale - 32)) * level.
fn dequantize_q3k(blk: &[u8], out: &mut [f32]) {
    let (hmask, qs) = (&blk[..32], &blk[32..96]);
    let scales = q3k_scales(&blk[96..108]);
    let d = f16_at(blk, 108);
    for (e, o) in out.iter_mut().enumerate() {
        let dl = d * scales[e / 16] as f32;
        *o = dl * q3k_level(hmask, qs, e) as f32;
    }
}

/// ggml's `kvalues_iq4nl`: the non-linear 4-bit grid of IQ4_NL and IQ4_XS.
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// ggml's `kvalues_mxfp4`: the e2m1 values (0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives)
/// doubled, so they are integers; [`e8m0_half`] halves the scale to match.
pub(crate) const KVALUES_MXFP4: [i8; 16] =
    [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An e8m0 scale byte as f32, halved (ggml's `ggml_e8m0_to_fp32_half`): `2^(e - 128)`, the two
/// lowest exponents as subnormals.
#[inline(always)]
pub(crate) fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        u32::from(e - 1) << 23
    };
    f32::from_bits(bits)
}

/// 32 elements from 16 bytes of 4-bit indices into `grid` (low nibbles first) at scale `d`:
/// IQ4_NL and MXFP4.
fn dequantize_grid4(grid: &[i8; 16], d: f32, qs: &[u8], out: &mut [f32]) {
    for j in 0..16 {
        out[j] = d * grid[(qs[j] & 0xf) as usize] as f32;
        out[j + 16] = d * grid[(qs[j] >> 4) as usize] as f32;
    }
}

/// The 6-bit scale (0..64, before the -32) of sub-block `ib` (0..8) of an IQ4_XS block.
#[inline(always)]
pub(crate) fn iq4xs_scale(blk: &[u8], ib: usize) -> i32 {
    let sh = u16::from_le_bytes([blk[2], blk[3]]);
    let lo = (blk[4 + ib / 2] >> (4 * (ib % 2))) & 0xf;
    let hi = ((sh >> (2 * ib)) & 3) as u8;
    (lo | (hi << 4)) as i32
}

// ggml dequantize_row_iq4_xs: per 32 elements dl = d * (ls - 32), then as IQ4_NL.
fn dequantize_iq4xs(blk: &[u8], out: &mut [f32]) {
    let d = f16_at(blk, 0);
    for (ib, o) in out.chunks_exact_mut(32).enumerate() {
        let dl = d * (iq4xs_scale(blk, ib) - 32) as f32;
        dequantize_grid4(&KVALUES_IQ4NL, dl, &blk[8 + 16 * ib..24 + 16 * ib], o);
    }
}

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

//! Weight quantization: f32 rows to ggml block bytes (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1, Q2_K, Q4_K, Q5_K, Q6_K here; Q3_K, IQ4_NL, IQ4_XS and MXFP4 in `quantize_lowbit`), doing exactly the float operations of ggml's reference quantizers
//! (`quantize_row_*_ref` in ggml-quants.c, which `llama-quantize` uses when no importance matrix
//! is given), so a file we write has the bytes llama.cpp would write.
//!
//! Two details matter for byte equality: ggml's `nearest_int` rounds half to even (the
//! 1.5 * 2^23 trick) while Q8_0 uses C's `roundf` (half away from zero); and no operation may be
//! fused into an FMA (ggml-quants.c is built without contraction on x86-64's baseline).

use crate::WType;

use crate::quantize_lowbit::{
    GROUP_MAX_EPS, f16_bytes, min_max, nearest_int, pack_2bit, signed_absmax,
};

const QK_K: usize = 256;

/// Quantizes `x` (a whole number of `ty` blocks) into `out` (exactly `ty.row_bytes(x.len())`
/// bytes) as ggml's reference quantizer for `ty` does.
///
/// # Panics
/// If `x.len()` is not a multiple of the block size or `out` has the wrong length.
pub fn quantize_row(ty: WType, x: &[f32], out: &mut [u8]) {
    let bs = ty.block_size();
    assert!(
        x.len().is_multiple_of(bs),
        "row length {} is not a multiple of the {ty:?} block of {bs}",
        x.len()
    );
    assert_eq!(out.len(), ty.row_bytes(x.len()), "output size for {ty:?}");
    let ts = ty.type_size();
    match ty {
        WType::F32 => {
            for (o, v) in out.chunks_exact_mut(4).zip(x) {
                o.copy_from_slice(&v.to_le_bytes());
            }
        }
        WType::F16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&f16_bytes(*v));
            }
        }
        // Round to nearest even, NaN kept quiet: ggml's `ggml_compute_fp32_to_bf16`.
        WType::BF16 => {
            for (o, v) in out.chunks_exact_mut(2).zip(x) {
                o.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
            }
        }
        _ => {
            for (blk, xb) in out.chunks_exact_mut(ts).zip(x.chunks_exact(bs)) {
                match ty {
                    WType::Q4_0 => quantize_q4_0(xb, blk),
                    WType::Q4_1 => quantize_q4_1(xb, blk),
                    WType::Q8_0 => quantize_q8_0(xb, blk),
                    WType::Q4K => quantize_q4k(xb, blk),
                    WType::Q5K => quantize_q5k(xb, blk),
                    WType::Q6K => quantize_q6k(xb, blk),
                    WType::Q5_0 => quantize_q5_0(xb, blk),
                    WType::Q5_1 => quantize_q5_1(xb, blk),
                    WType::Q2K => quantize_q2k(xb, blk),
                    WType::Q3K => crate::quantize_lowbit::quantize_q3k(xb, blk),
                    WType::IQ4NL => crate::quantize_lowbit::quantize_iq4nl(xb, blk),
                    WType::IQ4XS => crate::quantize_lowbit::quantize_iq4xs(xb, blk),
                    WType::MXFP4 => crate::quantize_lowbit::quantize_mxfp4(xb, blk),
                    WType::F32 | WType::F16 | WType::BF16 => unreachable!("handled above"),
                }
            }
        }
    }
}

/// Quantizes `x` into a new vector (see [`quantize_row`]).
pub fn quantize(ty: WType, x: &[f32]) -> Vec<u8> {
    let mut out = vec![0u8; ty.row_bytes(x.len())];
    quantize_row(ty, x, &mut out);
    out
}

// ggml quantize_row_q4_0_ref: d = (signed value of largest magnitude) / -8, q = trunc(x/d + 8.5).
fn quantize_q4_0(x: &[f32], blk: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -8.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    blk[..2].copy_from_slice(&f16_bytes(d));
    for j in 0..16 {
        let x0 = x[j] * id;
        let x1 = x[16 + j] * id;
        let q0 = ((x0 + 8.5) as i8).min(15) as u8;
        let q1 = ((x1 + 8.5) as i8).min(15) as u8;
        blk[2 + j] = q0 | (q1 << 4);
    }
}

// ggml quantize_row_q4_1_ref: d = (max - min) / 15, m = min, q = trunc((x - min)/d + 0.5).
fn quantize_q4_1(x: &[f32], blk: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 15.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    blk[..2].copy_from_slice(&f16_bytes(d));
    blk[2..4].copy_from_slice(&f16_bytes(min));
    for j in 0..16 {
        let x0 = (x[j] - min) * id;
        let x1 = (x[16 + j] - min) * id;
        let q0 = ((x0 + 0.5) as i8).min(15) as u8;
        let q1 = ((x1 + 0.5) as i8).min(15) as u8;
        blk[4 + j] = q0 | (q1 << 4);
    }
}

// ggml quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d) (half away from zero).
fn quantize_q8_0(x: &[f32], blk: &mut [u8]) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    blk[..2].copy_from_slice(&f16_bytes(d));
    for (q, &v) in blk[2..].iter_mut().zip(x) {
        *q = (v * id).round() as i8 as u8;
    }
}

// ggml quantize_row_q5_0_ref: d = (signed value of largest magnitude) / -16,
// q = trunc(x/d + 16.5), the fifth bit of element j in bit j of qh.
fn quantize_q5_0(x: &[f32], blk: &mut [u8]) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -16.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    blk[..2].copy_from_slice(&f16_bytes(d));
    let levels: [u8; 32] = std::array::from_fn(|j| ((x[j] * id + 16.5) as i8).min(31) as u8);
    pack_q5(&levels, &mut blk[2..22]);
}

// ggml quantize_row_q5_1_ref: d = (max - min) / 31, m = min, q = trunc((x - min)/d + 0.5).
fn quantize_q5_1(x: &[f32], blk: &mut [u8]) {
    let (min, max) = min_max(x);
    let d = (max - min) / 31.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    blk[..2].copy_from_slice(&f16_bytes(d));
    blk[2..4].copy_from_slice(&f16_bytes(min));
    let levels: [u8; 32] = std::array::from_fn(|j| ((x[j] - min) * id + 0.5) as u8);
    pack_q5(&levels, &mut blk[4..24]);
}

/// 32 five-bit levels as ggml's Q5 blocks hold them: `qh` (4 bytes, bit j = fifth bit of
/// element j) then 16 bytes of nibbles (elements 16.. in the high nibbles).
fn pack_q5(levels: &[u8; 32], out: &mut [u8]) {
    let mut qh = 0u32;
    for (j, &q) in levels.iter().enumerate() {
        qh |= (((q & 0x10) >> 4) as u32) << j;
    }
    out[..4].copy_from_slice(&qh.to_le_bytes());
    for j in 0..16 {
        out[4 + j] = (levels[j] & 0x0f) | ((levels[16 + j] & 0x0f) << 4);
    }
}

/// ggml's `make_qkx2_quants`: an asymmetric `nmax`-level quantization of `x` with weights `w`,
/// searching `nstep + 1` scales around `nmax / (max - min)` for the least weighted squared
/// (or, with `use_mad`, absolute) error. Writes the levels to `l`; returns (scale, -min).
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    w: &[f32],
    l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let err = |diff: f32| if use_mad { diff.abs() } else { diff * diff };
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = w[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let nmaxf = nmax as f32;
    let mut iscale = nmaxf / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += w[i] * err(diff);
    }
    let mut laux = [0u8; 32];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmaxf) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let qf = q as f32;
            sum_l += w[i] * qf;
            sum_l2 += w[i] * qf * qf;
            sum_xl += w[i] * qf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += w[i] * err(diff);
            }
            if cur_error < best_error {
                l[..n].copy_from_slice(&laux[..n]);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

// ggml quantize_row_q2_K_ref: per 16 elements a (scale, min) from make_qkx2_quants (weights
// |x|, absolute error), both to 4 bits against the block's largest, then every element
// re-quantized to 0..=3; levels of each 128 elements packed four to a byte.
fn quantize_q2k(x: &[f32], blk: &mut [u8]) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let mut mins = [0f32; 16];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    let mut weights = [0f32; 16];
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let lj = &mut l[16 * j..16 * j + 16];
        let (s, m) = make_qkx2_quants(3, xs, &weights, lj, -0.5, 0.1, 15, true);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let (sc, rest) = blk.split_at_mut(16);
    let (qs, dd) = rest.split_at_mut(64);
    if max_scale > 0.0 {
        let iscale = 15.0 / max_scale;
        for (o, &s) in sc.iter_mut().zip(&scales) {
            *o = nearest_int(iscale * s) as u8;
        }
        dd[..2].copy_from_slice(&f16_bytes(max_scale / 15.0));
    } else {
        sc.fill(0);
        dd[..2].copy_from_slice(&f16_bytes(0.0));
    }
    if max_min > 0.0 {
        let iscale = 15.0 / max_min;
        for (o, &m) in sc.iter_mut().zip(&mins) {
            *o |= (nearest_int(iscale * m) << 4) as u8;
        }
        dd[2..4].copy_from_slice(&f16_bytes(max_min / 15.0));
    } else {
        dd[2..4].copy_from_slice(&f16_bytes(0.0));
    }
    let d_all = half::f16::from_le_bytes([dd[0], dd[1]]).to_f32();
    let dmin_all = half::f16::from_le_bytes([dd[2], dd[3]]).to_f32();
    for j in 0..16 {
        let d = d_all * (sc[j] & 0xf) as f32;
        // A zero scale keeps make_qkx2_quants' levels, as ggml does.
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, qs);
}

// ggml quantize_row_q4_K_ref / quantize_row_q5_K_ref, the part they share: per 32-element
// sub-block a (scale, min) from make_qkx2_quants weighted by rms + |x|, both quantized to 6 bits
// against the block's largest, then every element re-quantized to 0..=nmax against the stored
// (f16, 6-bit) scale and min. Writes d, dmin and the 12 packed scale bytes to `head` (16 bytes)
// and the levels to `l`.
fn quantize_kx(x: &[f32], nmax: i32, rmin: f32, nstep: i32, head: &mut [u8], l: &mut [u8; QK_K]) {
    let mut weights = [0f32; 32];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let mut sum_x2 = 0f32;
        for &v in xs {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let lj = &mut l[32 * j..32 * j + 32];
        let (s, m) = make_qkx2_quants(nmax, xs, &weights, lj, rmin, 0.1, nstep, false);
        scales[j] = s;
        mins[j] = m;
        if s > max_scale {
            max_scale = s;
        }
        if m > max_min {
            max_min = m;
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut head[4..16];
    sc.fill(0);
    for j in 0..8 {
        // C stores nearest_int into a uint8_t (wrapping) before MIN(63, ..).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xf) | ((lm & 0xf) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    let d_bytes = f16_bytes(max_scale / 63.0);
    let dmin_bytes = f16_bytes(max_min / 63.0);
    head[..2].copy_from_slice(&d_bytes);
    head[2..4].copy_from_slice(&dmin_bytes);
    let d_all = half::f16::from_le_bytes(d_bytes).to_f32();
    let dmin_all = half::f16::from_le_bytes(dmin_bytes).to_f32();
    for j in 0..8 {
        let (s, m) = crate::dequant::scale_min_k4(j, &head[4..16]);
        let d = d_all * s as f32;
        // A zero scale keeps make_qkx2_quants' levels, as ggml does.
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
}

// ggml quantize_row_q4_K_ref: 4-bit levels, nibbles of each 64 elements in 32 bytes (low half
// in the low nibbles).
fn quantize_q4k(x: &[f32], blk: &mut [u8]) {
    let mut l = [0u8; QK_K];
    quantize_kx(x, 15, -1.0, 20, &mut blk[..16], &mut l);
    let qs = &mut blk[16..144];
    for (g, q) in qs.chunks_exact_mut(32).enumerate() {
        for (i, b) in q.iter_mut().enumerate() {
            *b = l[64 * g + i] | (l[64 * g + 32 + i] << 4);
        }
    }
}

// ggml quantize_row_q5_K_ref: 5-bit levels, the low 4 bits packed as Q4_K's nibbles and the
// fifth bit of element i of group g in bit 2g (low half) or 2g + 1 (high half) of qh[i % 32].
fn quantize_q5k(x: &[f32], blk: &mut [u8]) {
    let mut l = [0u8; QK_K];
    quantize_kx(x, 31, -0.5, 15, &mut blk[..16], &mut l);
    let (qh, qs) = blk[16..176].split_at_mut(32);
    qh.fill(0);
    for (g, q) in qs.chunks_exact_mut(32).enumerate() {
        let (m1, m2) = (1u8 << (2 * g), 2u8 << (2 * g));
        for (i, b) in q.iter_mut().enumerate() {
            let (mut l1, mut l2) = (l[64 * g + i], l[64 * g + 32 + i]);
            if l1 > 15 {
                l1 -= 16;
                qh[i] |= m1;
            }
            if l2 > 15 {
                l2 -= 16;
                qh[i] |= m2;
            }
            *b = l1 | (l2 << 4);
        }
    }
}

/// ggml's `make_qx_quants` with `rmse_type` 1 (weights x^2, no importance matrix): a symmetric
/// quantization to levels `-nmax..nmax-1`, trying 18 scales around `nmax / max` for the best
/// weighted fit. Writes `level + nmax` to `l`; returns the scale.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let nmaxf = nmax as f32;
    let fit = |iscale: f32| -> (f32, f32) {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let store = |iscale: f32, l: &mut [i8]| {
        for (o, &v) in l.iter_mut().zip(x) {
            *o = (nmax + nearest_int(iscale * v).clamp(-nmax, nmax - 1)) as i8;
        }
    };
    let iscale = -nmaxf / max;
    store(iscale, l);
    let (sumlx, suml2) = fit(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        let iscale = -(nmaxf + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            store(iscale, l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

// ggml quantize_row_q6_K_ref: per 16 elements a scale from make_qx_quants, the 16 scales to i8
// against the block's largest (signed) one, then every element re-quantized to 6 bits.
fn quantize_q6k(x: &[f32], blk: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let s = make_qx_quants_rmse1(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = s;
        if s.abs() > max_abs_scale {
            max_abs_scale = s.abs();
            max_scale = s;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        blk.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d_bytes = f16_bytes(1.0 / iscale);
    blk[208..210].copy_from_slice(&d_bytes);
    let d_all = half::f16::from_le_bytes(d_bytes).to_f32();
    for ib in 0..16 {
        blk[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let d = d_all * (blk[192 + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let q = nearest_int(x[16 * j + ii] / d).clamp(-32, 31);
            l[16 * j + ii] = (q + 32) as i8;
        }
    }
    // 128 elements per half: low nibbles of 4 quarters in 64 bytes, high pairs in 32.
    for h in 0..2 {
        let lh = &l[128 * h..128 * h + 128];
        for i in 0..32 {
            let q = |k: usize| lh[32 * k + i] as u8;
            blk[64 * h + i] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
            blk[64 * h + 32 + i] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
            blk[128 + 32 * h + i] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

/// Root-mean-square error of `dequantize_row(quantize(x))` against `x`, relative to the RMS of
/// `x` (0 for an all-zero row): the quality figure of a weight type on given data.
pub fn relative_rms_error(ty: WType, x: &[f32]) -> f64 {
    let q = quantize(ty, x);
    let mut back = vec![0f32; x.len()];
    crate::dequantize_row(ty, &q, &mut back);
    let (mut err, mut sig) = (0f64, 0f64);
    for (&a, &b) in x.iter().zip(&back) {
        err += ((a - b) as f64).powi(2);
        sig += (a as f64).powi(2);
    }
    if sig == 0.0 { 0.0 } else { (err / sig).sqrt() }
}

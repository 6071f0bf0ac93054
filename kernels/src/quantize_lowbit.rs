//! The Q3_K, IQ4_NL, IQ4_XS and MXFP4 quantizers, doing exactly the float operations of ggml's
//! (`quantize_row_q3_K_ref`, and `quantize_iq4_nl` / `quantize_iq4_xs` without an importance
//! matrix, which is what `llama-quantize` runs for these types), as `quantize` does for the
//! others; and the rounding and packing helpers both modules use.

use crate::dequant::KVALUES_IQ4NL;

const QK_K: usize = 256;

/// ggml's `GROUP_MAX_EPS`: groups whose largest magnitude is below this quantize to zero.
pub(crate) const GROUP_MAX_EPS: f32 = 1e-15;

/// The value of largest magnitude in `x`, with its sign, and that magnitude (the first such
/// value on ties, as ggml scans): what the symmetric quantizers scale from.
#[inline]
pub(crate) fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut max, mut amax) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// The smallest and largest value of `x` (`(f32::MAX, -f32::MAX)` when empty), as ggml's
/// minimum-based quantizers scan them.
pub(crate) fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

/// ggml's `nearest_int`: round half to even (exact for |x| < 2^22, all ggml ever passes).
#[inline]
pub(crate) fn nearest_int(x: f32) -> i32 {
    x.round_ties_even() as i32
}

#[inline]
pub(crate) fn f16_bytes(x: f32) -> [u8; 2] {
    half::f16::from_f32(x).to_le_bytes()
}

/// 256 levels of 0..=3 as Q2_K / Q3_K hold them: per 128 elements 32 bytes, element
/// `32 * s + t` in bits `2s` of byte `t`.
pub(crate) fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8]) {
    for j in (0..QK_K).step_by(128) {
        for i in 0..32 {
            qs[j / 4 + i] =
                l[j + i] | (l[j + i + 32] << 2) | (l[j + i + 64] << 4) | (l[j + i + 96] << 6);
        }
    }
}

/// ggml's `make_q3_quants` with `do_rmse`: a symmetric quantization to `-nmax..nmax-1`
/// starting from `nmax / max`, then up to 5 passes moving single levels while the weighted
/// (x^2) fit improves. Writes `level + nmax` to `l` (0 for a group below `GROUP_MAX_EPS`);
/// returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (max, amax) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for (o, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *o = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let cur = *li as f32;
            let mut slx = sumlx - w * v * cur;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * cur * cur;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != *li as i32 {
                    let nl = new_l as f32;
                    slx += w * v * nl;
                    sl2 += w * nl * nl;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        changed += 1;
                    }
                }
            }
        }
        if changed == 0 {
            break;
        }
    }
    for o in l.iter_mut() {
        *o += nmax as i8;
    }
    if suml2 > 0.0 { sumlx / suml2 } else { 0.0 }
}

// ggml quantize_row_q3_K_ref: per 16 elements a scale from make_q3_quants, the 16 scales to
// signed 6 bits against the block's largest (signed) one, every element re-quantized to
// -4..=3; the third bit of element e in bit e / 32 of hmask[e % 32], the low two as Q2_K's.
pub(crate) fn quantize_q3k(x: &[f32], blk: &mut [u8]) {
    let mut l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut amax) = (0f32, 0f32);
    for j in 0..16 {
        let s = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        scales[j] = s;
        if s.abs() > amax {
            amax = s.abs();
            max_scale = s;
        }
    }
    let (hmask, rest) = blk.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, d_bytes) = rest.split_at_mut(12);
    sc.fill(0);
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &s) in scales.iter().enumerate() {
            // C stores nearest_int into an int8_t before clamping.
            let v = (nearest_int(iscale * s) as i8).clamp(-32, 31) + 32;
            let v = v as u8;
            if j < 8 {
                sc[j] = v & 0xf;
            } else {
                sc[j - 8] |= (v & 0xf) << 4;
            }
            sc[j % 4 + 8] |= (v >> 4) << (2 * (j / 4));
        }
        d_bytes.copy_from_slice(&f16_bytes(1.0 / iscale));
    } else {
        d_bytes.copy_from_slice(&f16_bytes(0.0));
    }
    let d_all = half::f16::from_le_bytes([d_bytes[0], d_bytes[1]]).to_f32();
    let packed = crate::dequant::q3k_scales(sc);
    for (j, &s) in packed.iter().enumerate() {
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-4, 3) + 4) as i8;
        }
    }
    hmask.fill(0);
    let mut low = [0u8; QK_K];
    for (e, (&v, o)) in l.iter().zip(low.iter_mut()).enumerate() {
        let mut v = v as u8;
        if v > 3 {
            hmask[e % 32] |= 1 << (e / 32);
            v -= 4;
        }
        *o = v;
    }
    pack_2bit(&low, qs);
}

/// ggml's `best_index_int8`: the index of the grid value nearest `x` (ties to the upper one
/// unless strictly nearer the lower), by bisection.
fn best_index(x: f32) -> u8 {
    let val = |i: usize| KVALUES_IQ4NL[i] as f32;
    if x <= val(0) {
        return 0;
    }
    if x >= val(15) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < val(mav) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - val(mu - 1) < val(mu) - x {
        (mu - 1) as u8
    } else {
        mu as u8
    }
}

/// The weighted (x^2) least-squares scale of one 32-element group on the IQ4 grid, ggml's
/// search with `ntry` = 7: the start `max / 127`, then 15 trial scales `(t - 127) / max`
/// keeping the best fit. 0 for a group below `GROUP_MAX_EPS`.
fn iq4_group_scale(xb: &[f32]) -> f32 {
    const NTRY: i32 = 7;
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in xb {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0] as f32;
    let fit = |id: f32| {
        let (mut sumqx, mut sumq2) = (0f32, 0f32);
        for &v in xb {
            let q = KVALUES_IQ4NL[best_index(id * v) as usize] as f32;
            let w = v * v;
            sumqx += w * q * v;
            sumq2 += w * q * q;
        }
        (sumqx, sumq2)
    };
    let d = -max / v0;
    let (sumqx, sumq2) = fit(1.0 / d);
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let (sumqx, sumq2) = fit((itry + KVALUES_IQ4NL[0] as i32) as f32 / max);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// 32 grid indices into 16 bytes (elements 16.. in the high nibbles).
fn pack_iq4(l: &[u8], q4: &mut [u8]) {
    for j in 0..16 {
        q4[j] = l[j] | (l[16 + j] << 4);
    }
}

// ggml quantize_iq4_nl (no importance matrix): the group's scale stored as f16, the indices
// taken again against the unrounded scale.
pub(crate) fn quantize_iq4nl(x: &[f32], blk: &mut [u8]) {
    let d = iq4_group_scale(x);
    blk[..2].copy_from_slice(&f16_bytes(d));
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let l: [u8; 32] = std::array::from_fn(|j| best_index(id * x[j]));
    pack_iq4(&l, &mut blk[2..18]);
}

// ggml quantize_iq4_xs (no importance matrix): 8 group scales to signed 6 bits against
// d = -max_scale / 32 (the block's largest signed scale), the indices taken again against
// each group's d * l (unrounded d).
pub(crate) fn quantize_iq4xs(x: &[f32], blk: &mut [u8]) {
    let mut scales = [0f32; 8];
    let (mut max_scale, mut amax_scale) = (0f32, 0f32);
    for (ib, s) in scales.iter_mut().enumerate() {
        *s = iq4_group_scale(&x[32 * ib..32 * ib + 32]);
        if s.abs() > amax_scale {
            amax_scale = s.abs();
            max_scale = *s;
        }
    }
    let d = -max_scale / 32.0;
    blk[..2].copy_from_slice(&f16_bytes(d));
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let mut scales_h = 0u16;
    for (ib, &s) in scales.iter().enumerate() {
        let l = nearest_int(id * s).clamp(-32, 31);
        let dl = d * l as f32;
        let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
        let xb = &x[32 * ib..32 * ib + 32];
        let lb: [u8; 32] = std::array::from_fn(|j| best_index(idl * xb[j]));
        pack_iq4(&lb, &mut blk[8 + 16 * ib..24 + 16 * ib]);
        let l = (l + 32) as u8;
        if ib % 2 == 0 {
            blk[4 + ib / 2] = l & 0xf;
        } else {
            blk[4 + ib / 2] |= (l & 0xf) << 4;
        }
        scales_h |= ((l >> 4) as u16) << (2 * ib);
    }
    blk[2..4].copy_from_slice(&scales_h.to_le_bytes());
}

/// ggml `quantize_row_mxfp4_ref` (gguf-py's `MXFP4.quantize_blocks`): the shared exponent is
/// `floor(log2(amax)) - 2 + 127` (so the largest value lands on the grid's top, 6 = 12 / 2, or
/// just under), then each element takes the nearest grid value, the first on ties. (An
/// `amax` under 2^-125 would give a negative exponent, which C and numpy wrap; it is clamped
/// to 0 here: such a block is all but zero either way.)
pub(crate) fn quantize_mxfp4(x: &[f32], blk: &mut [u8]) {
    use crate::dequant::{KVALUES_MXFP4, e8m0_half};
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let e = if amax > 0.0 {
        (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8
    } else {
        0
    };
    let d = e8m0_half(e);
    let best = |v: f32| {
        let mut best = (0usize, (d * KVALUES_MXFP4[0] as f32 - v).abs());
        for (i, &k) in KVALUES_MXFP4.iter().enumerate().skip(1) {
            let err = (d * k as f32 - v).abs();
            if err < best.1 {
                best = (i, err);
            }
        }
        best.0 as u8
    };
    blk[0] = e;
    for j in 0..16 {
        blk[1 + j] = best(x[j]) | (best(x[16 + j]) << 4);
    }
}

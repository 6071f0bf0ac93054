//! The float weight types on AVX2/FMA/F16C: rows widened to f32 and the f32 dots, each bit for
//! bit the portable formulas in `quant` and `dequant`.

use std::arch::x86_64::*;

use crate::WType;
use crate::quant;

/// One row of float weights (`F32`, `F16` or `BF16` bytes) widened to f32 in `out`: the same
/// exact values [`crate::dequantize_row`] gives, eight at a time (F16C for f16).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn widen_row(ty: WType, w: &[u8], out: &mut [f32]) {
    let k = out.len();
    let main = k / 8 * 8;
    match ty {
        WType::F16 | WType::BF16 => {
            assert!(w.len() >= 2 * k);
            for i in (0..main).step_by(8) {
                // SAFETY: bytes 2i..2i+16 of `w` and floats i..i+8 of `out` are in bounds.
                unsafe {
                    let h = _mm_loadu_si128(w.as_ptr().add(2 * i).cast());
                    let f = if ty == WType::F16 {
                        _mm256_cvtph_ps(h)
                    } else {
                        _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                    };
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), f);
                }
            }
            crate::dequantize_row(ty, &w[2 * main..2 * k], &mut out[main..]);
        }
        WType::F32 => {
            assert!(w.len() >= 4 * k);
            for i in (0..main).step_by(8) {
                // SAFETY: bytes 4i..4i+32 of `w` and floats i..i+8 of `out` are in bounds.
                unsafe {
                    let f = _mm256_loadu_ps(w.as_ptr().add(4 * i).cast());
                    _mm256_storeu_ps(out.as_mut_ptr().add(i), f);
                }
            }
            crate::dequantize_row(ty, &w[4 * main..4 * k], &mut out[main..]);
        }
        _ => crate::dequantize_row(ty, w, out),
    }
}

/// Decode's dots of one activation row with 4 rows of `F16` or `BF16` weights read in place:
/// [`dot_f32_tile`] on the rows [`widen_row`] gives, bit for bit (each half widens exactly, the
/// chains and the reduction are the same), without writing the widened rows out and reading them
/// back, which made the float types' decode compute-bound (15 GB/s of F16 in the cache on an
/// Intel Xeon, two threads).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_half_rows4(ty: WType, x: &[f32], ws: [&[u8]; 4]) -> [f32; 4] {
    let k = x.len();
    assert!(matches!(ty, WType::F16 | WType::BF16));
    assert!(ws.iter().all(|w| w.len() >= 2 * k));
    let main = k / 8 * 8;
    let mut acc = [_mm256_setzero_ps(); 4];
    let mut c = 0;
    while c < main {
        // SAFETY: c + 8 <= main <= k: floats c..c + 8 of `x` and bytes 2c..2c + 16 of every
        // row (asserted above).
        unsafe {
            let xv = _mm256_loadu_ps(x.as_ptr().add(c));
            for r in 0..4 {
                let h = _mm_loadu_si128(ws[r].as_ptr().add(2 * c).cast());
                let wv = if ty == WType::F16 {
                    _mm256_cvtph_ps(h)
                } else {
                    _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
                };
                acc[r] = _mm256_fmadd_ps(xv, wv, acc[r]);
            }
        }
        c += 8;
    }
    let mut out = [0f32; 4];
    let mut tail = [0f32; 8];
    for r in 0..4 {
        let mut lanes = [0f32; 8];
        // SAFETY: `lanes` holds 8 floats.
        unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r]) };
        let mut s = quant::hsum8(lanes);
        crate::dequantize_row(ty, &ws[r][2 * main..2 * k], &mut tail[..k - main]);
        for t in main..k {
            s = x[t].mul_add(tail[t - main], s);
        }
        out[r] = s;
    }
    out
}

/// Plain f32 dot, the portable formula compiled for AVX2/FMA.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f32(x: &[f32], w: &[f32]) -> f32 {
    quant::dot_f32(x, w)
}

/// The dots of `RA` activation rows with 4 weight rows, each bit for bit [`quant::dot_f32`]'s
/// (the same 8-lane FMA chain, the same reduction and tail): one chain waits for its FMA's
/// latency every step, so a lone dot runs at a fraction of the FMA units' rate; `4 * RA` chains
/// side by side keep them busy, and each weight vector is loaded once for `RA` rows.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn dot_f32_tile<const RA: usize>(xs: [&[f32]; RA], ws: [&[f32]; 4]) -> [[f32; 4]; RA] {
    let k = ws[0].len();
    assert!(ws.iter().all(|w| w.len() == k) && xs.iter().all(|x| x.len() == k));
    let main = k / 8 * 8;
    let mut acc = [[_mm256_setzero_ps(); 4]; RA];
    let mut c = 0;
    while c < main {
        // SAFETY: c + 8 <= main <= k, the length of every row (asserted above).
        unsafe {
            let wv = [
                _mm256_loadu_ps(ws[0].as_ptr().add(c)),
                _mm256_loadu_ps(ws[1].as_ptr().add(c)),
                _mm256_loadu_ps(ws[2].as_ptr().add(c)),
                _mm256_loadu_ps(ws[3].as_ptr().add(c)),
            ];
            for a in 0..RA {
                let xv = _mm256_loadu_ps(xs[a].as_ptr().add(c));
                for r in 0..4 {
                    acc[a][r] = _mm256_fmadd_ps(xv, wv[r], acc[a][r]);
                }
            }
        }
        c += 8;
    }
    let mut out = [[0f32; 4]; RA];
    for a in 0..RA {
        for r in 0..4 {
            let mut lanes = [0f32; 8];
            // SAFETY: `lanes` holds 8 floats.
            unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc[a][r]) };
            let mut s = quant::hsum8(lanes);
            for t in main..k {
                s = xs[a][t].mul_add(ws[r][t], s);
            }
            out[a][r] = s;
        }
    }
    out
}

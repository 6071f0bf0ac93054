//! The activation quantizers of the x86 paths: Q8_0 and Q8_1 as ggml's AVX2
//! `quantize_row_q8_0/1`, bit for bit the portable formulas in `quant`.

use std::arch::x86_64::*;

use crate::quant::{self, ActType, QActsRows, QK8};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f32_to_f16_to_f32(x: f32) -> f32 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x));
    _mm_cvtss_f32(_mm_cvtph_ps(h))
}

/// Quantizes rows (Q8_0 / Q8_1) as ggml's AVX2 `quantize_row_q8_0/1`; Q8_K has no x86 SIMD
/// version in ggml either, so it takes the portable formula, compiled here with AVX2.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_rows(x: &[f32], out: &mut QActsRows<'_>) {
    if !matches!(out.ty, ActType::Q8_0 | ActType::Q8_1) {
        quant::quantize_rows_portable(x, out);
        return;
    }
    let nb_total = x.len() / QK8;
    assert!(out.qs.len() >= nb_total * QK8 && out.d.len() >= nb_total);
    assert!(out.ty != ActType::Q8_1 || out.s.len() >= nb_total);
    assert!(out.sums.len() >= nb_total);
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for blk in 0..nb_total {
        // SAFETY: block `blk` lies inside `x` (32 floats) and `out.qs` (32 bytes), checked above.
        let (v, q) = unsafe {
            let p = x.as_ptr().add(blk * QK8);
            let v = [
                _mm256_loadu_ps(p),
                _mm256_loadu_ps(p.add(8)),
                _mm256_loadu_ps(p.add(16)),
                _mm256_loadu_ps(p.add(24)),
            ];
            (v, out.qs.as_mut_ptr().add(blk * QK8))
        };
        let mut amax = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign, *vi));
        }
        let mut m4 = _mm_max_ps(
            _mm256_extractf128_ps::<1>(amax),
            _mm256_castps256_ps128(amax),
        );
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let max = _mm_cvtss_f32(m4);
        let d = max / 127.0;
        let id = _mm256_set1_ps(if max != 0.0 { 127.0 / max } else { 0.0 });
        let i: [__m256i; 4] = std::array::from_fn(|j| {
            _mm256_cvtps_epi32(_mm256_round_ps::<
                { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
            >(_mm256_mul_ps(v[j], id)))
        });
        out.d[blk] = f32_to_f16_to_f32(d);
        let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
        let s = _mm_add_epi32(_mm256_extracti128_si256::<1>(s), _mm256_castsi256_si128(s));
        let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
        let sum = _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s)));
        out.sums[blk] = sum;
        if out.ty == ActType::Q8_1 {
            out.s[blk] = f32_to_f16_to_f32(d * sum as f32);
        }
        let p01 = _mm256_packs_epi32(i[0], i[1]);
        let p23 = _mm256_packs_epi32(i[2], i[3]);
        let packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
        // SAFETY: `q` points at 32 writable bytes (checked above).
        unsafe { _mm256_storeu_si256(q.cast(), packed) };
    }
}

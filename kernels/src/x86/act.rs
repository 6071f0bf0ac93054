//! The activation quantizers of the x86 paths: Q8_0 and Q8_1 as ggml's AVX2
//! `quantize_row_q8_0/1`, and Q8_K (the K-quants' activations, which ggml quantizes with its
//! scalar code), each bit for bit the portable formulas in `quant`.

use std::arch::x86_64::*;

use crate::quant::{self, ActType, QActsRows, QK8};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn f32_to_f16_to_f32(x: f32) -> f32 {
    let h = _mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x));
    _mm_cvtss_f32(_mm_cvtph_ps(h))
}

/// Quantizes rows (Q8_0 / Q8_1) as ggml's AVX2 `quantize_row_q8_0/1`, Q8_K as
/// [`quantize_rows_q8k`].
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn quantize_rows(x: &[f32], out: &mut QActsRows<'_>) {
    if out.ty == ActType::Q8K {
        quantize_rows_q8k(x, out);
        return;
    }
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

/// Q8_K blocks (256 values: `d`, 256 quants, 16 sums of 16) with `quant::quantize_block_q8k`'s
/// arithmetic: the largest magnitude by a vector maximum, its signed value the first element of
/// that magnitude (as the scalar scan keeps the first), the same `iscale * v` rounded half to
/// even, and the sums added from the quants. A block holding a NaN or an infinity takes the
/// scalar formula (whose casts of those differ from the vector conversion's).
#[target_feature(enable = "avx2,fma,f16c")]
fn quantize_rows_q8k(x: &[f32], out: &mut QActsRows<'_>) {
    const QK: usize = quant::QK_K;
    let nb_total = x.len() / QK;
    assert!(out.qs.len() >= nb_total * QK && out.d.len() >= nb_total);
    assert!(out.bsums.len() >= nb_total * 16);
    let sign = _mm256_set1_ps(-0.0);
    let perm = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    for blk in 0..nb_total {
        let xb = &x[blk * QK..(blk + 1) * QK];
        // SAFETY: `xb` holds 256 floats (32 vectors).
        let v: [__m256; 32] =
            std::array::from_fn(|j| unsafe { _mm256_loadu_ps(xb.as_ptr().add(8 * j)) });
        let mut m = [_mm256_setzero_ps(); 4];
        let mut nan = _mm256_setzero_ps();
        for (j, vj) in v.iter().enumerate() {
            m[j % 4] = _mm256_max_ps(m[j % 4], _mm256_andnot_ps(sign, *vj));
            nan = _mm256_or_ps(nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(*vj, *vj));
        }
        let m8 = _mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3]));
        let mut m4 = _mm_max_ps(_mm256_extractf128_ps::<1>(m8), _mm256_castps256_ps128(m8));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
        let amax = _mm_cvtss_f32(m4);
        let qs = &mut out.qs[blk * QK..(blk + 1) * QK];
        let bsums = &mut out.bsums[blk * 16..blk * 16 + 16];
        if amax == 0.0 {
            qs.fill(0);
            bsums.fill(0);
            out.d[blk] = 0.0;
            continue;
        }
        let am = _mm256_set1_ps(amax);
        let first = v.iter().enumerate().find_map(|(j, vj)| {
            let hit =
                _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(_mm256_andnot_ps(sign, *vj), am));
            (hit != 0).then(|| 8 * j + hit.trailing_zeros() as usize)
        });
        let (Some(at), false) = (first, _mm256_movemask_ps(nan) != 0 || amax.is_infinite()) else {
            out.d[blk] = quant::quantize_block_q8k(xb, qs, bsums);
            continue;
        };
        let iscale = -127.0 / xb[at];
        let is = _mm256_set1_ps(iscale);
        let top = _mm256_set1_epi32(127);
        let q: [__m256i; 32] = std::array::from_fn(|j| {
            _mm256_min_epi32(
                _mm256_cvtps_epi32(_mm256_round_ps::<
                    { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
                >(_mm256_mul_ps(is, v[j]))),
                top,
            )
        });
        for c in 0..8 {
            let p01 = _mm256_packs_epi32(q[4 * c], q[4 * c + 1]);
            let p23 = _mm256_packs_epi32(q[4 * c + 2], q[4 * c + 3]);
            let packed = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p01, p23), perm);
            // SAFETY: `qs` holds 256 bytes; chunk `c` is bytes `32c..32c + 32`.
            unsafe { _mm256_storeu_si256(qs.as_mut_ptr().add(32 * c).cast(), packed) };
        }
        // Sum g of 16 quants is vectors 2g and 2g + 1; eight such sums per reduction.
        for half in 0..2 {
            let s: [__m256i; 8] = std::array::from_fn(|g| {
                let g = 8 * half + g;
                _mm256_add_epi32(q[2 * g], q[2 * g + 1])
            });
            let h01 = _mm256_hadd_epi32(s[0], s[1]);
            let h23 = _mm256_hadd_epi32(s[2], s[3]);
            let h45 = _mm256_hadd_epi32(s[4], s[5]);
            let h67 = _mm256_hadd_epi32(s[6], s[7]);
            let h0123 = _mm256_hadd_epi32(h01, h23);
            let h4567 = _mm256_hadd_epi32(h45, h67);
            // Lanes: [s0 s1 s2 s3 | s4 s5 s6 s7] halves of each sum, low 128 bits then high.
            let lo = _mm256_permute2x128_si256::<0x20>(h0123, h4567);
            let hi = _mm256_permute2x128_si256::<0x31>(h0123, h4567);
            let sums = _mm256_add_epi32(lo, hi);
            let mut lanes = [0i32; 8];
            // SAFETY: `lanes` holds 8 i32.
            unsafe { _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sums) };
            for (o, l) in bsums[8 * half..8 * half + 8].iter_mut().zip(lanes) {
                *o = l as i16;
            }
        }
        out.d[blk] = 1.0 / iscale;
    }
}

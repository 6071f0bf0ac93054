//! `x86::wide32`: the 32-element block types' batched tile (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1,
//! IQ4_NL) on 512-bit vectors, where `x86::wide::zmm_pays` (`Backend::Avx512Zmm`): two 8-row
//! panels of a packed matrix (`x86::packed_dots`; matrices kept in ggml rows stay on
//! `x86::panel32`'s ymm tile) are one zmm's 16 lanes. Each step's level vector is the two panels' (`panel32::Source`'s, the
//! same unpack) joined; the offsets, the float work and the mins are `panel32::tile`'s on the
//! AVX-512 VNNI path lane by lane, so every row keeps its bits.

use std::arch::x86_64::*;

use crate::quant::QK8;
use crate::x86::dots32::{
    IQ4NL, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, block32, has_min, level_offset, signed_levels,
};
use crate::x86::isa::Avx512Vnni;
use crate::x86::job::GroupJob;
use crate::x86::panel32::{LANES, Source};
use crate::x86::wide::{COLS, cols, dpbusd_at, join, join_ps, store16};

/// The 16 weight rows of `src`'s panels 0 and 1 (from row `j0`, both inside the matrix) by every
/// activation row of `job`, a 32-element type's.
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `src` holds both panels of `job`'s matrix.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(crate) unsafe fn pair(job: &GroupJob<'_>, src: impl Source, j0: usize) {
    assert!(j0 + LANES < job.n);
    let mut c0 = 0;
    while c0 < job.m {
        let cc = cols(job.m - c0);
        macro_rules! by_cc {
            ($t:ident) => {
                // SAFETY: the caller's promise; c0 + cc <= m.
                unsafe {
                    match cc {
                        COLS => tile::<$t, COLS>(job, src, j0, c0),
                        4 => tile::<$t, 4>(job, src, j0, c0),
                        2 => tile::<$t, 2>(job, src, j0, c0),
                        _ => tile::<$t, 1>(job, src, j0, c0),
                    }
                }
            };
        }
        match block32(job.ty) {
            Some(Q4_0) => by_cc!(Q4_0),
            Some(Q4_1) => by_cc!(Q4_1),
            Some(Q5_0) => by_cc!(Q5_0),
            Some(Q5_1) => by_cc!(Q5_1),
            Some(IQ4NL) => by_cc!(IQ4NL),
            _ => by_cc!(Q8_0),
        }
        c0 += cc;
    }
}

/// The 16 rows by activation rows `c0..c0 + CC`, type `T` (as in `dots32`).
///
/// # Safety
/// The CPU has AVX-512 F/BW/VL/VNNI; `src` holds both panels of `job`'s matrix.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::needless_range_loop)]
// The inner `unsafe` blocks keep their bounds notes under the whole-body one.
#[allow(unused_unsafe)]
unsafe fn tile<const T: u8, const CC: usize>(
    job: &GroupJob<'_>,
    src: impl Source,
    j0: usize,
    c0: usize,
) {
    // SAFETY: the caller runs with AVX-512 F/BW/VL/VNNI; `src` holds both panels.
    unsafe {
        let k = job.k;
        let nb = k / QK8;
        let acts = job.acts;
        // `panel32::tile`'s on a VNNI path: the levels' offset (Q4_0 8, Q5_0 16, flipped signed
        // values 128) off through the activation's block sums, the mins apart.
        let corr = level_offset(T) != 0 || signed_levels(T);
        let lift = if signed_levels(T) {
            128
        } else {
            level_offset(T)
        };
        let mins = has_min(T);
        assert!(c0 + CC <= job.m);
        assert!(acts.qs.len() >= (c0 + CC) * k && acts.d.len() >= (c0 + CC) * nb);
        assert!(!corr || acts.sums.len() >= (c0 + CC) * nb);
        assert!(!mins || acts.s.len() >= (c0 + CC) * nb);
        let xq = acts.qs.as_ptr().add(c0 * k);
        let mut acc = [_mm512_setzero_ps(); CC];
        for b in 0..nb {
            // SAFETY: block b of the panels and of each activation row is in bounds (above).
            unsafe {
                let mut dot = [_mm512_setzero_si512(); CC];
                for step in 0..LANES {
                    let w = join(
                        src.levels::<Avx512Vnni, T>(0, b, step),
                        src.levels::<Avx512Vnni, T>(1, b, step),
                    );
                    for c in 0..CC {
                        dot[c] = dpbusd_at!(dot[c], w, xq.add(c * k + b * QK8 + 4 * step));
                    }
                }
                let dw = join_ps(src.dw::<T>(0, b), src.dw::<T>(1, b));
                for c in 0..CC {
                    let dx = _mm512_set1_ps(*acts.d.as_ptr().add((c0 + c) * nb + b));
                    let isum = if corr {
                        let off = lift * *acts.sums.as_ptr().add((c0 + c) * nb + b);
                        _mm512_sub_epi32(dot[c], _mm512_set1_epi32(off))
                    } else {
                        dot[c]
                    };
                    acc[c] =
                        _mm512_fmadd_ps(_mm512_mul_ps(dw, dx), _mm512_cvtepi32_ps(isum), acc[c]);
                }
            }
        }
        for c in 0..CC {
            let mut v = acc[c];
            if mins {
                // Q4_1's and Q5_1's `sum_b m_w * s_x`, one FMA chain per row, added once.
                let mut s = _mm512_setzero_ps();
                for b in 0..nb {
                    // SAFETY: in bounds (checked above).
                    let (mv, sx) = unsafe {
                        (
                            join_ps(src.mw::<T>(0, b), src.mw::<T>(1, b)),
                            *acts.s.as_ptr().add((c0 + c) * nb + b),
                        )
                    };
                    s = _mm512_fmadd_ps(mv, _mm512_set1_ps(sx), s);
                }
                v = _mm512_add_ps(v, s);
            }
            // SAFETY: only this thread's group writes these columns.
            unsafe { store16(job, c0 + c, j0, v) };
        }
    }
}

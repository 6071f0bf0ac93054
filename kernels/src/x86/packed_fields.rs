//! `x86::packed_fields`: where the kernels find each field of a packed block ([`at`]:
//! `crate::packed` owns the layout), and the per-block unpack of its scales into the i16 pair
//! vectors the tiles multiply by ([`block_scales`]), once per tile or once per group for all its
//! column tiles ([`Scales`]).

use std::arch::x86_64::*;

use crate::WType;
use crate::packed::PANEL_ROWS;
use crate::quant::QK_K;
use crate::x86::isa::Dots;
use crate::x86::job::GroupJob;
use crate::x86::kblock::{IQ4XS, Q2K, Q3K, Q4K, Q5KP, Q6K};

/// Where the kernels find each field of a packed block (`crate::packed` owns the layout).
pub(crate) mod at {
    use crate::packed::{self, field_at};
    pub const Q4K_D: usize = field_at(&packed::Q4K, 0);
    pub const Q4K_DMIN: usize = field_at(&packed::Q4K, 2);
    pub const Q4K_SCALES: usize = field_at(&packed::Q4K, 4);
    pub const Q4K_QS: usize = field_at(&packed::Q4K, 16);
    pub const Q5K_D: usize = field_at(&packed::Q5K, 0);
    pub const Q5K_DMIN: usize = field_at(&packed::Q5K, 2);
    pub const Q5K_SCALES: usize = field_at(&packed::Q5K, 4);
    pub const Q5K_QH: usize = field_at(&packed::Q5K, 16);
    pub const Q5K_QS: usize = field_at(&packed::Q5K, 48);
    pub const Q6K_QL: usize = field_at(&packed::Q6K, 0);
    pub const Q6K_SCALES: usize = field_at(&packed::Q6K, 192);
    pub const Q6K_D: usize = field_at(&packed::Q6K, 208);
    pub const Q2K_QS: usize = field_at(&packed::Q2K, 16);
    pub const Q2K_SCALES: usize = field_at(&packed::Q2K, 0);
    pub const Q2K_D: usize = field_at(&packed::Q2K, 80);
    pub const Q2K_DMIN: usize = field_at(&packed::Q2K, 82);
    pub const Q3K_HMASK: usize = field_at(&packed::Q3K, 0);
    pub const Q3K_SCALES: usize = field_at(&packed::Q3K, 96);
    pub const Q3K_D: usize = field_at(&packed::Q3K, 108);
    pub const IQ4XS_D: usize = field_at(&packed::IQ4XS, 0);
    pub const IQ4XS_SCALES_H: usize = field_at(&packed::IQ4XS, 2);
    pub const IQ4XS_SCALES_L: usize = field_at(&packed::IQ4XS, 4);
    pub const IQ4XS_QS: usize = field_at(&packed::IQ4XS, 8);
    /// Every 32-element type's `d` first, Q4_1's and Q5_1's `m` next.
    pub const D: usize = field_at(&packed::Q8_0, 0);
    pub const M: usize = field_at(&packed::Q4_1, 2);
    pub const Q8_0_QS: usize = field_at(&packed::Q8_0, 2);
    pub const Q4_0_QS: usize = field_at(&packed::Q4_0, 2);
    pub const Q5_0_QH: usize = field_at(&packed::Q5_0, 2);
    pub const Q5_0_QS: usize = field_at(&packed::Q5_0, 6);
    pub const Q4_1_QS: usize = field_at(&packed::Q4_1, 4);
    pub const Q5_1_QH: usize = field_at(&packed::Q5_1, 4);
    pub const Q5_1_QS: usize = field_at(&packed::Q5_1, 8);
}

/// The 16 bytes at `p` as the i16 pairs of two byte fields of 8 rows: bytes 0..8 are field `a`
/// of rows 0..8, bytes 8..16 field `b`; lane `r` gets `(a[r], b[r])`, widened signed or not.
///
/// # Safety
/// On an AVX2 CPU.
#[inline(always)]
unsafe fn pairs<const SIGNED: bool>(x: __m128i) -> __m256i {
    // SAFETY: on an AVX2 CPU (the caller's promise).
    unsafe {
        let y = _mm_unpacklo_epi8(x, _mm_srli_si128::<8>(x));
        if SIGNED {
            _mm256_cvtepi8_epi16(y)
        } else {
            _mm256_cvtepu8_epi16(y)
        }
    }
}

/// The top two bits of each byte of `v` as bits 4 and 5 (`top` = 0x30 in every byte; 16-bit
/// shifts, the neighbour's bits masked off).
#[inline(always)]
unsafe fn top2(v: __m128i, top: __m128i) -> __m128i {
    // SAFETY: on an AVX2 CPU (the caller's).
    unsafe { _mm_and_si128(_mm_srli_epi16::<2>(v), top) }
}

// Q5_K's `d`, `dmin` and scales lie where Q4_K's do: one unpack serves both.
const _: () = assert!(
    at::Q5K_D == at::Q4K_D && at::Q5K_DMIN == at::Q4K_DMIN && at::Q5K_SCALES == at::Q4K_SCALES
);

/// The scale pair vectors of a packed Q4_K or Q5_K block (`blk`), as `x86::panel_k`'s repack stores
/// them: vector `t` the pairs `(sc[2t], sc[2t + 1])` of the 8 rows, vector `4 + t` the min
/// pairs. The 12 scale bytes are ggml's 6-bit packing (`get_scale_min_k4`), byte `i` of the 8
/// rows at `32 + 8 i`: scales 0..4 and mins 0..4 are bytes 0..4 and 4..8 less their top two
/// bits; scale `4 + j` is byte `8 + j`'s low nibble under byte `j`'s top bits, min `4 + j` its
/// high nibble under byte `4 + j`'s top bits.
///
/// # Safety
/// The block's bytes are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn q4k_scales(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's promise; the scale field is bytes 32..128 of the block.
    unsafe {
        let mut q = [_mm_setzero_si128(); 6];
        for (a, q) in q.iter_mut().enumerate() {
            *q = _mm_loadu_si128(blk.add(at::Q4K_SCALES + 16 * a).cast());
        }
        let m6 = _mm_set1_epi8(63);
        let m4 = _mm_set1_epi8(0x0f);
        let top = _mm_set1_epi8(0x30);
        let sc01 = _mm_and_si128(q[0], m6);
        let sc23 = _mm_and_si128(q[1], m6);
        let mn01 = _mm_and_si128(q[2], m6);
        let mn23 = _mm_and_si128(q[3], m6);
        let sc45 = _mm_or_si128(_mm_and_si128(q[4], m4), top2(q[0], top));
        let sc67 = _mm_or_si128(_mm_and_si128(q[5], m4), top2(q[1], top));
        let mn45 = _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16::<4>(q[4]), m4),
            top2(q[2], top),
        );
        let mn67 = _mm_or_si128(
            _mm_and_si128(_mm_srli_epi16::<4>(q[5]), m4),
            top2(q[3], top),
        );
        [
            pairs::<false>(sc01),
            pairs::<false>(sc23),
            pairs::<false>(sc45),
            pairs::<false>(sc67),
            pairs::<false>(mn01),
            pairs::<false>(mn23),
            pairs::<false>(mn45),
            pairs::<false>(mn67),
        ]
    }
}

/// The scale pair vectors of a packed Q6_K block (`blk`): vector `t` the signed pairs
/// `(sc[2t], sc[2t + 1])` of the 8 rows (scale byte `s` of the 8 rows `8 s` into the field).
///
/// # Safety
/// The block's bytes are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn q6k_scales(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's promise; the scale field is 128 bytes of the block.
    unsafe {
        let mut v = [_mm256_setzero_si256(); 8];
        for (t, v) in v.iter_mut().enumerate() {
            *v = pairs::<true>(_mm_loadu_si128(blk.add(at::Q6K_SCALES + 16 * t).cast()));
        }
        v
    }
}

/// The scale pair vectors of a packed Q2_K block (`blk`): vector `t` the raw scale bytes
/// `(sc[2t], sc[2t + 1])` of the 8 rows as i16 pairs (scale in the low nibble, min in the high:
/// `x86::panel_k`'s 16-element kernel takes them apart).
///
/// # Safety
/// The block's bytes are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn q2k_scales(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's promise; the scale field is 128 bytes of the block.
    unsafe {
        std::array::from_fn(|t| {
            pairs::<false>(_mm_loadu_si128(blk.add(at::Q2K_SCALES + 16 * t).cast()))
        })
    }
}

/// The scale pair vectors of a packed IQ4_XS block (`blk`): vector `t` the signed pairs
/// `(ls[2t] - 32, ls[2t + 1] - 32)` of the 8 rows, where sub-block `s`'s 6-bit scale is the
/// nibble `s % 2` of low byte `s / 2` under bits `2s..2s + 2` of the high word
/// (`dequant::iq4xs_scale`); vectors 4..8 are unused.
///
/// # Safety
/// The block's bytes are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn iq4xs_scales(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's promise; the scale fields are bytes 16..64 of the block.
    unsafe {
        let h = _mm256_cvtepu16_epi32(_mm_loadu_si128(blk.add(at::IQ4XS_SCALES_H).cast()));
        let (m4, m2, off) = (
            _mm256_set1_epi32(15),
            _mm256_set1_epi32(3),
            _mm256_set1_epi32(32),
        );
        let mut v = [_mm256_setzero_si256(); 8];
        for (t, v) in v.iter_mut().take(4).enumerate() {
            let l = _mm_loadl_epi64(blk.add(at::IQ4XS_SCALES_L + 8 * t).cast());
            let l = _mm256_cvtepu8_epi32(l);
            let h_lo = _mm256_and_si256(_mm256_srlv_epi32(h, _mm256_set1_epi32(4 * t as i32)), m2);
            let h_hi = _mm256_and_si256(
                _mm256_srlv_epi32(h, _mm256_set1_epi32(4 * t as i32 + 2)),
                m2,
            );
            let lo = _mm256_or_si256(_mm256_and_si256(l, m4), _mm256_slli_epi32::<4>(h_lo));
            let hi = _mm256_or_si256(_mm256_srli_epi32::<4>(l), _mm256_slli_epi32::<4>(h_hi));
            let (lo, hi) = (_mm256_sub_epi32(lo, off), _mm256_sub_epi32(hi, off));
            *v = _mm256_or_si256(
                _mm256_and_si256(lo, _mm256_set1_epi32(0xffff)),
                _mm256_slli_epi32::<16>(hi),
            );
        }
        v
    }
}

/// The scale pair vectors of a packed Q3_K block (`blk`): vector `t` the signed pairs
/// `(sc[2t], sc[2t + 1])` of the 8 rows, `sc[s]` ggml's 6-bit scale less 32
/// (`dequant::q3k_scales`): the low nibble of byte `s` (`s < 8`) or the high nibble of byte
/// `s - 8`, under bits `2 (s / 4)..+2` of byte `8 + s % 4`. Byte `i` of the 8 rows is the
/// 8 bytes at `8 i` into the field, so 16 bytes from `16 a` are bytes `2 a` and `2 a + 1`.
///
/// # Safety
/// The block's bytes are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn q3k_scales(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's promise; the scale field is 96 bytes of the block.
    unsafe {
        // q[a]: bytes 2a and 2a + 1 of the 8 rows, the pair layout `pairs` takes.
        let mut q = [_mm_setzero_si128(); 6];
        for (a, q) in q.iter_mut().enumerate() {
            *q = _mm_loadu_si128(blk.add(at::Q3K_SCALES + 16 * a).cast());
        }
        let (m4, m2) = (_mm_set1_epi8(0x0f), _mm_set1_epi8(3));
        // Scales 2t, 2t + 1: the low nibbles of q[t] (t < 4) or the high ones of q[t - 4], under
        // bits 2 (t / 2)..+2 of q[4 + t % 2] (16-bit shifts; the masks drop what crosses a byte).
        let hi = [
            _mm_and_si128(q[4], m2),
            _mm_and_si128(q[5], m2),
            _mm_and_si128(_mm_srli_epi16::<2>(q[4]), m2),
            _mm_and_si128(_mm_srli_epi16::<2>(q[5]), m2),
            _mm_and_si128(_mm_srli_epi16::<4>(q[4]), m2),
            _mm_and_si128(_mm_srli_epi16::<4>(q[5]), m2),
            _mm_and_si128(_mm_srli_epi16::<6>(q[4]), m2),
            _mm_and_si128(_mm_srli_epi16::<6>(q[5]), m2),
        ];
        let off = _mm256_set1_epi16(32);
        std::array::from_fn(|t| {
            let lo = if t < 4 {
                _mm_and_si128(q[t], m4)
            } else {
                _mm_and_si128(_mm_srli_epi16::<4>(q[t - 4]), m4)
            };
            let x = _mm_or_si128(lo, _mm_slli_epi16::<4>(hi[t]));
            _mm256_sub_epi16(pairs::<false>(x), off)
        })
    }
}

/// The scale pair vectors of a packed block of type `T` ([`q4k_scales`], [`q6k_scales`],
/// [`q3k_scales`], [`iq4xs_scales`]).
///
/// # Safety
/// The block's bytes are readable, on an AVX2 CPU.
#[inline(always)]
pub(crate) unsafe fn block_scales<const T: u8>(blk: *const u8) -> [__m256i; 8] {
    // SAFETY: the caller's promise.
    unsafe {
        match T {
            Q4K | Q5KP => q4k_scales(blk),
            Q6K => q6k_scales(blk),
            Q3K => q3k_scales(blk),
            Q2K => q2k_scales(blk),
            _ => iq4xs_scales(blk),
        }
    }
}

/// A group's scale pair vectors unpacked once for all its column tiles: panels `p0..` of the
/// matrix, `nb` blocks each, 8 vectors a block, in the scratch's `sm`.
#[derive(Clone, Copy)]
pub(crate) struct Scales {
    base: *const __m256i,
    p0: usize,
    nb: usize,
}

impl Scales {
    /// Unpacks the scales of panels `p0..p1` of `job`'s packed matrix into `pn.sm`.
    ///
    /// # Safety
    /// The CPU has `D`'s features; the panels are inside the matrix.
    #[inline(always)]
    pub(crate) unsafe fn unpack<D: Dots>(
        job: &GroupJob<'_>,
        p0: usize,
        p1: usize,
        pn: &mut crate::x86::panel_k::PanelsK,
    ) -> Scales {
        let nb = job.k / QK_K;
        let pb = PANEL_ROWS * job.ty.type_size();
        assert!(job.data.len() >= p1 * nb * pb);
        // SAFETY: on an AVX2 CPU (the caller's promise).
        pn.sm
            .resize((p1 - p0) * nb * 8, unsafe { _mm256_setzero_si256() });
        for p in p0..p1 {
            for b in 0..nb {
                // SAFETY: block b of panel p is inside the matrix (checked above).
                let v = unsafe {
                    let blk = job.data.as_ptr().add((p * nb + b) * pb);
                    match job.ty {
                        WType::Q4K | WType::Q5K => block_scales::<Q4K>(blk),
                        WType::Q6K => block_scales::<Q6K>(blk),
                        WType::Q3K => block_scales::<Q3K>(blk),
                        WType::Q2K => block_scales::<Q2K>(blk),
                        _ => block_scales::<IQ4XS>(blk),
                    }
                };
                let at = ((p - p0) * nb + b) * 8;
                pn.sm[at..at + 8].copy_from_slice(&v);
            }
        }
        Scales {
            base: pn.sm.as_ptr(),
            p0,
            nb,
        }
    }

    /// The vectors of block `b` of panel `p`.
    pub(crate) fn at(self, p: usize, b: usize) -> *const __m256i {
        self.base.wrapping_add(((p - self.p0) * self.nb + b) * 8)
    }

    /// Vectors from one panel's block to the next panel's.
    pub(crate) fn stride(self) -> usize {
        self.nb * 8
    }
}

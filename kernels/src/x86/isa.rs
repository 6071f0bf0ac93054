//! `isa`: the x86 integer dot-product instruction sets the quantized kernels run on ([`X86`]):
//! AVX2 `vpmaddubsw` + `vpmaddwd`, AVX-VNNI (VEX `vpdpbusd` / `vpdpwssd`) and AVX-512 VNNI
//! (EVEX, with AVX-512 BW/VL, 32 vector registers). The kernels of `x86` are written once,
//! generic over [`Dots`], and [`isa_entry!`] compiles each entry point once per set under its own
//! `target_feature`, so one binary carries every path and picks one at run time.
//!
//! Every path gives the same bits: `vpdpbusd(acc, u, s)` sums the same four products per i32
//! lane as `vpmaddwd(vpmaddubsw(u, s), 1)`, and the kernels only feed it products that do not
//! saturate `vpmaddubsw`'s i16 pairs (|u| <= 127 against Q8 activations in -127..=127, or
//! 4-bit/6-bit levels), so the integer lanes, and hence every float operation after them, are
//! identical.

use std::arch::x86_64::*;

/// An x86 kernel path (all of them need AVX2, FMA and F16C).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum X86 {
    Avx2,
    AvxVnni,
    Avx512Vnni,
}

impl X86 {
    /// Whether this CPU reports every feature the path is compiled for.
    pub(crate) fn available(self) -> bool {
        let base = is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c");
        base && match self {
            Self::Avx2 => true,
            Self::AvxVnni => is_x86_feature_detected!("avxvnni"),
            Self::Avx512Vnni => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
            }
        }
    }
}

/// The two integer multiply-accumulates of the quantized kernels, and the register tile that
/// fits the path's register file.
pub(crate) trait Dots {
    /// Activation rows per 4-weight-row register tile: its `4 x COLS` accumulators plus the
    /// loop's temporaries must fit the vector registers, or the tile spills accumulators to
    /// the stack every block and its speed starts to depend on where the loop lands in memory
    /// (BENCHMARKS.md, "code placement"). 16 ymm registers (AVX2, AVX-VNNI) hold a 4 x 2 tile;
    /// AVX-512's 32 hold 4 x 3. Results do not depend on it (tiles share loads, not arithmetic).
    const COLS: usize;
    /// The repacked-panel tile (`x86::panel32`, batches past the in-place tiles): 8-row panels
    /// per tile and activation rows per tile, sized the same way (`PANELS x PANEL_COLS` float
    /// accumulators and as many integer ones, plus the loop's temporaries, in the registers).
    const PANELS: usize;
    const PANEL_COLS: usize;
    /// `dpbusd` is one non-saturating instruction: unsigned bytes up to 255 may meet signed
    /// ones (AVX2's `vpmaddubsw` saturates its i16 pairs, so its callers keep the unsigned
    /// side at most 127, or 15 for nibbles).
    const VNNI: bool;
    /// `acc` plus, per i32 lane, the sum of its four `u8 x i8` byte products.
    ///
    /// # Safety
    /// The CPU has the implementor's features.
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i;
    /// `acc` plus, per i32 lane, the sum of its two `i16 x i16` products.
    ///
    /// # Safety
    /// The CPU has the implementor's features.
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i;
    /// 32 bytes, byte `j` equal to `byte` where bit `j` of `bits` is set and 0 elsewhere (a Q5
    /// block's fifth bits in place). AVX2: ggml's `bytes_from_bits_32` (a broadcast, a
    /// shuffle, an or and a compare), then an and; AVX-512: one masked move.
    ///
    /// # Safety
    /// The CPU has the implementor's features.
    #[inline(always)]
    unsafe fn bit_bytes(bits: u32, byte: i8) -> __m256i {
        // SAFETY: every path has AVX2.
        unsafe {
            let shuf = _mm256_set_epi64x(
                0x0303_0303_0303_0303,
                0x0202_0202_0202_0202,
                0x0101_0101_0101_0101,
                0,
            );
            let bytes = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), shuf);
            let bytes = _mm256_or_si256(bytes, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
            _mm256_and_si256(
                _mm256_cmpeq_epi8(bytes, _mm256_set1_epi64x(-1)),
                _mm256_set1_epi8(byte),
            )
        }
    }
}

/// AVX2: `vpmaddubsw` to i16 pairs, `vpmaddwd` by ones (or by the scales), `vpaddd`.
pub(crate) struct Avx2;
/// AVX-VNNI: the VEX-encoded 256-bit `vpdpbusd` / `vpdpwssd`.
pub(crate) struct AvxVnni;
/// AVX-512 VNNI + VL: the EVEX-encoded 256-bit forms (the functions stamped out for it are
/// also compiled with AVX-512 F/BW/VL, which gives the register allocator 32 vector registers).
pub(crate) struct Avx512Vnni;

impl Dots for Avx2 {
    const COLS: usize = 2;
    const PANELS: usize = 1;
    const PANEL_COLS: usize = 4;
    const VNNI: bool = false;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller runs on an AVX2 CPU.
        unsafe {
            let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
            _mm256_add_epi32(acc, p)
        }
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the caller runs on an AVX2 CPU.
        unsafe { _mm256_add_epi32(acc, _mm256_madd_epi16(a, b)) }
    }
}

impl Dots for AvxVnni {
    const COLS: usize = 2;
    const PANELS: usize = 1;
    const PANEL_COLS: usize = 6;
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller runs on an AVX-VNNI CPU.
        unsafe { _mm256_dpbusd_avx_epi32(acc, u, s) }
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the caller runs on an AVX-VNNI CPU.
        unsafe { _mm256_dpwssd_avx_epi32(acc, a, b) }
    }
}

impl Dots for Avx512Vnni {
    const COLS: usize = 3;
    const PANELS: usize = 2;
    const PANEL_COLS: usize = 6;
    const VNNI: bool = true;
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        // SAFETY: the caller runs on an AVX-512 VNNI + VL CPU.
        unsafe { _mm256_dpbusd_epi32(acc, u, s) }
    }
    #[inline(always)]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        // SAFETY: the caller runs on an AVX-512 VNNI + VL CPU.
        unsafe { _mm256_dpwssd_epi32(acc, a, b) }
    }
    #[inline(always)]
    unsafe fn bit_bytes(bits: u32, byte: i8) -> __m256i {
        // SAFETY: the caller runs on an AVX-512 BW + VL CPU.
        unsafe { _mm256_maskz_set1_epi8(bits, byte) }
    }
}

/// `isa_entry!(vis fn name(args) -> ret => generic);` defines `vis unsafe fn name(path: X86,
/// args) -> ret`, which runs `generic::<D>(args)` compiled under the features of `path`.
/// `generic` must be `#[inline(always)]` (as must everything generic below it) so that its
/// body, intrinsics included, is compiled inside the feature-enabled copy.
macro_rules! isa_entry {
    ($(#[$m:meta])* $vis:vis fn $name:ident($($a:ident: $t:ty),* $(,)?) $(-> $r:ty)? => $g:ident) => {
        $(#[$m])*
        ///
        /// # Safety
        /// `path` is available on this CPU ([`crate::x86::isa::X86::available`]).
        $vis unsafe fn $name(path: crate::x86::isa::X86, $($a: $t),*) $(-> $r)? {
            #[target_feature(enable = "avx2,fma,f16c")]
            fn avx2($($a: $t),*) $(-> $r)? {
                // SAFETY: compiled with (and only called on CPUs with) AVX2/FMA/F16C.
                unsafe { $g::<crate::x86::isa::Avx2>($($a),*) }
            }
            #[target_feature(enable = "avx2,fma,f16c,avxvnni")]
            fn avx_vnni($($a: $t),*) $(-> $r)? {
                // SAFETY: as above, plus AVX-VNNI.
                unsafe { $g::<crate::x86::isa::AvxVnni>($($a),*) }
            }
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            fn avx512_vnni($($a: $t),*) $(-> $r)? {
                // SAFETY: as above, plus AVX-512 F/BW/VL/VNNI.
                unsafe { $g::<crate::x86::isa::Avx512Vnni>($($a),*) }
            }
            // SAFETY: the caller checked `path` available.
            unsafe {
                match path {
                    crate::x86::isa::X86::Avx2 => avx2($($a),*),
                    crate::x86::isa::X86::AvxVnni => avx_vnni($($a),*),
                    crate::x86::isa::X86::Avx512Vnni => avx512_vnni($($a),*),
                }
            }
        }
    };
}
pub(crate) use isa_entry;

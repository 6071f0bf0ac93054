// Every quantized weight type's ggml block layout, written once for the device: `decode<T>`
// gives the 8 elements that lane t (0..3) of a group of 32 elements owns, as int8 levels q with
// one scale and offset, so that element = d * q + m. `mmvq.cu` feeds the levels to __dp4a
// against 8-bit activations (sum of x * w = d * (x . q) + m * sum of x); `dequant_elem` and
// `dequant_f16` (embedding rows, weights for cuBLAS) read the same decode. The Rust side's
// formulas are `tpslab_kernels::dequantize_row`; kernels/tests/cuda_sim.rs holds them equal.
//
// Which elements lane t owns: in the "split" layouts (4-bit levels packed low nibbles first, as
// Q4_0 and IQ4_NL pack them) elements 4t..4t+3 (`a`) and 16+4t..16+4t+3 (`b`); in the
// "contiguous" ones elements 8t..8t+3 (`a`) and 8t+4..8t+7 (`b`).
#pragma once
#include "common.cuh"

struct Levels {
    int a, b;   // four int8 levels each
    float d, m; // element = d * level + m
};

// Layout facts of a type: whether lane t's elements are split, whether m is ever non-zero.
template <int T>
struct BlockKind {
    static constexpr bool split = T == WT_Q4_0 || T == WT_Q4_1 || T == WT_Q5_0 || T == WT_Q5_1
                               || T == WT_IQ4NL || T == WT_IQ4XS || T == WT_MXFP4;
    static constexpr bool has_min = T == WT_Q4_1 || T == WT_Q5_1 || T == WT_Q4K || T == WT_Q5K
                                 || T == WT_Q2K;
};

// The element offsets (in the group of 32) of the first level of `a` and of `b`.
template <int T>
__device__ __forceinline__ int2 lane_elems(int t) {
    return BlockKind<T>::split ? make_int2(4 * t, 16 + 4 * t) : make_int2(8 * t, 8 * t + 4);
}

// Four bytes from an address that is only 2-byte aligned (blocks of 18, 22, 34, 110, 210 bytes).
__device__ __forceinline__ uint32_t ld32_2(const uint8_t* p) {
    return (uint32_t)ld16(p) | ((uint32_t)ld16(p + 2) << 16);
}

// Four bytes from an address of any alignment (MXFP4's 17-byte blocks).
__device__ __forceinline__ uint32_t ld32_1(const uint8_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

// Bit i of v (i < 4) to bit 4 of byte i: the fifth bits of Q5_0 and Q5_1.
__device__ __forceinline__ int spread_bit4(uint32_t v) {
    return (int)(((v << 4) & 0x10u) | ((v << 11) & 0x1000u) | ((v << 18) & 0x100000u) | ((v << 25) & 0x10000000u));
}

// The 16-entry int8 grid `t0..t3` (little-endian words) looked up by the 8 nibbles of q: x gets
// the low nibbles' values of q's four bytes, y the high nibbles' (llama.cpp's
// get_int_from_table_16).
__device__ __forceinline__ int2 grid16(uint32_t q, uint32_t t0, uint32_t t1, uint32_t t2, uint32_t t3) {
    uint32_t v[2];
    const uint32_t sel = 0x32103210u | ((q & 0x88888888u) >> 1);
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const uint32_t s = q >> (16 * i);
        const uint32_t lo = __byte_perm(t0, t1, s), hi = __byte_perm(t2, t3, s);
        v[i] = __byte_perm(lo, hi, sel >> (16 * i));
    }
    return make_int2((int)__byte_perm(v[0], v[1], 0x6420), (int)__byte_perm(v[0], v[1], 0x7531));
}

__device__ __forceinline__ int2 grid_iq4nl(uint32_t q) {
    return grid16(q, 0xbfad9881u, 0xf6eaddcfu, 0x26190d01u, 0x71594535u);
}

// ggml's e8m0 scale halved (its MXFP4 grid is doubled): 2^(e - 128), the lowest two subnormal.
__device__ __forceinline__ float e8m0_half(uint8_t e) {
    return __uint_as_float(e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23);
}

// Q3_K's 6-bit scale `is` (0..15) from its 12 packed bytes, minus 32.
__device__ __forceinline__ int q3k_scale(const uint8_t* s, int is) {
    const int lo = is < 8 ? (s[is] & 15) : (s[is - 8] >> 4);
    const int hi = (s[8 + (is & 3)] >> (2 * (is >> 2))) & 3;
    return (lo | (hi << 4)) - 32;
}

// Lane t's levels of group g (32 elements from the row's start) of a row of type T.
template <int T>
__device__ __forceinline__ Levels decode(const uint8_t* row, int g, int t) {
    Levels L;
    L.m = 0.0f;
    if (T == WT_Q4_0 || T == WT_IQ4NL) {
        const uint8_t* b = row + 18LL * g;
        const uint32_t q = ld32_2(b + 2 + 4 * t);
        L.d = h2f(ld16(b));
        if (T == WT_Q4_0) {
            L.a = __vsubss4(q & 0x0f0f0f0f, 0x08080808);
            L.b = __vsubss4((q >> 4) & 0x0f0f0f0f, 0x08080808);
        } else {
            const int2 v = grid_iq4nl(q);
            L.a = v.x;
            L.b = v.y;
        }
    } else if (T == WT_Q4_1) {
        const uint8_t* b = row + 20LL * g;
        const uint32_t q = *(const uint32_t*)(b + 4 + 4 * t);
        L.d = h2f(ld16(b));
        L.m = h2f(ld16(b + 2));
        L.a = q & 0x0f0f0f0f;
        L.b = (q >> 4) & 0x0f0f0f0f;
    } else if (T == WT_Q5_0 || T == WT_Q5_1) {
        const int bytes = T == WT_Q5_0 ? 22 : 24, qh_at = T == WT_Q5_0 ? 2 : 4;
        const uint8_t* b = row + (long long)bytes * g;
        const uint32_t qh = ld32_2(b + qh_at), q = ld32_2(b + qh_at + 4 + 4 * t);
        L.d = h2f(ld16(b));
        const int lo = (q & 0x0f0f0f0f) | spread_bit4(qh >> (4 * t));
        const int hi = ((q >> 4) & 0x0f0f0f0f) | spread_bit4(qh >> (16 + 4 * t));
        if (T == WT_Q5_0) {
            L.a = __vsubss4(lo, 0x10101010);
            L.b = __vsubss4(hi, 0x10101010);
        } else {
            L.m = h2f(ld16(b + 2));
            L.a = lo;
            L.b = hi;
        }
    } else if (T == WT_Q8_0) {
        const uint8_t* b = row + 34LL * g;
        L.d = h2f(ld16(b));
        L.a = (int)ld32_2(b + 2 + 8 * t);
        L.b = (int)ld32_2(b + 6 + 8 * t);
    } else if (T == WT_MXFP4) {
        const uint8_t* b = row + 17LL * g;
        const int2 v = grid16(ld32_1(b + 1 + 4 * t), 0x03020100u, 0x0c080604u, 0xfdfeff00u, 0xf4f8fafcu);
        L.d = e8m0_half(b[0]);
        L.a = v.x;
        L.b = v.y;
    } else if (T == WT_IQ4XS) {
        const int ib = g & 7;
        const uint8_t* b = row + 136LL * (g >> 3);
        const int ls = ((b[4 + (ib >> 1)] >> (4 * (ib & 1))) & 15) | (((ld16(b + 2) >> (2 * ib)) & 3) << 4);
        const int2 v = grid_iq4nl(*(const uint32_t*)(b + 8 + 16 * ib + 4 * t));
        L.d = h2f(ld16(b)) * (float)(ls - 32);
        L.a = v.x;
        L.b = v.y;
    } else if (T == WT_Q4K || T == WT_Q5K) {
        // Sub-block s of 32: bytes 32 (s / 2) + l of the nibbles, low nibbles for even s.
        const int s = g & 7, bytes = T == WT_Q4K ? 144 : 176, qs_at = T == WT_Q4K ? 16 : 48;
        const uint8_t* b = row + (long long)bytes * (g >> 3);
        int sc, mn;
        scale_min_k4(s, b + 4, &sc, &mn);
        const uint8_t* q = b + qs_at + 32 * (s >> 1) + 8 * t;
        const int sh = 4 * (s & 1);
        L.a = (int)((*(const uint32_t*)q >> sh) & 0x0f0f0f0fu);
        L.b = (int)((*(const uint32_t*)(q + 4) >> sh) & 0x0f0f0f0fu);
        if (T == WT_Q5K) { // fifth bit of element l: bit s of qh[l]
            const uint8_t* qh = b + 16 + 8 * t;
            L.a |= (int)(((*(const uint32_t*)qh >> s) & 0x01010101u) << 4);
            L.b |= (int)(((*(const uint32_t*)(qh + 4) >> s) & 0x01010101u) << 4);
        }
        L.d = h2f(ld16(b)) * (float)sc;
        L.m = -h2f(ld16(b + 2)) * (float)mn;
    } else if (T == WT_Q6K) {
        // Sub-block s: half h = s / 4 of 128, quarter s % 4: low nibbles of ql[64h + 32 (s & 1)
        // + l] (high for quarters 2, 3), two bits 2 (s % 4) of qh[128 + 32h + l]; scale
        // 8h + 2 (s % 4) + l / 16.
        const int s = g & 7, h = s >> 2, qu = s & 3;
        const uint8_t* b = row + 210LL * (g >> 3);
        const uint8_t* ql = b + 64 * h + 32 * (qu & 1) + 8 * t;
        const uint8_t* qh = b + 128 + 32 * h + 8 * t;
        const int lsh = 4 * (qu >> 1), hsh = 2 * qu;
        const uint32_t l0 = ld32_2(ql), l1 = ld32_2(ql + 4), h0 = ld32_2(qh), h1 = ld32_2(qh + 4);
        L.a = __vsubss4((int)(((l0 >> lsh) & 0x0f0f0f0fu) | (((h0 >> hsh) & 0x03030303u) << 4)), 0x20202020);
        L.b = __vsubss4((int)(((l1 >> lsh) & 0x0f0f0f0fu) | (((h1 >> hsh) & 0x03030303u) << 4)), 0x20202020);
        L.d = h2f(ld16(b + 208)) * (float)(int8_t)b[192 + 8 * h + 2 * qu + (t >> 1)];
    } else if (T == WT_Q2K) {
        // Group j of 4 in half n of 128: bits 2j of qs[32n + l]; scale / min byte 8n + 2j + l / 16.
        const int s = g & 7, n = s >> 2, j = s & 3;
        const uint8_t* b = row + 84LL * (g >> 3);
        const uint8_t* q = b + 16 + 32 * n + 8 * t;
        L.a = (int)((*(const uint32_t*)q >> (2 * j)) & 0x03030303u);
        L.b = (int)((*(const uint32_t*)(q + 4) >> (2 * j)) & 0x03030303u);
        const uint8_t sm = b[8 * n + 2 * j + (t >> 1)];
        L.d = h2f(ld16(b + 80)) * (float)(sm & 15);
        L.m = -h2f(ld16(b + 82)) * (float)(sm >> 4);
    } else { // WT_Q3K: as Q2_K's levels, minus 4 where bit 4n + j of hmask[l] is clear
        const int s = g & 7, n = s >> 2, j = s & 3;
        const uint8_t* b = row + 110LL * (g >> 3);
        const uint8_t* q = b + 32 + 32 * n + 8 * t;
        const uint8_t* hm = b + 8 * t;
        const uint32_t hb0 = (ld32_2(hm) >> (4 * n + j)) & 0x01010101u;
        const uint32_t hb1 = (ld32_2(hm + 4) >> (4 * n + j)) & 0x01010101u;
        L.a = __vsubss4((int)((ld32_2(q) >> (2 * j)) & 0x03030303u), (int)((hb0 ^ 0x01010101u) << 2));
        L.b = __vsubss4((int)((ld32_2(q + 4) >> (2 * j)) & 0x03030303u), (int)((hb1 ^ 0x01010101u) << 2));
        L.d = h2f(ld16(b + 108)) * (float)q3k_scale(b + 96, 8 * n + 2 * j + (t >> 1));
    }
    return L;
}

// Element e of a row of type t (the plain, slow path: embedding rows, and dequantization).
template <int T>
__device__ __forceinline__ float quant_elem(const uint8_t* row, int e) {
    const int w = e & 31;
    const int t = BlockKind<T>::split ? (w & 15) >> 2 : w >> 3;
    const bool in_b = BlockKind<T>::split ? w >= 16 : (w & 7) >= 4;
    const Levels L = decode<T>(row, e >> 5, t);
    return L.d * (float)(int8_t)((in_b ? L.b : L.a) >> (8 * (w & 3))) + L.m;
}

__device__ __forceinline__ float dequant_elem(int t, const uint8_t* row, int e) {
    switch (t) {
    case WT_F32: return ((const float*)row)[e];
    case WT_F16: return h2f(((const uint16_t*)row)[e]);
    case WT_BF16: return bf2f(((const uint16_t*)row)[e]);
    case WT_Q4_0: return quant_elem<WT_Q4_0>(row, e);
    case WT_Q4_1: return quant_elem<WT_Q4_1>(row, e);
    case WT_Q8_0: return quant_elem<WT_Q8_0>(row, e);
    case WT_Q4K: return quant_elem<WT_Q4K>(row, e);
    case WT_Q6K: return quant_elem<WT_Q6K>(row, e);
    case WT_Q5K: return quant_elem<WT_Q5K>(row, e);
    case WT_Q5_0: return quant_elem<WT_Q5_0>(row, e);
    case WT_Q5_1: return quant_elem<WT_Q5_1>(row, e);
    case WT_Q2K: return quant_elem<WT_Q2K>(row, e);
    case WT_Q3K: return quant_elem<WT_Q3K>(row, e);
    case WT_IQ4NL: return quant_elem<WT_IQ4NL>(row, e);
    case WT_IQ4XS: return quant_elem<WT_IQ4XS>(row, e);
    default: return quant_elem<WT_MXFP4>(row, e);
    }
}

// The 32 elements of group g of a row of type T.
template <int T>
__device__ __forceinline__ void group_values(const uint8_t* row, int g, float (&v)[32]) {
#pragma unroll
    for (int t = 0; t < 4; t++) {
        const Levels L = decode<T>(row, g, t);
        const int2 at = lane_elems<T>(t);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            v[at.x + i] = L.d * (float)(int8_t)(L.a >> (8 * i)) + L.m;
            v[at.y + i] = L.d * (float)(int8_t)(L.b >> (8 * i)) + L.m;
        }
    }
}

// The 32 elements of group g (elements 32g..32g+31) of a row of any type.
__device__ __forceinline__ void dequant_group(int t, const uint8_t* row, int g, float (&v)[32]) {
    switch (t) {
    case WT_Q4_0: return group_values<WT_Q4_0>(row, g, v);
    case WT_Q4_1: return group_values<WT_Q4_1>(row, g, v);
    case WT_Q8_0: return group_values<WT_Q8_0>(row, g, v);
    case WT_Q4K: return group_values<WT_Q4K>(row, g, v);
    case WT_Q6K: return group_values<WT_Q6K>(row, g, v);
    case WT_Q5K: return group_values<WT_Q5K>(row, g, v);
    case WT_Q5_0: return group_values<WT_Q5_0>(row, g, v);
    case WT_Q5_1: return group_values<WT_Q5_1>(row, g, v);
    case WT_Q2K: return group_values<WT_Q2K>(row, g, v);
    case WT_Q3K: return group_values<WT_Q3K>(row, g, v);
    case WT_IQ4NL: return group_values<WT_IQ4NL>(row, g, v);
    case WT_IQ4XS: return group_values<WT_IQ4XS>(row, g, v);
    case WT_MXFP4: return group_values<WT_MXFP4>(row, g, v);
    default:
        for (int l = 0; l < 32; l++) v[l] = dequant_elem(t, row, 32 * g + l);
    }
}

// Shared device helpers for TPS Lab's CUDA kernels: weight type ids (the order of the Rust
// `WType`), ggml block layouts, warp and block reductions.
#pragma once
#ifdef TPSLAB_SIM
#include "sim/sim.h"
#else
#include <cuda_fp16.h>
#endif
#include <stdint.h>

// Weight type ids, as `tpslab_kernels::cuda::wtype_id` numbers them.
#define WT_F32 0
#define WT_F16 1
#define WT_BF16 2
#define WT_Q4_0 3
#define WT_Q4_1 4
#define WT_Q8_0 5
#define WT_Q4K 6
#define WT_Q6K 7
#define WT_Q5K 8

__device__ __forceinline__ float h2f(uint16_t bits) {
    return __half2float(__ushort_as_half(bits));
}

__device__ __forceinline__ float bf2f(uint16_t bits) {
    return __uint_as_float(((uint32_t)bits) << 16);
}

__device__ __forceinline__ uint16_t ld16(const uint8_t* p) {
    return *(const uint16_t*)p;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
    __shared__ float part[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) part[warp] = v;
    __syncthreads();
    const int nw = blockDim.x >> 5;
    v = lane < nw ? part[lane] : 0.0f;
    return warp_sum(v);
}

// ggml get_scale_min_k4: scale and min of sub-block j (0..8) from the 12 packed bytes.
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* q, int* sc, int* m) {
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

__host__ __device__ constexpr int wt_block(int t) {
    return t <= WT_BF16 ? 1 : (t <= WT_Q8_0 ? 32 : 256);
}

__host__ __device__ constexpr int wt_bytes(int t) {
    return t == WT_F32 ? 4 : t == WT_F16 ? 2 : t == WT_BF16 ? 2 : t == WT_Q4_0 ? 18
         : t == WT_Q4_1 ? 20 : t == WT_Q8_0 ? 34 : t == WT_Q4K ? 144 : t == WT_Q5K ? 176 : 210;
}

// Element e of a row of type t (the plain, slow path: embedding lookup and dequantization).
__device__ __forceinline__ float dequant_elem(int t, const uint8_t* row, int e) {
    switch (t) {
    case WT_F32: return ((const float*)row)[e];
    case WT_F16: return h2f(((const uint16_t*)row)[e]);
    case WT_BF16: return bf2f(((const uint16_t*)row)[e]);
    case WT_Q4_0: {
        const uint8_t* b = row + (e >> 5) * 18;
        const int j = e & 31;
        const uint8_t q = b[2 + (j & 15)];
        const int nib = j < 16 ? (q & 15) : (q >> 4);
        return h2f(ld16(b)) * (float)(nib - 8);
    }
    case WT_Q4_1: {
        const uint8_t* b = row + (e >> 5) * 20;
        const int j = e & 31;
        const uint8_t q = b[4 + (j & 15)];
        const int nib = j < 16 ? (q & 15) : (q >> 4);
        return h2f(ld16(b)) * (float)nib + h2f(ld16(b + 2));
    }
    case WT_Q8_0: {
        const uint8_t* b = row + (e >> 5) * 34;
        return h2f(ld16(b)) * (float)(int8_t)b[2 + (e & 31)];
    }
    case WT_Q4K: {
        const uint8_t* b = row + (e >> 8) * 144;
        const int r = e & 255, g = r >> 6, w = r & 63, l = w & 31;
        const int sub = 2 * g + (w >= 32);
        int sc, m;
        scale_min_k4(sub, b + 4, &sc, &m);
        const uint8_t q = b[16 + 32 * g + l];
        const int nib = w < 32 ? (q & 15) : (q >> 4);
        return h2f(ld16(b)) * (float)sc * (float)nib - h2f(ld16(b + 2)) * (float)m;
    }
    default: { // WT_Q6K
        const uint8_t* b = row + (e >> 8) * 210;
        const int r = e & 255, h = r >> 7, rr = r & 127, quarter = rr >> 5, l = rr & 31;
        const uint8_t* ql = b + 64 * h;
        const uint8_t qh = b[128 + 32 * h + l];
        const int lo = quarter == 0 ? (ql[l] & 15) : quarter == 1 ? (ql[32 + l] & 15)
                     : quarter == 2 ? (ql[l] >> 4) : (ql[32 + l] >> 4);
        const int hi = (qh >> (2 * quarter)) & 3;
        const int q = (lo | (hi << 4)) - 32;
        const int is = 8 * h + 2 * quarter + l / 16;
        return h2f(ld16(b + 208)) * (float)(int8_t)b[192 + is] * (float)q;
    }
    }
}

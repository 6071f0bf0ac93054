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
#define WT_Q5_0 9
#define WT_Q5_1 10
#define WT_Q2K 11
#define WT_Q3K 12
#define WT_IQ4NL 13
#define WT_IQ4XS 14
#define WT_MXFP4 15

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

// A head's attention sink joining a softmax's sum of max `m`, sum `L` and weighted output `o`
// (gpt-oss; ggml's soft_max with sinks): the max becomes the larger of the two, what was summed
// is rescaled to it, and exp(sink - max) is added to the sum.
__device__ __forceinline__ void add_sink(float sink, float m, float& L, float& o) {
    const float m2 = fmaxf(m, sink), r = expf(m - m2);
    L = L * r + expf(sink - m2);
    o *= r;
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

// Bytes of one block of the 32-element types matvec.cu reads directly.
__host__ __device__ constexpr int wt_bytes(int t) {
    return t == WT_Q4_0 ? 18 : t == WT_Q4_1 ? 20 : 34;
}

// d += A . B on the tensor cores, one warp: A 16x16 f16 (row major), B 16x8 f16 (column major),
// D 16x8 f32 (PTX mma.sync m16n8k16, sm_80 on; PTX ISA 9.7.14.5.8, "Matrix Fragments for
// mma.m16n8k16 with floating point type"). With g = lane / 4, t = lane % 4, the lane holds
// a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..];
// b[0] = B[2t..2t+1][g], b[1] = B[2t+8..2t+9][g]; d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..].
// The simulator emulates it lane by lane from these layouts (sim.h `mma_f16_16816`).
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef TPSLAB_SIM
    sim::mma_f16_16816(d, a, b);
#else
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

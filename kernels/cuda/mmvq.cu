// Integer-dot matrix-vector kernels for every quantized type (llama.cpp's mmvq idea): the activations
// are first quantized to 8 bits in blocks of 32 (`quantize_q8`: d = amax / 127, q = round(x / d)),
// then each weight sub-block meets its activation block through __dp4a. Reading 1 byte of
// activation per weight instead of 4 is what lets a 4.5-bit weight stream run near the memory
// bandwidth: with f32 activations (matvec.cu) the activation reads through L1 were 8x the
// weight bytes and bounded Q4_K at 18% of the bandwidth floor on an H200.
//
// Layout of the quantized activations: q[r * k + e] (int8) and d[r * (k / 32) + e / 32] (f32).
// One warp per weight row, M activation rows (M <= 8) per launch, f32 accumulation; `mmvq_swiglu`
// also fuses a SwiGLU FFN's gating into its gate-up product (a warp per gate/up row pair).
//
// Q4_K, Q5_K and Q6_K have row kernels of their own below; every other quantized type runs
// `row_g` over its blocks.cuh decode. None has run on a GPU yet: kernels/tests/cuda_sim.rs
// checks them on the CPU simulator, tests/gpu/gpu-check.sh on a GPU. For the types that also
// have f32-activation kernels (matvec.cu) they stay off unless TPSLAB_CUDA_MMVQ=1 until a GPU
// run proves them.
#include "blocks.cuh"

// One warp per 32 values. k (and so the whole buffer) is a multiple of 32 for every K-quant.
extern "C" __global__ void quantize_q8(const float* x, int8_t* q, float* d, long long nblocks) {
    const long long b = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (b >= nblocks) return;
    const int lane = threadIdx.x & 31;
    const float v = x[32 * b + lane];
    const float amax = warp_max(fabsf(v));
    const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
    q[32 * b + lane] = (int8_t)__float2int_rn(v * inv);
    if (lane == 0) d[b] = amax / 127.0f;
}

__device__ __forceinline__ int dot8(int w0, int w1, int2 x) {
    return __dp4a(w1, x.y, __dp4a(w0, x.x, 0));
}

__device__ __forceinline__ int sum8(int2 x) {
    return __dp4a(0x01010101, x.y, __dp4a(0x01010101, x.x, 0));
}

// Q4_K and Q5_K: half a warp per 256-weight super-block; lane h (0..15) takes 8 weights of
// sub-block 2j (elements 64j + off + 0..7, low nibbles) and the 8 of sub-block 2j + 1 at
// +32 (high nibbles), j = h / 4, off = 8 * (h % 4). Q5_K adds the fifth bit from qh.
template <int T, int M>
__device__ __forceinline__ void row_k4(const uint8_t* wr, const int8_t* xq, const float* xd, int k,
                                       int m, float (&acc)[M]) {
    constexpr int bytes = T == WT_Q4K ? 144 : 176;
    constexpr int qs_at = T == WT_Q4K ? 16 : 48;
    const int lane = threadIdx.x & 31, hl = lane & 15, j = hl >> 2, off = 8 * (hl & 3);
    const long long kb = k / 32;
#pragma unroll 2
    for (int u = lane >> 4; u < k / 256; u += 2) {
        const uint8_t* b = wr + (long long)u * bytes;
        const float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
        int sc1, m1, sc2, m2;
        scale_min_k4(2 * j, b + 4, &sc1, &m1);
        scale_min_k4(2 * j + 1, b + 4, &sc2, &m2);
        const uint2 qq = *(const uint2*)(b + qs_at + 32 * j + off);
        int lo0 = qq.x & 0x0f0f0f0f, lo1 = qq.y & 0x0f0f0f0f;
        int hi0 = (qq.x >> 4) & 0x0f0f0f0f, hi1 = (qq.y >> 4) & 0x0f0f0f0f;
        if (T == WT_Q5K) {
            const uint2 qh = *(const uint2*)(b + 16 + off);
            lo0 |= ((qh.x >> (2 * j)) & 0x01010101) << 4;
            lo1 |= ((qh.y >> (2 * j)) & 0x01010101) << 4;
            hi0 |= ((qh.x >> (2 * j + 1)) & 0x01010101) << 4;
            hi1 |= ((qh.y >> (2 * j + 1)) & 0x01010101) << 4;
        }
        const long long e0 = 256LL * u + 64 * j + off, blk = 8LL * u + 2 * j;
#pragma unroll
        for (int r = 0; r < M; r++) {
            if (r >= m) break;
            const int8_t* xr = xq + r * (long long)k + e0;
            const int2 xl = *(const int2*)xr, xh = *(const int2*)(xr + 32);
            const float dl = xd[r * kb + blk], dh = xd[r * kb + blk + 1];
            acc[r] += d * (dl * (float)(sc1 * dot8(lo0, lo1, xl)) + dh * (float)(sc2 * dot8(hi0, hi1, xh)))
                    - dmin * (dl * (float)(m1 * sum8(xl)) + dh * (float)(m2 * sum8(xh)));
        }
    }
}

// Q6_K: the warp takes one super-block; lane (h, q, t) = (lane / 16, lane / 4 % 4, lane % 4)
// takes elements 128h + 32q + 8t + 0..7, which share one scale. Blocks are 210 bytes, so the
// weight bytes are read 16 bits at a time.
template <int M>
__device__ __forceinline__ void row_q6k(const uint8_t* wr, const int8_t* xq, const float* xd, int k,
                                        int m, float (&acc)[M]) {
    const int lane = threadIdx.x & 31, h = lane >> 4, q = (lane >> 2) & 3, t = lane & 3;
    const long long kb = k / 32;
    const int ql_at = 64 * h + 32 * (q & 1) + 8 * t, qh_at = 128 + 32 * h + 8 * t;
    const int lo_shift = 4 * (q >> 1), hi_shift = 2 * q;
    for (int u = 0; u < k / 256; u++) {
        const uint8_t* b = wr + (long long)u * 210;
        int v[2];
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const uint32_t ql = ld16(b + ql_at + 4 * i) | ((uint32_t)ld16(b + ql_at + 4 * i + 2) << 16);
            const uint32_t qh = ld16(b + qh_at + 4 * i) | ((uint32_t)ld16(b + qh_at + 4 * i + 2) << 16);
            const int q6 = ((ql >> lo_shift) & 0x0f0f0f0f) | (((qh >> hi_shift) & 0x03030303) << 4);
            v[i] = __vsubss4(q6, 0x20202020);
        }
        const float ds = h2f(ld16(b + 208)) * (float)(int8_t)b[192 + 8 * h + 2 * q + (t >> 1)];
        const long long e0 = 256LL * u + 128 * h + 32 * q + 8 * t, blk = 8LL * u + 4 * h + q;
#pragma unroll
        for (int r = 0; r < M; r++) {
            if (r >= m) break;
            const int2 x = *(const int2*)(xq + r * (long long)k + e0);
            acc[r] += ds * xd[r * kb + blk] * (float)dot8(v[0], v[1], x);
        }
    }
}


// Any type with a blocks.cuh decode: each group of 32 weights is taken by 4 lanes (8 weights
// each, `decode`), so a warp covers 8 groups (256 weights) a step and k need only be a multiple
// of 32. Partial sums are exact integers per lane and group (dp4a), scaled once.
template <int T, int M>
__device__ __forceinline__ void row_g(const uint8_t* wr, const int8_t* xq, const float* xd, int k,
                                      int m, float (&acc)[M]) {
    const int lane = threadIdx.x & 31, t = lane & 3;
    const int groups = k / 32;
    const int2 at = lane_elems<T>(t);
#pragma unroll 2
    for (int g = lane >> 2; g < groups; g += 8) {
        const Levels L = decode<T>(wr, g, t);
#pragma unroll
        for (int r = 0; r < M; r++) {
            if (r >= m) break;
            const int8_t* xr = xq + r * (long long)k + 32LL * g;
            const int xa = *(const int*)(xr + at.x), xb = *(const int*)(xr + at.y);
            float s = L.d * (float)__dp4a(L.b, xb, __dp4a(L.a, xa, 0));
            if (BlockKind<T>::has_min) s += L.m * (float)__dp4a(0x01010101, xb, __dp4a(0x01010101, xa, 0));
            acc[r] += xd[r * (long long)groups + g] * s;
        }
    }
}

// This lane's share of x[r] . W-row for r < m: the kernels of each type above.
template <int T, int M>
__device__ __forceinline__ void row_dot(const uint8_t* wr, const int8_t* xq, const float* xd, int k,
                                        int m, float (&acc)[M]) {
#pragma unroll
    for (int r = 0; r < M; r++) acc[r] = 0.0f;
    if (T == WT_Q4K || T == WT_Q5K) row_k4<T == WT_Q5K ? WT_Q5K : WT_Q4K, M>(wr, xq, xd, k, m, acc);
    else if (T == WT_Q6K) row_q6k<M>(wr, xq, xd, k, m, acc);
    else row_g<T, M>(wr, xq, xd, k, m, acc);
}

// y[r * ldy + row] = x[r] . W[row] for r < m (m <= M), rows < n: a warp per row, 4 a block.
template <int T, int M>
__device__ __forceinline__ void mmvq(const uint8_t* w, long long row_bytes, const int8_t* xq,
                                     const float* xd, float* y, int n, int k, int m, int ldy) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    float acc[M];
    row_dot<T, M>(w + (long long)row * row_bytes, xq, xd, k, m, acc);
#pragma unroll
    for (int r = 0; r < M; r++) {
        const float s = warp_sum(acc[r]);
        if (r < m && (threadIdx.x & 31) == 0) y[(long long)r * ldy + row] = s;
    }
}

// The gate-up product of a SwiGLU FFN with its gating fused: W is [gate | up] (2 ffn rows);
// y[r * ffn + c] = silu(x[r] . W[c]) * (x[r] . W[ffn + c]) for c < ffn, as elementwise.cu's
// `swiglu` computes it from the product. A warp per c, both rows' dots.
template <int T, int M>
__device__ __forceinline__ void mmvq_swiglu(const uint8_t* w, long long row_bytes, const int8_t* xq,
                                            const float* xd, float* y, int ffn, int k, int m) {
    const int c = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (c >= ffn) return;
    float gate[M], up[M];
    row_dot<T, M>(w + (long long)c * row_bytes, xq, xd, k, m, gate);
    row_dot<T, M>(w + (long long)(ffn + c) * row_bytes, xq, xd, k, m, up);
#pragma unroll
    for (int r = 0; r < M; r++) {
        const float g = warp_sum(gate[r]), u = warp_sum(up[r]);
        if (r < m && (threadIdx.x & 31) == 0) y[(long long)r * ffn + c] = g / (1.0f + expf(-g)) * u;
    }
}

#define MMVQ(name, T, M)                                                                         \
    extern "C" __global__ void mmvq_##name##_##M(const uint8_t* w, long long row_bytes,          \
                                                 const int8_t* xq, const float* xd, float* y,    \
                                                 int n, int k, int m, int ldy) {                 \
        mmvq<T, M>(w, row_bytes, xq, xd, y, n, k, m, ldy);                                       \
    }                                                                                            \
    extern "C" __global__ void mmvq_swiglu_##name##_##M(const uint8_t* w, long long row_bytes,   \
                                                        const int8_t* xq, const float* xd,       \
                                                        float* y, int ffn, int k, int m) {       \
        mmvq_swiglu<T, M>(w, row_bytes, xq, xd, y, ffn, k, m);                                   \
    }
#define MMVQ_ALL(name, T) MMVQ(name, T, 1) MMVQ(name, T, 2) MMVQ(name, T, 4) MMVQ(name, T, 8)

MMVQ_ALL(q4_0, WT_Q4_0)
MMVQ_ALL(q4_1, WT_Q4_1)
MMVQ_ALL(q8_0, WT_Q8_0)
MMVQ_ALL(q4_k, WT_Q4K)
MMVQ_ALL(q6_k, WT_Q6K)
MMVQ_ALL(q5_k, WT_Q5K)
MMVQ_ALL(q5_0, WT_Q5_0)
MMVQ_ALL(q5_1, WT_Q5_1)
MMVQ_ALL(q2_k, WT_Q2K)
MMVQ_ALL(q3_k, WT_Q3K)
MMVQ_ALL(iq4_nl, WT_IQ4NL)
MMVQ_ALL(iq4_xs, WT_IQ4XS)
MMVQ_ALL(mxfp4, WT_MXFP4)

// Dequantizing matrix-vector and small-batch products: y[r][row] = x[r] . W[row] for up to M
// activation rows at once, reading each weight byte once. One warp per output row, weights in
// their ggml block layout, activations f32, accumulation f32.
#include "common.cuh"

// Rows of W per warp for a kernel of M activation rows (each activation value loaded then serves
// R weight rows). Measured on an H200 (llama-3-8b, one sequence): R = 4 was slower than R = 1
// (10.7 vs 7.4 ms a step in F16, 8.1 vs 6.9 in Q4_K): fewer warps in flight hurt more than the
// extra activation loads, which hit L1. Kept as a parameter for batch kernels to tune.
template <int M>
struct RowsPerWarp {
    static constexpr int R = 1;
};

__device__ __forceinline__ float dot4f(float4 a, float b0, float b1, float b2, float b3) {
    return a.x * b0 + a.y * b1 + a.z * b2 + a.w * b3;
}

// acc[r][rr] += x[r] . W[rr] over the whole row, for r < m activation rows and rr < nr weight
// rows starting at `w` (row_bytes apart). The lanes of a warp split the row.
template <int T, int M, int R>
__device__ __forceinline__ void rows_dot(const uint8_t* w, long long row_bytes, int nr,
                                         const float* x, int k, int m, float (&acc)[M][R]) {
    const int lane = threadIdx.x & 31;
    if (T == WT_F32) {
        for (int u = lane; u < k / 4; u += 32) {
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (r >= m) break;
                const float4 xv = *(const float4*)(x + r * (long long)k + 4LL * u);
#pragma unroll
                for (int rr = 0; rr < R; rr++) {
                    if (rr >= nr) break;
                    const float4 wv = ((const float4*)(w + rr * row_bytes))[u];
                    acc[r][rr] += dot4f(xv, wv.x, wv.y, wv.z, wv.w);
                }
            }
        }
    } else if (T == WT_F16 || T == WT_BF16) {
#pragma unroll 2
        for (int u = lane; u < k / 8; u += 32) {
            float f[R][8];
#pragma unroll
            for (int rr = 0; rr < R; rr++) {
                const uint4 raw = rr < nr ? ((const uint4*)(w + rr * row_bytes))[u] : make_uint4(0, 0, 0, 0);
                const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    const uint16_t lo = words[j] & 0xffff, hi = words[j] >> 16;
                    f[rr][2 * j] = T == WT_F16 ? h2f(lo) : bf2f(lo);
                    f[rr][2 * j + 1] = T == WT_F16 ? h2f(hi) : bf2f(hi);
                }
            }
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (r >= m) break;
                const float4 a = *(const float4*)(x + r * (long long)k + 8LL * u);
                const float4 b = *(const float4*)(x + r * (long long)k + 8LL * u + 4);
#pragma unroll
                for (int rr = 0; rr < R; rr++)
                    acc[r][rr] += dot4f(a, f[rr][0], f[rr][1], f[rr][2], f[rr][3])
                                + dot4f(b, f[rr][4], f[rr][5], f[rr][6], f[rr][7]);
            }
        }
    } else if (T == WT_Q4_0 || T == WT_Q4_1 || T == WT_Q8_0) {
        constexpr int bytes = wt_bytes(T);
        constexpr int qoff = T == WT_Q4_1 ? 4 : 2;
        for (int u = lane; u < k / 32; u += 32) {
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (r >= m) break;
                const float* xr = x + r * (long long)k + 32LL * u;
                float xv[32];
                float xs = 0.0f;
#pragma unroll
                for (int j = 0; j < 32; j += 4) {
                    const float4 v = *(const float4*)(xr + j);
                    xv[j] = v.x; xv[j + 1] = v.y; xv[j + 2] = v.z; xv[j + 3] = v.w;
                    xs += v.x + v.y + v.z + v.w;
                }
#pragma unroll
                for (int rr = 0; rr < R; rr++) {
                    if (rr >= nr) break;
                    const uint8_t* b = w + rr * row_bytes + (long long)u * bytes;
                    const float d = h2f(ld16(b));
                    float s = 0.0f;
                    if (T == WT_Q8_0) {
#pragma unroll
                        for (int j = 0; j < 16; j++) {
                            const uint16_t v = ld16(b + 2 + 2 * j);
                            s += xv[2 * j] * (float)(int8_t)(v & 0xff) + xv[2 * j + 1] * (float)(int8_t)(v >> 8);
                        }
                        acc[r][rr] += d * s;
                    } else {
#pragma unroll
                        for (int j = 0; j < 8; j++) {
                            const uint16_t v = ld16(b + qoff + 2 * j);
                            s += xv[2 * j] * (float)(v & 15) + xv[2 * j + 1] * (float)((v >> 8) & 15)
                               + xv[16 + 2 * j] * (float)((v >> 4) & 15) + xv[17 + 2 * j] * (float)(v >> 12);
                        }
                        if (T == WT_Q4_0) acc[r][rr] += d * (s - 8.0f * xs);
                        else acc[r][rr] += d * s + h2f(ld16(b + 2)) * xs;
                    }
                }
            }
        }
    } else if (T == WT_Q4K) {
        // Each half-warp takes one 256-element super-block; lane h (0..15) reads 8 bytes of
        // nibbles: elements 64j + off + 0..7 (low nibbles) and 64j + 32 + off + 0..7 (high).
        // (A quarter-warp with 16 bytes a lane, decoding scales half as often, measured slower
        // on an H200: llama-3-8b Q4_K at one sequence 133 vs 161 tok/s.)
        const int hl = lane & 15, j = hl >> 2, off = 8 * (hl & 3);
#pragma unroll 2
        for (int u = lane >> 4; u < k / 256; u += 2) {
            const long long e0 = 256LL * u + 64 * j + off;
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (r >= m) break;
                const float* xr = x + r * (long long)k + e0;
                const float4 lo0 = *(const float4*)xr, lo1 = *(const float4*)(xr + 4);
                const float4 hi0 = *(const float4*)(xr + 32), hi1 = *(const float4*)(xr + 36);
                const float xl = lo0.x + lo0.y + lo0.z + lo0.w + lo1.x + lo1.y + lo1.z + lo1.w;
                const float xh = hi0.x + hi0.y + hi0.z + hi0.w + hi1.x + hi1.y + hi1.z + hi1.w;
#pragma unroll
                for (int rr = 0; rr < R; rr++) {
                    if (rr >= nr) break;
                    const uint8_t* b = w + rr * row_bytes + (long long)u * 144;
                    const float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
                    int sc1, m1, sc2, m2;
                    scale_min_k4(2 * j, b + 4, &sc1, &m1);
                    scale_min_k4(2 * j + 1, b + 4, &sc2, &m2);
                    const uint2 qq = *(const uint2*)(b + 16 + 32 * j + off);
                    const uint32_t a = qq.x, c = qq.y;
                    const float sl = dot4f(lo0, (float)(a & 15), (float)((a >> 8) & 15), (float)((a >> 16) & 15), (float)((a >> 24) & 15))
                                   + dot4f(lo1, (float)(c & 15), (float)((c >> 8) & 15), (float)((c >> 16) & 15), (float)((c >> 24) & 15));
                    const float sh = dot4f(hi0, (float)((a >> 4) & 15), (float)((a >> 12) & 15), (float)((a >> 20) & 15), (float)(a >> 28))
                                   + dot4f(hi1, (float)((c >> 4) & 15), (float)((c >> 12) & 15), (float)((c >> 20) & 15), (float)(c >> 28));
                    acc[r][rr] += d * ((float)sc1 * sl + (float)sc2 * sh) - dmin * ((float)m1 * xl + (float)m2 * xh);
                }
            }
        }
    } else { // WT_Q6K: the warp takes one super-block; lane l owns column l of each 32-group.
        for (int u = 0; u < k / 256; u++) {
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const long long e0 = 256LL * u + 128 * h + lane;
#pragma unroll
                for (int r = 0; r < M; r++) {
                    if (r >= m) break;
                    const float* xr = x + r * (long long)k + e0;
                    const float x0 = xr[0], x1 = xr[32], x2 = xr[64], x3 = xr[96];
#pragma unroll
                    for (int rr = 0; rr < R; rr++) {
                        if (rr >= nr) break;
                        const uint8_t* b = w + rr * row_bytes + (long long)u * 210;
                        const int ql0 = b[64 * h + lane], ql1 = b[64 * h + 32 + lane], qh = b[128 + 32 * h + lane];
                        const float q0 = (float)(((ql0 & 15) | ((qh & 3) << 4)) - 32);
                        const float q1 = (float)(((ql1 & 15) | (((qh >> 2) & 3) << 4)) - 32);
                        const float q2 = (float)(((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32);
                        const float q3 = (float)(((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32);
                        const int is = 8 * h + lane / 16;
                        const float s0 = (float)(int8_t)b[192 + is], s1 = (float)(int8_t)b[192 + is + 2];
                        const float s2 = (float)(int8_t)b[192 + is + 4], s3 = (float)(int8_t)b[192 + is + 6];
                        acc[r][rr] += h2f(ld16(b + 208)) * (s0 * q0 * x0 + s1 * q1 * x1 + s2 * q2 * x2 + s3 * q3 * x3);
                    }
                }
            }
        }
    }
}

// y[r * ldy + row] = x[r] . W[row] for r < m (m <= M), rows < n. Four warps per block, each
// warp R consecutive rows.
template <int T, int M>
__device__ __forceinline__ void mmv(const uint8_t* w, long long row_bytes, const float* x,
                                    float* y, int n, int k, int m, int ldy) {
    constexpr int R = RowsPerWarp<M>::R;
    const int row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * R;
    if (row0 >= n) return;
    const int nr = min(R, n - row0);
    float acc[M][R];
#pragma unroll
    for (int r = 0; r < M; r++)
#pragma unroll
        for (int rr = 0; rr < R; rr++) acc[r][rr] = 0.0f;
    rows_dot<T, M, R>(w + (long long)row0 * row_bytes, row_bytes, nr, x, k, m, acc);
#pragma unroll
    for (int r = 0; r < M; r++) {
#pragma unroll
        for (int rr = 0; rr < R; rr++) {
            const float s = warp_sum(acc[r][rr]);
            if (r < m && rr < nr && (threadIdx.x & 31) == 0) y[(long long)r * ldy + row0 + rr] = s;
        }
    }
}

#define MMV(name, T, M)                                                                          \
    extern "C" __global__ void mmv_##name##_##M(const uint8_t* w, long long row_bytes,           \
                                                const float* x, float* y, int n, int k, int m,   \
                                                int ldy) {                                       \
        mmv<T, M>(w, row_bytes, x, y, n, k, m, ldy);                                             \
    }
#define MMV_ALL(name, T) MMV(name, T, 1) MMV(name, T, 2) MMV(name, T, 4) MMV(name, T, 8)

MMV_ALL(f32, WT_F32)
MMV_ALL(f16, WT_F16)
MMV_ALL(bf16, WT_BF16)
MMV_ALL(q4_0, WT_Q4_0)
MMV_ALL(q4_1, WT_Q4_1)
MMV_ALL(q8_0, WT_Q8_0)
MMV_ALL(q4_k, WT_Q4K)
MMV_ALL(q6_k, WT_Q6K)

// F16 and BF16 weights times one activation row, for batch-1 decode near the memory bandwidth:
// each lane keeps four 16-byte weight loads in flight (a warp 2 KiB, where `mmv` keeps 1 KiB)
// and reads them with the streaming hint (ld.global.cs: read once, so they do not push the
// activations, which every warp rereads, out of L1). Two sums per lane break the FMA chain.
template <int T>
__device__ __forceinline__ void mmv_dense_wide(const uint8_t* w, long long row_bytes, const float* x,
                                               float* y, int n, int k) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    const int lane = threadIdx.x & 31;
    const uint4* wr = (const uint4*)(w + (long long)row * row_bytes);
    const int nv = k / 8;
    float acc[2] = {0.0f, 0.0f};
    auto step = [&](uint4 raw, int u, float& a) {
        const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
        const float4 x0 = *(const float4*)(x + 8LL * u), x1 = *(const float4*)(x + 8LL * u + 4);
        const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const uint16_t lo = words[j] & 0xffff, hi = words[j] >> 16;
            a += xs[2 * j] * (T == WT_F16 ? h2f(lo) : bf2f(lo)) + xs[2 * j + 1] * (T == WT_F16 ? h2f(hi) : bf2f(hi));
        }
    };
    int u = lane;
    for (; u + 96 < nv; u += 128) {
        uint4 r[4];
#pragma unroll
        for (int i = 0; i < 4; i++) r[i] = __ldcs(wr + u + 32 * i);
#pragma unroll
        for (int i = 0; i < 4; i++) step(r[i], u + 32 * i, acc[i & 1]);
    }
    for (; u < nv; u += 32) step(__ldcs(wr + u), u, acc[0]);
    const float s = warp_sum(acc[0] + acc[1]);
    if (lane == 0) y[row] = s;
}

extern "C" __global__ void mmv_f16_wide(const uint8_t* w, long long row_bytes, const float* x, float* y,
                                        int n, int k) {
    mmv_dense_wide<WT_F16>(w, row_bytes, x, y, n, k);
}

extern "C" __global__ void mmv_bf16_wide(const uint8_t* w, long long row_bytes, const float* x, float* y,
                                         int n, int k) {
    mmv_dense_wide<WT_BF16>(w, row_bytes, x, y, n, k);
}

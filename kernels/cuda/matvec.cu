// Dequantizing matrix-vector and small-batch products: y[r][row] = x[r] . W[row] for up to M
// activation rows at once, reading each weight byte once. One warp per output row, weights in
// their ggml block layout, activations f32, accumulation f32.
#include "common.cuh"

template <int M>
__device__ __forceinline__ void dot4(float* acc, const float* x, long long k, long long at, int m,
                                     float w0, float w1, float w2, float w3) {
#pragma unroll
    for (int r = 0; r < M; r++) {
        if (r < m) {
            const float4 v = *(const float4*)(x + r * k + at);
            acc[r] += v.x * w0 + v.y * w1 + v.z * w2 + v.w * w3;
        }
    }
}

template <int T, int M>
__device__ __forceinline__ void row_dot(const uint8_t* w, const float* x, int k, int m, float* acc) {
    const int lane = threadIdx.x & 31;
    if (T == WT_F32) {
        for (int u = lane; u < k / 4; u += 32) {
            const float4 wv = ((const float4*)w)[u];
            dot4<M>(acc, x, k, 4LL * u, m, wv.x, wv.y, wv.z, wv.w);
        }
    } else if (T == WT_F16 || T == WT_BF16) {
#pragma unroll 4
        for (int u = lane; u < k / 8; u += 32) {
            const uint4 raw = ((const uint4*)w)[u];
            const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
            float f[8];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const uint16_t lo = words[j] & 0xffff, hi = words[j] >> 16;
                f[2 * j] = T == WT_F16 ? h2f(lo) : bf2f(lo);
                f[2 * j + 1] = T == WT_F16 ? h2f(hi) : bf2f(hi);
            }
            dot4<M>(acc, x, k, 8LL * u, m, f[0], f[1], f[2], f[3]);
            dot4<M>(acc, x, k, 8LL * u + 4, m, f[4], f[5], f[6], f[7]);
        }
    } else if (T == WT_Q4_0 || T == WT_Q4_1 || T == WT_Q8_0) {
        constexpr int bytes = wt_bytes(T);
        constexpr int qoff = T == WT_Q4_1 ? 4 : 2;
#pragma unroll 2
        for (int u = lane; u < k / 32; u += 32) {
            const uint8_t* b = w + (long long)u * bytes;
            const float d = h2f(ld16(b));
            float q[32];
            if (T == WT_Q8_0) {
#pragma unroll
                for (int j = 0; j < 16; j++) {
                    const uint16_t v = ld16(b + 2 + 2 * j);
                    q[2 * j] = (float)(int8_t)(v & 0xff);
                    q[2 * j + 1] = (float)(int8_t)(v >> 8);
                }
            } else {
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    const uint16_t v = ld16(b + qoff + 2 * j);
                    q[2 * j] = (float)(v & 15);
                    q[2 * j + 1] = (float)((v >> 8) & 15);
                    q[16 + 2 * j] = (float)((v >> 4) & 15);
                    q[16 + 2 * j + 1] = (float)(v >> 12);
                }
            }
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (r < m) {
                    const float* xr = x + r * (long long)k + 32LL * u;
                    float s = 0.0f, xs = 0.0f;
#pragma unroll
                    for (int j = 0; j < 32; j += 4) {
                        const float4 v = *(const float4*)(xr + j);
                        s += v.x * q[j] + v.y * q[j + 1] + v.z * q[j + 2] + v.w * q[j + 3];
                        xs += v.x + v.y + v.z + v.w;
                    }
                    if (T == WT_Q4_0) acc[r] += d * (s - 8.0f * xs);
                    else if (T == WT_Q4_1) acc[r] += d * s + h2f(ld16(b + 2)) * xs;
                    else acc[r] += d * s;
                }
            }
        }
    } else if (T == WT_Q4K) {
        // Each half-warp takes one 256-element super-block; lane h (0..15) reads 8 bytes of
        // nibbles: elements 64j + off + 0..7 (low nibbles) and 64j + 32 + off + 0..7 (high).
        const int hl = lane & 15, j = hl >> 2, off = 8 * (hl & 3);
#pragma unroll 2
        for (int u = lane >> 4; u < k / 256; u += 2) {
            const uint8_t* b = w + (long long)u * 144;
            const float d = h2f(ld16(b)), dmin = h2f(ld16(b + 2));
            int sc1, m1, sc2, m2;
            scale_min_k4(2 * j, b + 4, &sc1, &m1);
            scale_min_k4(2 * j + 1, b + 4, &sc2, &m2);
            const uint2 qq = *(const uint2*)(b + 16 + 32 * j + off);
            const long long e0 = 256LL * u + 64 * j + off;
#pragma unroll
            for (int r = 0; r < M; r++) {
                if (r < m) {
                    const float* xr = x + r * (long long)k + e0;
                    float sl = 0.0f, sh = 0.0f, xl = 0.0f, xh = 0.0f;
#pragma unroll
                    for (int hq = 0; hq < 2; hq++) {
                        const uint32_t qw = hq ? qq.y : qq.x;
                        const float4 lo = *(const float4*)(xr + 4 * hq);
                        const float4 hi = *(const float4*)(xr + 32 + 4 * hq);
                        sl += lo.x * (float)(qw & 15) + lo.y * (float)((qw >> 8) & 15)
                            + lo.z * (float)((qw >> 16) & 15) + lo.w * (float)((qw >> 24) & 15);
                        sh += hi.x * (float)((qw >> 4) & 15) + hi.y * (float)((qw >> 12) & 15)
                            + hi.z * (float)((qw >> 20) & 15) + hi.w * (float)(qw >> 28);
                        xl += lo.x + lo.y + lo.z + lo.w;
                        xh += hi.x + hi.y + hi.z + hi.w;
                    }
                    acc[r] += d * ((float)sc1 * sl + (float)sc2 * sh) - dmin * ((float)m1 * xl + (float)m2 * xh);
                }
            }
        }
    } else { // WT_Q6K: the warp takes one super-block; lane l owns column l of each 32-group.
        for (int u = 0; u < k / 256; u++) {
            const uint8_t* b = w + (long long)u * 210;
            const float d = h2f(ld16(b + 208));
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int ql0 = b[64 * h + lane], ql1 = b[64 * h + 32 + lane], qh = b[128 + 32 * h + lane];
                const float q0 = (float)(((ql0 & 15) | ((qh & 3) << 4)) - 32);
                const float q1 = (float)(((ql1 & 15) | (((qh >> 2) & 3) << 4)) - 32);
                const float q2 = (float)(((ql0 >> 4) | (((qh >> 4) & 3) << 4)) - 32);
                const float q3 = (float)(((ql1 >> 4) | (((qh >> 6) & 3) << 4)) - 32);
                const int is = 8 * h + lane / 16;
                const float s0 = (float)(int8_t)b[192 + is], s1 = (float)(int8_t)b[192 + is + 2];
                const float s2 = (float)(int8_t)b[192 + is + 4], s3 = (float)(int8_t)b[192 + is + 6];
                const long long e0 = 256LL * u + 128 * h + lane;
#pragma unroll
                for (int r = 0; r < M; r++) {
                    if (r < m) {
                        const float* xr = x + r * (long long)k + e0;
                        acc[r] += d * (s0 * q0 * xr[0] + s1 * q1 * xr[32] + s2 * q2 * xr[64] + s3 * q3 * xr[96]);
                    }
                }
            }
        }
    }
}

// y[r * ldy + row] = x[r] . W[row] for r < m (m <= M), rows < n. Four warps per block.
template <int T, int M>
__device__ __forceinline__ void mmv(const uint8_t* w, long long row_bytes, const float* x,
                                    float* y, int n, int k, int m, int ldy) {
    const int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= n) return;
    float acc[M];
#pragma unroll
    for (int r = 0; r < M; r++) acc[r] = 0.0f;
    row_dot<T, M>(w + (long long)row * row_bytes, x, k, m, acc);
#pragma unroll
    for (int r = 0; r < M; r++) {
        const float s = warp_sum(acc[r]);
        if (r < m && (threadIdx.x & 31) == 0) y[(long long)r * ldy + row] = s;
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

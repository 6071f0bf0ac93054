// Paged attention for a mixed batch (prefill chunks and decodes together): each token attends
// to positions 0..=pos of its own sequence, reading K/V (f16) through the sequence's block table.
// One block per (token, KV head, group of up to 8 query heads sharing it); each of the 4 warps
// takes every 4th key with an online softmax, then the warps' partial results are merged.
#include "common.cuh"

#define NWARPS 4
#define GMAX 8

// HDL = head_dim / 32 elements per lane.
template <int HDL>
__device__ __forceinline__ void paged_attn(const float* qkv, int qkv_stride, const __half* kc,
                                           const __half* vc, const int* pos, const int* bt_off,
                                           const int* bt, float* out, int n_heads, int n_kv_heads,
                                           int block_size, float scale) {
    constexpr int HD = HDL * 32;
    const int i = blockIdx.x;
    const int group = n_heads / n_kv_heads;
    const int kvh = blockIdx.y / ((group + GMAX - 1) / GMAX);
    const int g0 = (blockIdx.y % ((group + GMAX - 1) / GMAX)) * GMAX;
    const int ng = min(GMAX, group - g0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv_dim = n_kv_heads * HD;
    const int npos = pos[i] + 1;
    const int* table = bt + bt_off[i];

    float q[GMAX][HDL], acc[GMAX][HDL], mx[GMAX], l[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        mx[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < HDL; e++) {
            acc[g][e] = 0.0f;
            q[g][e] = g < ng ? qkv[(long long)i * qkv_stride + (kvh * group + g0 + g) * HD + lane * HDL + e] * scale : 0.0f;
        }
    }
    for (int j = warp; j < npos; j += NWARPS) {
        const long long slot = (long long)table[j / block_size] * block_size + j % block_size;
        const __half* kp = kc + slot * kv_dim + kvh * HD + lane * HDL;
        const __half* vp = vc + slot * kv_dim + kvh * HD + lane * HDL;
        float kf[HDL], vf[HDL];
#pragma unroll
        for (int e = 0; e < HDL; e++) {
            kf[e] = __half2float(kp[e]);
            vf[e] = __half2float(vp[e]);
        }
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            if (g < ng) {
                float s = 0.0f;
#pragma unroll
                for (int e = 0; e < HDL; e++) s += q[g][e] * kf[e];
                s = warp_sum(s);
                const float m_new = fmaxf(mx[g], s);
                const float corr = expf(mx[g] - m_new);
                const float p = expf(s - m_new);
                l[g] = l[g] * corr + p;
#pragma unroll
                for (int e = 0; e < HDL; e++) acc[g][e] = acc[g][e] * corr + p * vf[e];
                mx[g] = m_new;
            }
        }
    }
    __shared__ float s_m[NWARPS][GMAX], s_l[NWARPS][GMAX];
    __shared__ float s_acc[NWARPS][GMAX][HD];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (lane == 0) { s_m[warp][g] = mx[g]; s_l[warp][g] = l[g]; }
#pragma unroll
        for (int e = 0; e < HDL; e++) s_acc[warp][g][lane * HDL + e] = acc[g][e];
    }
    __syncthreads();
    for (int t = threadIdx.x; t < ng * HD; t += blockDim.x) {
        const int g = t / HD, e = t % HD;
        float m = -INFINITY;
        for (int w = 0; w < NWARPS; w++) m = fmaxf(m, s_m[w][g]);
        float L = 0.0f, o = 0.0f;
        for (int w = 0; w < NWARPS; w++) {
            const float c = s_l[w][g] > 0.0f ? expf(s_m[w][g] - m) : 0.0f;
            L += s_l[w][g] * c;
            o += s_acc[w][g][e] * c;
        }
        out[(long long)i * n_heads * HD + (kvh * group + g0 + g) * HD + e] = o / L;
    }
}

#define ATTN(HDL)                                                                                 \
    extern "C" __global__ void paged_attention_##HDL(                                             \
        const float* qkv, int qkv_stride, const __half* kc, const __half* vc, const int* pos,    \
        const int* bt_off, const int* bt, float* out, int n_heads, int n_kv_heads,               \
        int block_size, float scale) {                                                           \
        paged_attn<HDL>(qkv, qkv_stride, kc, vc, pos, bt_off, bt, out, n_heads, n_kv_heads,      \
                        block_size, scale);                                                      \
    }

ATTN(1)
ATTN(2)
ATTN(3)
ATTN(4)
ATTN(5)
ATTN(6)
ATTN(8)

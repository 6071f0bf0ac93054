// Paged attention for a mixed batch (prefill chunks and decodes together): each token attends
// to positions 0..=pos of its own sequence (the last `window` of them when window > 0), reading
// K/V (f16) through the sequence's block table; scores are q.k * scale, soft-capped as
// cap * tanh(s / cap) when softcap > 0 (Gemma 2); a head's sink logit, when `sinks` is given,
// joins the softmax's sum (gpt-oss: w_p = exp(s_p) / (sum exp(s) + exp(sink))).
// One block per (token, KV head, group of up to 8 query heads sharing it): token
// `which[blockIdx.x]` when `which` is given (the tokens flash.cu does not take), else token
// blockIdx.x. Each of the 4 warps takes every 4th run of 32 keys with an online softmax, then
// the warps' partial results merge.
#include "common.cuh"

#define NWARPS 4
#define GMAX 8

// HDL = head_dim / 32. A warp takes 32 keys at a time: for Q.K each lane owns one key (a whole
// K row, 16-byte loads, no shuffles), then for P.V each lane owns HDL dimensions and walks the
// 32 keys with their probabilities broadcast. Decode at small batch is latency-bound, and this
// keeps 32 independent loads in flight per warp where one key per step kept one.
template <int HDL>
__device__ __forceinline__ void paged_attn(const float* qkv, int qkv_stride, const __half* kc,
                                           const __half* vc, const int* pos, const int* bt_off,
                                           const int* bt, float* out, int n_heads, int n_kv_heads,
                                           int block_size, float scale, const int* which, int window, float softcap,
                                           const float* sinks) {
    constexpr int HD = HDL * 32;
    const int i = which ? which[blockIdx.x] : blockIdx.x;
    const int group = n_heads / n_kv_heads;
    const int chunks = (group + GMAX - 1) / GMAX;
    const int kvh = blockIdx.y / chunks;
    const int g0 = (blockIdx.y % chunks) * GMAX;
    const int ng = min(GMAX, group - g0);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int kv_dim = n_kv_heads * HD;
    const int npos = pos[i] + 1;
    const int* table = bt + bt_off[i];

    __shared__ __align__(16) float s_q[GMAX][HD];
    for (int t = threadIdx.x; t < GMAX * HD; t += blockDim.x) {
        const int g = t / HD, e = t % HD;
        s_q[g][e] = g < ng ? qkv[(long long)i * qkv_stride + (kvh * group + g0 + g) * HD + e] * scale : 0.0f;
    }
    __syncthreads();

    float acc[GMAX][HDL], mx[GMAX], l[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        mx[g] = -INFINITY;
        l[g] = 0.0f;
#pragma unroll
        for (int e = 0; e < HDL; e++) acc[g][e] = 0.0f;
    }
    // Sliding window: the first key this token sees (0 without one).
    const int first = window > 0 ? max(0, npos - window) : 0;
    for (int j0 = (first & ~31) + warp * 32; j0 < npos; j0 += NWARPS * 32) {
        const int j = j0 + lane;
        const bool valid = j >= first && j < npos;
        const long long slot = valid ? (long long)table[j / block_size] * block_size + j % block_size : 0;
        float s[GMAX];
#pragma unroll
        for (int g = 0; g < GMAX; g++) s[g] = 0.0f;
        if (valid) {
            const uint4* kp = (const uint4*)(kc + slot * kv_dim + kvh * HD);
#pragma unroll 4
            for (int c = 0; c < HD / 8; c++) {
                const uint4 raw = kp[c];
                const __half2* h = (const __half2*)&raw;
                float kf[8];
#pragma unroll
                for (int t = 0; t < 4; t++) {
                    const float2 f = __half22float2(h[t]);
                    kf[2 * t] = f.x;
                    kf[2 * t + 1] = f.y;
                }
#pragma unroll
                for (int g = 0; g < GMAX; g++) {
                    if (g < ng) {
                        const float4 qa = *(const float4*)&s_q[g][8 * c];
                        const float4 qb = *(const float4*)&s_q[g][8 * c + 4];
                        s[g] += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3]
                              + qb.x * kf[4] + qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
                    }
                }
            }
        }
        if (softcap > 0.0f) {
#pragma unroll
            for (int g = 0; g < GMAX; g++) s[g] = tanhf(s[g] / softcap) * softcap;
        }
        float p[GMAX];
#pragma unroll
        for (int g = 0; g < GMAX; g++) {
            if (g < ng) {
                const float cmax = warp_max(valid ? s[g] : -INFINITY);
                const float m_new = fmaxf(mx[g], cmax);
                const float corr = expf(mx[g] - m_new);
                p[g] = valid ? expf(s[g] - m_new) : 0.0f;
                l[g] = l[g] * corr + warp_sum(p[g]);
#pragma unroll
                for (int e = 0; e < HDL; e++) acc[g][e] *= corr;
                mx[g] = m_new;
            } else {
                p[g] = 0.0f;
            }
        }
        const int nk = min(32, npos - j0);
        for (int t = 0; t < nk; t++) {
            const long long st = __shfl_sync(0xffffffffu, slot, t);
            const __half* vp = vc + st * kv_dim + kvh * HD + lane * HDL;
            float vf[HDL];
#pragma unroll
            for (int e = 0; e < HDL; e++) vf[e] = __half2float(vp[e]);
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                if (g < ng) {
                    const float pt = __shfl_sync(0xffffffffu, p[g], t);
#pragma unroll
                    for (int e = 0; e < HDL; e++) acc[g][e] += pt * vf[e];
                }
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
        if (sinks) add_sink(sinks[kvh * group + g0 + g], m, L, o);
        out[(long long)i * n_heads * HD + (kvh * group + g0 + g) * HD + e] = o / L;
    }
}

// The wide variant, for big batches and prefill: each warp takes one key per step (lanes split
// the head dimensions), every 4th key. Less work per key than the variant above when there are
// enough tokens to fill the GPU; slower at small batch, where each step waits on one load.
template <int HDL>
__device__ __forceinline__ void paged_attn_wide(const float* qkv, int qkv_stride, const __half* kc,
                                           const __half* vc, const int* pos, const int* bt_off,
                                           const int* bt, float* out, int n_heads, int n_kv_heads,
                                           int block_size, float scale, const int* which, int window, float softcap,
                                           const float* sinks) {
    constexpr int HD = HDL * 32;
    const int i = which ? which[blockIdx.x] : blockIdx.x;
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
    const int first = window > 0 ? max(0, npos - window) : 0;
    for (int j = first + warp; j < npos; j += NWARPS) {
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
                if (softcap > 0.0f) s = tanhf(s / softcap) * softcap;
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
        if (sinks) add_sink(sinks[kvh * group + g0 + g], m, L, o);
        out[(long long)i * n_heads * HD + (kvh * group + g0 + g) * HD + e] = o / L;
    }
}

#define ATTN(HDL)                                                                                 \
    extern "C" __global__ void paged_attention_##HDL(                                             \
        const float* qkv, int qkv_stride, const __half* kc, const __half* vc, const int* pos,    \
        const int* bt_off, const int* bt, float* out, int n_heads, int n_kv_heads,               \
        int block_size, float scale, const int* which, int window, float softcap,                \
        const float* sinks) {                                                                    \
        paged_attn<HDL>(qkv, qkv_stride, kc, vc, pos, bt_off, bt, out, n_heads, n_kv_heads,      \
                        block_size, scale, which, window, softcap, sinks);                       \
    }                                                                                             \
    extern "C" __global__ void paged_attention_wide_##HDL(                                        \
        const float* qkv, int qkv_stride, const __half* kc, const __half* vc, const int* pos,    \
        const int* bt_off, const int* bt, float* out, int n_heads, int n_kv_heads,               \
        int block_size, float scale, const int* which, int window, float softcap,                \
        const float* sinks) {                                                                    \
        paged_attn_wide<HDL>(qkv, qkv_stride, kc, vc, pos, bt_off, bt, out, n_heads,             \
                             n_kv_heads, block_size, scale, which, window, softcap, sinks);      \
    }

ATTN(1)
ATTN(2)
ATTN(3)
ATTN(4)
ATTN(5)
ATTN(6)
ATTN(8)

// FlashAttention-2-style prefill over the paged KV cache: one block per (tile of up to 64
// consecutive query tokens of one sequence, query head). Each of the 4 warps holds 16 query rows
// as f16 tensor-core fragments; the block streams the sequence's keys and values through shared
// memory BC at a time (read once per tile, where the per-token kernels of attention.cu read
// them once per token); each warp computes S = Q K^T on the tensor cores (`mma_16816`), applies
// the causal mask and an online softmax in registers, and adds P V with P re-packed as f16
// fragments in place (the S accumulator layout is the A-fragment layout, two n-tiles a k-step).
//
//   tiles[2b] = first token of tile b, tiles[2b + 1] = its token count (1..64); the tile's
//   tokens are consecutive in the batch, of one sequence (one block table), at consecutive
//   positions pos[first] + r. grid (tiles, n_heads), 128 threads.
//
// Sliding windows, score soft-capping and attention sinks as attention.cu has them.
// Numbers: Q (times the softmax scale), K, V and P in f16, sums and the softmax in f32.
// Written without a GPU: checked on the CPU simulator (kernels/tests/cuda_sim.rs); taken for
// prefill runs only under TPSLAB_CUDA_FLASH=1 until tests/gpu/gpu-check.sh has measured it.
#include "common.cuh"

__device__ __forceinline__ uint32_t h2_bits(float lo, float hi) {
    const __half2 h = __floats2half2_rn(lo, hi);
    return *(const uint32_t*)&h;
}

__device__ __forceinline__ uint32_t h_pair(__half lo, __half hi) {
    return (uint32_t)__half_as_ushort(lo) | ((uint32_t)__half_as_ushort(hi) << 16);
}

template <int HDL>
__device__ __forceinline__ void flash_prefill(const float* qkv, int qkv_stride, const __half* kc,
                                              const __half* vc, const int* pos, const int* bt_off,
                                              const int* bt, float* out, int n_heads, int n_kv_heads,
                                              int block_size, float scale, const int* tiles,
                                              int window, float softcap, const float* sinks) {
    constexpr int HD = 32 * HDL, BC = HD <= 128 ? 64 : 32, KS = HD / 16, DT = HD / 8, NT = BC / 8;
    constexpr int LD = HD + 8; // halves per shared row: 16-byte aligned rows, staggered banks
    __shared__ __align__(16) __half ks[BC][LD];
    __shared__ __align__(16) __half vs[BC][LD];
    const int i0 = tiles[2 * blockIdx.x], nq = tiles[2 * blockIdx.x + 1];
    const int h = blockIdx.y, kvh = h / (n_heads / n_kv_heads);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gq = lane >> 2, tq = lane & 3;
    const long long kv_dim = (long long)n_kv_heads * HD;
    const int p0 = pos[i0], npos = p0 + nq;
    const int* table = bt + bt_off[i0];
    // This lane's two query rows of the tile (rows past nq repeat the last: computed, not written).
    const int rows[2] = {16 * warp + gq, 16 * warp + gq + 8};
    const int rpos[2] = {p0 + min(rows[0], nq - 1), p0 + min(rows[1], nq - 1)};

    uint32_t qf[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int tok = i0 + min(rows[r & 1], nq - 1), col = 16 * s + 2 * tq + 8 * (r >> 1);
            const float2 v = *(const float2*)(qkv + (long long)tok * qkv_stride + h * HD + col);
            qf[s][r] = h2_bits(v.x * scale, v.y * scale);
        }
    float o[DT][4], mx[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int i = 0; i < 4; i++) o[d][i] = 0.0f;

    // With a sliding window, keys before the first row's window are skipped a tile at a time.
    const int first = window > 0 ? max(0, p0 + 1 - window) : 0;
    for (int j0 = first / BC * BC; j0 < npos; j0 += BC) {
        __syncthreads(); // the previous tile's keys and values are no longer read
        for (int idx = tid; idx < BC * (HD / 8); idx += blockDim.x) {
            const int key = idx / (HD / 8), c = idx % (HD / 8), j = j0 + key;
            uint4 kv = make_uint4(0, 0, 0, 0), vv = make_uint4(0, 0, 0, 0);
            if (j < npos) {
                const long long slot = (long long)table[j / block_size] * block_size + j % block_size;
                kv = *(const uint4*)(kc + slot * kv_dim + kvh * HD + 8 * c);
                vv = *(const uint4*)(vc + slot * kv_dim + kvh * HD + 8 * c);
            }
            *(uint4*)&ks[key][8 * c] = kv;
            *(uint4*)&vs[key][8 * c] = vv;
        }
        __syncthreads();
        // S = Q K^T: B[k][n] = K[key n][dim k], so a lane's B words are two dims of one key.
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
#pragma unroll
            for (int i = 0; i < 4; i++) s[nt][i] = 0.0f;
#pragma unroll
            for (int kk = 0; kk < KS; kk++) {
                const uint32_t b[2] = {*(const uint32_t*)&ks[8 * nt + gq][16 * kk + 2 * tq],
                                       *(const uint32_t*)&ks[8 * nt + gq][16 * kk + 2 * tq + 8]};
                mma_16816(s[nt], qf[kk], b);
            }
        }
        // Causal mask, then the online softmax of rows[0] (s[.][0..1]) and rows[1] (s[.][2..3]).
        float cur[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int j = j0 + 8 * nt + 2 * tq + (i & 1);
                if (softcap > 0.0f) s[nt][i] = tanhf(s[nt][i] / softcap) * softcap;
                if (j > rpos[i >> 1] || (window > 0 && j <= rpos[i >> 1] - window)) s[nt][i] = -INFINITY;
                cur[i >> 1] = fmaxf(cur[i >> 1], s[nt][i]);
            }
        float corr[2], sum[2] = {0.0f, 0.0f};
#pragma unroll
        for (int u = 0; u < 2; u++) {
            cur[u] = fmaxf(cur[u], __shfl_xor_sync(0xffffffffu, cur[u], 1));
            cur[u] = fmaxf(cur[u], __shfl_xor_sync(0xffffffffu, cur[u], 2));
            const float m_new = fmaxf(mx[u], cur[u]);
            // A row whose keys here are all masked keeps its state (m_new may be -inf only
            // before its first key, which every row has in the first tile).
            corr[u] = m_new == -INFINITY ? 1.0f : expf(mx[u] - m_new);
            mx[u] = m_new;
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const float p = s[nt][i] == -INFINITY ? 0.0f : expf(s[nt][i] - mx[i >> 1]);
                s[nt][i] = p;
                sum[i >> 1] += p;
            }
#pragma unroll
        for (int u = 0; u < 2; u++) {
            sum[u] += __shfl_xor_sync(0xffffffffu, sum[u], 1);
            sum[u] += __shfl_xor_sync(0xffffffffu, sum[u], 2);
            l[u] = l[u] * corr[u] + sum[u];
        }
#pragma unroll
        for (int d = 0; d < DT; d++)
#pragma unroll
            for (int i = 0; i < 4; i++) o[d][i] *= corr[i >> 1];
        // O += P V: P's k-step c is S's n-tiles 2c and 2c + 1; B[k][n] = V[key k][dim n].
#pragma unroll
        for (int c = 0; c < BC / 16; c++) {
            const uint32_t a[4] = {h2_bits(s[2 * c][0], s[2 * c][1]), h2_bits(s[2 * c][2], s[2 * c][3]),
                                   h2_bits(s[2 * c + 1][0], s[2 * c + 1][1]),
                                   h2_bits(s[2 * c + 1][2], s[2 * c + 1][3])};
            const int k0 = 16 * c + 2 * tq;
#pragma unroll
            for (int d = 0; d < DT; d++) {
                const int n = 8 * d + gq;
                const uint32_t b[2] = {h_pair(vs[k0][n], vs[k0 + 1][n]), h_pair(vs[k0 + 8][n], vs[k0 + 9][n])};
                mma_16816(o[d], a, b);
            }
        }
    }
    if (sinks) {
        const float sink = sinks[h];
#pragma unroll
        for (int u = 0; u < 2; u++) {
            float scale_o = 1.0f;
            add_sink(sink, mx[u], l[u], scale_o);
#pragma unroll
            for (int d = 0; d < DT; d++) {
                o[d][2 * u] *= scale_o;
                o[d][2 * u + 1] *= scale_o;
            }
        }
    }
#pragma unroll
    for (int d = 0; d < DT; d++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int row = rows[i >> 1];
            if (row < nq)
                out[(long long)(i0 + row) * n_heads * HD + h * HD + 8 * d + 2 * tq + (i & 1)] = o[d][i] / l[i >> 1];
        }
}

#define FLASH(HDL)                                                                                \
    extern "C" __global__ void flash_prefill_##HDL(                                               \
        const float* qkv, int qkv_stride, const __half* kc, const __half* vc, const int* pos,    \
        const int* bt_off, const int* bt, float* out, int n_heads, int n_kv_heads,               \
        int block_size, float scale, const int* tiles, int window, float softcap,                \
        const float* sinks) {                                                                    \
        flash_prefill<HDL>(qkv, qkv_stride, kc, vc, pos, bt_off, bt, out, n_heads, n_kv_heads,   \
                           block_size, scale, tiles, window, softcap, sinks);                    \
    }

FLASH(1)
FLASH(2)
FLASH(3)
FLASH(4)
FLASH(5)
FLASH(6)
FLASH(8)

// Quantized weights times 9 to 256 activation rows without a dequantized copy of the matrix
// (instead of dequant_f16 + cuBLAS, which writes and rereads 2 bytes per weight every step):
// each block decodes a 64-row by 32-column tile of W (blocks.cuh `decode`) to f16 in shared
// memory, converts the matching BM x 32 tile of the f32 activations to f16 beside it, and its
// four warps multiply them on the tensor cores (`mma_16816`, f32 accumulation), as Marlin
// feeds dequantized weights to f16 mma. The numbers are those of the cuBLAS path: f16 weights
// and activations, f32 sums.
//
//   y[r * ldy + c] = x[r] . W[c] for r < m, c < n; grid (ceil(n / 64), ceil(m / BM)), 128 threads.
//
// Each warp owns 16 weight rows (the mma's M) and all BM activation rows (BM / 8 tiles of the
// mma's N = 8). Written without a GPU: checked on the CPU simulator (kernels/tests/cuda_sim.rs);
// off unless TPSLAB_CUDA_MMQ=1 until tests/gpu/gpu-check.sh has measured it against cuBLAS.
#include "blocks.cuh"

#define MMQ_BN 64
#define MMQ_BK 32
#define MMQ_PAD 8 // halves of padding per shared row: rows 80 bytes apart, 4-byte aligned

template <int T, int BM>
__device__ __forceinline__ void mmq_f16(const uint8_t* w, long long row_bytes, const float* x, float* y,
                                        int n, int k, int m, int ldy) {
    constexpr int NT = BM / 8;
    __shared__ __align__(16) __half ws[MMQ_BN][MMQ_BK + MMQ_PAD];
    __shared__ __align__(16) __half xs[BM][MMQ_BK + MMQ_PAD];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gq = lane >> 2, tq = lane & 3;
    const int c0 = blockIdx.x * MMQ_BN, r0 = blockIdx.y * BM;
    float acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[j][i] = 0.0f;

    for (int g = 0; g < k / 32; g++) {
        // W tile: 64 rows x 4 lanes' shares of group g, two per thread.
#pragma unroll
        for (int s = 0; s < 2; s++) {
            const int idx = tid + 128 * s, c = idx >> 2, t = idx & 3;
            const int2 at = lane_elems<T>(t);
            if (c0 + c < n) {
                const Levels L = decode<T>(w + (long long)(c0 + c) * row_bytes, g, t);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    ws[c][at.x + i] = __float2half_rn(L.d * (float)(int8_t)(L.a >> (8 * i)) + L.m);
                    ws[c][at.y + i] = __float2half_rn(L.d * (float)(int8_t)(L.b >> (8 * i)) + L.m);
                }
            } else {
#pragma unroll
                for (int i = 0; i < 4; i++) ws[c][at.x + i] = ws[c][at.y + i] = __float2half_rn(0.0f);
            }
        }
        // Activation tile: BM rows x 32, four floats a step.
        for (int idx = tid; idx < BM * 8; idx += 128) {
            const int r = idx >> 3, q = 4 * (idx & 7);
            float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (r0 + r < m) v = *(const float4*)(x + (long long)(r0 + r) * k + 32LL * g + q);
            *(__half2*)&xs[r][q] = __floats2half2_rn(v.x, v.y);
            *(__half2*)&xs[r][q + 2] = __floats2half2_rn(v.z, v.w);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MMQ_BK; kk += 16) {
            const int wr = 16 * warp + gq;
            const uint32_t a[4] = {
                *(const uint32_t*)&ws[wr][kk + 2 * tq], *(const uint32_t*)&ws[wr + 8][kk + 2 * tq],
                *(const uint32_t*)&ws[wr][kk + 2 * tq + 8], *(const uint32_t*)&ws[wr + 8][kk + 2 * tq + 8]};
#pragma unroll
            for (int j = 0; j < NT; j++) {
                const uint32_t b[2] = {*(const uint32_t*)&xs[8 * j + gq][kk + 2 * tq],
                                       *(const uint32_t*)&xs[8 * j + gq][kk + 2 * tq + 8]};
                mma_16816(acc[j], a, b);
            }
        }
        __syncthreads();
    }
    // acc[j][i]: weight row 16 warp + gq (+8 for i >= 2), activation row 8j + 2tq + (i & 1).
#pragma unroll
    for (int j = 0; j < NT; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int c = c0 + 16 * warp + gq + 8 * (i >> 1), r = r0 + 8 * j + 2 * tq + (i & 1);
            if (c < n && r < m) y[(long long)r * ldy + c] = acc[j][i];
        }
}

#define MMQ(name, T, BM)                                                                          \
    extern "C" __global__ void mmq_##name##_##BM(const uint8_t* w, long long row_bytes, const float* x, \
                                                 float* y, int n, int k, int m, int ldy) {        \
        mmq_f16<T, BM>(w, row_bytes, x, y, n, k, m, ldy);                                         \
    }
#define MMQ_BOTH(name, T) MMQ(name, T, 32) MMQ(name, T, 64)

MMQ_BOTH(q4_0, WT_Q4_0)
MMQ_BOTH(q4_1, WT_Q4_1)
MMQ_BOTH(q8_0, WT_Q8_0)
MMQ_BOTH(q4_k, WT_Q4K)
MMQ_BOTH(q6_k, WT_Q6K)
MMQ_BOTH(q5_k, WT_Q5K)
MMQ_BOTH(q5_0, WT_Q5_0)
MMQ_BOTH(q5_1, WT_Q5_1)
MMQ_BOTH(q2_k, WT_Q2K)
MMQ_BOTH(q3_k, WT_Q3K)
MMQ_BOTH(iq4_nl, WT_IQ4NL)
MMQ_BOTH(iq4_xs, WT_IQ4XS)
MMQ_BOTH(mxfp4, WT_MXFP4)

// Per-token kernels of the forward pass: embedding lookup, RMSNorm (fused with the residual add),
// RoPE fused with the KV-cache write, SwiGLU, bias, greedy argmax, dequantization to f16.
#include "blocks.cuh"

// out[i][:] = row tokens[i] of the embedding table (any weight type), as f32.
extern "C" __global__ void embed_rows(const uint8_t* table, int wtype, int k, long long row_bytes,
                                      const int* tokens, float* out) {
    const int i = blockIdx.x;
    const uint8_t* row = table + (long long)tokens[i] * row_bytes;
    for (int e = threadIdx.x; e < k; e += blockDim.x) out[(long long)i * k + e] = dequant_elem(wtype, row, e);
}

// out[r] = x[rows ? rows[r] : r] * rsqrt(mean(x^2) + eps) * w. One block per output row.
extern "C" __global__ void rms_norm(const float* x, const int* rows, const float* w, float* out,
                                    int dim, float eps) {
    const int r = blockIdx.x;
    const float* xr = x + (long long)(rows ? rows[r] : r) * dim;
    float ss = 0.0f;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) ss += xr[e] * xr[e];
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int e = threadIdx.x; e < dim; e += blockDim.x) out[(long long)r * dim + e] = xr[e] * scale * w[e];
}

// x += delta; out = rms_norm(x) * w. One block per row.
extern "C" __global__ void add_rms_norm(float* x, const float* delta, const float* w, float* out,
                                        int dim, float eps) {
    const long long base = (long long)blockIdx.x * dim;
    float ss = 0.0f;
    for (int e = threadIdx.x; e < dim; e += blockDim.x) {
        const float v = x[base + e] + delta[base + e];
        x[base + e] = v;
        ss += v * v;
    }
    ss = block_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)dim + eps);
    for (int e = threadIdx.x; e < dim; e += blockDim.x) out[base + e] = x[base + e] * scale * w[e];
}

// x += y over n elements.
extern "C" __global__ void add_inplace(float* x, const float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] += y[i];
}

// y[r][c] += b[c] for rows of n.
extern "C" __global__ void add_bias(float* y, const float* b, int n, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x)
        y[i] += b[i % n];
}

// out[r][c] = silu(gu[r][c]) * gu[r][ffn + c].
extern "C" __global__ void swiglu(const float* gu, float* out, int ffn, long long total) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / ffn, c = i % ffn;
        const float g = gu[r * 2 * ffn + c], u = gu[r * 2 * ffn + ffn + c];
        out[i] = g / (1.0f + expf(-g)) * u;
    }
}

// out = act(gate) * up for the other gated activations, rows of gu = [gate | up]: act 1 is
// GELU (tanh form) as ggml computes it (through f16, exact past +-10: the engine's
// `rowops::geglu`); act 2 is gpt-oss's clamped SwiGLU (`rowops::swiglu_oai`).
extern "C" __global__ void gated_act(const float* gu, float* out, int ffn, long long total, int act) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const long long r = i / ffn, c = i % ffn;
        const float g = gu[r * 2 * ffn + c], u = gu[r * 2 * ffn + ffn + c];
        float o;
        if (act == 1) {
            float a;
            if (g <= -10.0f) a = 0.0f;
            else if (g >= 10.0f) a = g;
            else {
                const float x = __half2float(__float2half_rn(g));
                a = __half2float(__float2half_rn(0.5f * x * (1.0f + tanhf(0.7978846f * x * (1.0f + 0.044715f * x * x)))));
            }
            o = a * u;
        } else {
            const float x = fminf(g, 7.0f), y = fminf(fmaxf(u, -7.0f), 7.0f);
            o = x / (1.0f + expf(1.702f * -x)) * (y + 1.0f);
        }
        out[i] = o;
    }
}

// Rotates Q and K of token blockIdx.x in place (rows of qkv: [q | k | v]) and stores K and V
// as f16 in KV slot slots[i] (none when it is negative: a padding token of a captured step).
// Pair j turns by theta_j = pos * theta_scale^j (multiplied up step by step as ggml does),
// divided by factors[j] when given (Llama 3's rope_freqs, LongRoPE), times freq_scale (linear
// or YaRN scaling), ramped back toward the unscaled angle between YaRN's correction dimensions
// [yarn_low, yarn_high] when yarn is set, cos and sin times mscale: the engine's
// `rowops::rope_cache`, as llama.cpp's rope_yarn. rope_dim 0 (a layer without RoPE) only stores.
extern "C" __global__ void rope_store(float* qkv, int stride, const int* pos, const int* slots,
                                      __half* kc, __half* vc, int n_heads, int n_kv_heads,
                                      int head_dim, int rope_dim, float theta_scale, int neox,
                                      float freq_scale, int yarn, float yarn_low, float yarn_high,
                                      float mscale, const float* factors) {
    const int i = blockIdx.x;
    float* row = qkv + (long long)i * stride;
    const int half = rope_dim / 2;
    const int pairs = (n_heads + n_kv_heads) * half;
    const float p = (float)pos[i];
    for (int t = threadIdx.x; t < pairs; t += blockDim.x) {
        const int head = t / half, j = t % half;
        float theta = p;
        for (int s = 0; s < j; s++) theta *= theta_scale;
        const float extrap = factors ? theta / factors[j] : theta;
        float angle = freq_scale * extrap;
        if (yarn) {
            const float y = ((float)j - yarn_low) / fmaxf(yarn_high - yarn_low, 0.001f);
            const float ramp = 1.0f - fminf(fmaxf(y, 0.0f), 1.0f);
            angle = angle * (1.0f - ramp) + extrap * ramp;
        }
        const float cs = cosf(angle) * mscale, sn = sinf(angle) * mscale;
        float* h = row + head * head_dim;
        const int a = neox ? j : 2 * j, b = neox ? j + half : 2 * j + 1;
        const float x0 = h[a], x1 = h[b];
        h[a] = x0 * cs - x1 * sn;
        h[b] = x0 * sn + x1 * cs;
    }
    __syncthreads();
    const int kv_dim = n_kv_heads * head_dim;
    const long long slot = slots[i];
    if (slot < 0) return;
    const float* k = row + n_heads * head_dim;
    const float* v = k + kv_dim;
    for (int e = threadIdx.x; e < kv_dim; e += blockDim.x) {
        kc[slot * kv_dim + e] = __float2half_rn(k[e]);
        vc[slot * kv_dim + e] = __float2half_rn(v[e]);
    }
}

// QK-norm (Qwen3, Gemma 3): each Q head (blockIdx.y < n_heads) and K head of token blockIdx.x
// RMS-normed in place over head_dim with the weights qw or kw. One warp per head.
extern "C" __global__ void qk_norm(float* qkv, int stride, int n_heads, int head_dim, const float* qw,
                                   const float* kw, float eps) {
    const int lane = threadIdx.x;
    const int head = blockIdx.y;
    float* h = qkv + (long long)blockIdx.x * stride + (long long)head * head_dim;
    const float* w = head < n_heads ? qw : kw;
    float ss = 0.0f;
    for (int e = lane; e < head_dim; e += 32) ss += h[e] * h[e];
    ss = warp_sum(ss);
    const float scale = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int e = lane; e < head_dim; e += 32) h[e] = h[e] * scale * w[e];
}

// x *= s over n floats (Gemma's embedding scale).
extern "C" __global__ void scale_inplace(float* x, float s, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] *= s;
}

// x = cap * tanh(x / cap) over n floats (Gemma 2's final logit soft-capping).
extern "C" __global__ void softcap_inplace(float* x, float cap, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        x[i] = cap * tanhf(x[i] / cap);
}

// out[r] = the lowest index of the largest logit of row r (NaN counts as -inf).
extern "C" __global__ void argmax_rows(const float* logits, int vocab, unsigned* out) {
    const float* row = logits + (long long)blockIdx.x * vocab;
    float best = -INFINITY;
    int idx = 0x7fffffff;
    for (int e = threadIdx.x; e < vocab; e += blockDim.x) {
        const float v = row[e];
        if (v > best) { best = v; idx = e; }
    }
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) { sv[warp] = best; si[warp] = idx; }
    __syncthreads();
    if (warp == 0) {
        const int nw = blockDim.x >> 5;
        best = lane < nw ? sv[lane] : -INFINITY;
        idx = lane < nw ? si[lane] : 0x7fffffff;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
            if (ov > best || (ov == best && oi < idx)) { best = ov; idx = oi; }
        }
        if (lane == 0) out[blockIdx.x] = idx == 0x7fffffff ? 0u : (unsigned)idx;
    }
}

// y = x as f16 (activations for the tensor-core path).
extern "C" __global__ void f32_to_f16(const float* x, __half* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
        y[i] = __float2half_rn(x[i]);
}

// out[n][k] = the whole matrix as f16 (quantized weights for the tensor-core path). One thread
// per 32-element group (blocks.cuh's decode), written with four 16-byte stores.
extern "C" __global__ void dequant_f16(const uint8_t* w, int wtype, int k, long long row_bytes,
                                       long long groups, __half* out) {
    const int gpr = k / 32;
    for (long long gi = blockIdx.x * (long long)blockDim.x + threadIdx.x; gi < groups; gi += (long long)gridDim.x * blockDim.x) {
        const long long r = gi / gpr;
        const int g = (int)(gi % gpr);
        const uint8_t* row = w + r * row_bytes;
        float v[32];
        dequant_group(wtype, row, g, v);
        uint4* dst = (uint4*)(out + r * k + 32LL * g);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            __half2 h[4];
#pragma unroll
            for (int t = 0; t < 4; t++) h[t] = __floats2half2_rn(v[8 * i + 2 * t], v[8 * i + 2 * t + 1]);
            dst[i] = *(const uint4*)h;
        }
    }
}

// A float's bits as an unsigned key with the same order (NaN lowest).
__device__ __forceinline__ unsigned order_key(float f) {
    if (f != f) return 0u;
    const unsigned u = __float_as_uint(f);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// The k largest logits of each row (k <= vocab), unordered, as ids and values: a radix select of
// the k-th largest key (four passes of 8 bits with a shared histogram), then one pass collecting
// every element above it and as many equal to it as are needed. One block per row.
extern "C" __global__ void topk_rows(const float* logits, int vocab, int k, unsigned* ids,
                                     float* vals) {
    const float* x = logits + (long long)blockIdx.x * vocab;
    __shared__ unsigned hist[256];
    __shared__ unsigned s_prefix, s_mask, s_remaining, s_count, s_ties;
    if (threadIdx.x == 0) {
        s_prefix = 0u; s_mask = 0u; s_remaining = (unsigned)k; s_count = 0u; s_ties = 0u;
    }
    __syncthreads();
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0u;
        __syncthreads();
        const unsigned prefix = s_prefix, mask = s_mask;
        for (int e = threadIdx.x; e < vocab; e += blockDim.x) {
            const unsigned key = order_key(x[e]);
            if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned rem = s_remaining, cum = 0u;
            int digit = 0;
            for (int b = 255; b >= 0; b--) {
                if (cum + hist[b] >= rem) { digit = b; rem -= cum; break; }
                cum += hist[b];
            }
            s_remaining = rem;
            s_prefix = prefix | ((unsigned)digit << shift);
            s_mask = mask | (255u << shift);
        }
        __syncthreads();
    }
    const unsigned thr = s_prefix, ties = s_remaining;
    const long long base = (long long)blockIdx.x * k;
    for (int e = threadIdx.x; e < vocab; e += blockDim.x) {
        const float v = x[e];
        const unsigned key = order_key(v);
        bool take = key > thr;
        if (key == thr) take = atomicAdd(&s_ties, 1u) < ties;
        if (take) {
            const unsigned at = atomicAdd(&s_count, 1u);
            ids[base + at] = (unsigned)e;
            vals[base + at] = v;
        }
    }
}

// out[i] = x[idx[i]] for count rows of k floats (the tokens routed to one expert, gathered).
extern "C" __global__ void gather_rows(const float* x, const int* idx, float* out, int k, int count) {
    for (int i = blockIdx.x; i < count; i += gridDim.x) {
        const float* src = x + (long long)idx[i] * k;
        for (int e = threadIdx.x; e < k; e += blockDim.x) out[(long long)i * k + e] = src[e];
    }
}

// out[idx[i]] += w[i] * y[i] for count rows of width floats (one expert's outputs, weighted,
// back to their tokens; a token appears at most once per launch).
extern "C" __global__ void scatter_add_rows(float* out, const int* idx, const float* w, const float* y,
                                            int width, int count) {
    for (int i = blockIdx.x; i < count; i += gridDim.x) {
        float* dst = out + (long long)idx[i] * width;
        for (int e = threadIdx.x; e < width; e += blockDim.x) dst[e] += w[i] * y[(long long)i * width + e];
    }
}

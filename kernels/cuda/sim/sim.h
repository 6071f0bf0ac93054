// A CPU stand-in for the CUDA runtime, so the kernels in kernels/cuda/*.cu compile with a host
// C++ compiler (g++ -std=c++20 -DTPSLAB_SIM) and run on a machine without a GPU: each thread of
// a block is an OS thread, `__syncthreads` is a barrier over the block, and warp shuffles meet
// in a per-warp exchange between two warp barriers. Blocks run one after another, so
// `__shared__` storage is a function-level static (one block's at a time).
//
// It checks what a GPU run would need before any time on one: indexing, bit unpacking, the
// lanes' shares of a reduction, tensor-core fragment layouts (`mma_*` in common.cuh emulate the
// PTX instructions lane by lane), and, built with AddressSanitizer and UBSan as the tests build
// it, every out-of-bounds or misaligned load (the vector types carry CUDA's alignment). It says
// nothing about speed.
//
// Used by driver.cpp; the Rust side is kernels/tests/common/sim.rs.
#pragma once
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <functional>
#include <pthread.h>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __restrict__

struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};

// CUDA's vector types, with CUDA's alignment (a misaligned vector load fails under UBSan).
struct alignas(8) int2 { int x, y; };
struct alignas(8) uint2 { unsigned x, y; };
struct alignas(16) int4 { int x, y, z, w; };
struct alignas(16) uint4 { unsigned x, y, z, w; };
struct alignas(8) float2 { float x, y; };
struct alignas(16) float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned x, unsigned y, unsigned z, unsigned w) { return {x, y, z, w}; }
inline int2 make_int2(int x, int y) { return {x, y}; }
inline float2 make_float2(float x, float y) { return {x, y}; }
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

namespace sim {
struct Warp {
    explicit Warp(int lanes) : bar(lanes) {}
    std::barrier<> bar;
    alignas(16) unsigned char slot[32][16];
};
struct Block {
    explicit Block(int threads) : bar(threads) {}
    std::barrier<> bar;
    std::vector<std::unique_ptr<Warp>> warps;
};
inline thread_local dim3 thread_idx, block_idx;
inline thread_local Block* block;
inline thread_local Warp* warp;
inline thread_local int lane;
inline dim3 block_dim, grid_dim;

// A CUDA thread: an OS thread with a small stack (kernels keep little on it), which makes a
// block's start cheap next to std::thread's 8 MiB stacks.
struct Thread {
    std::function<void()> run;
    pthread_t id{};
    void start() {
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setstacksize(&attr, 1 << 18);
        if (pthread_create(&id, &attr, &Thread::entry, this) != 0) std::abort();
        pthread_attr_destroy(&attr);
    }
    void join() { pthread_join(id, nullptr); }
    static void* entry(void* self) {
        static_cast<Thread*>(self)->run();
        return nullptr;
    }
};

// Runs `body` (the kernel call) once per thread of every block of `grid`, blocks one after
// another on one set of threads: between blocks every thread meets at `round`, whose completion
// sets up the next block's barriers.
template <class F>
void launch(dim3 grid, dim3 blk, F body) {
    grid_dim = grid;
    block_dim = blk;
    const int nt = (int)(blk.x * blk.y * blk.z);
    const long long nblocks = (long long)grid.x * grid.y * grid.z;
    long long next = 0;
    dim3 at{};
    std::unique_ptr<Block> cur;
    auto setup = [&]() noexcept {
        cur.reset();
        if (next == nblocks) return;
        at = {(unsigned)(next % grid.x), (unsigned)(next / grid.x % grid.y), (unsigned)(next / ((long long)grid.x * grid.y))};
        cur = std::make_unique<Block>(nt);
        for (int w = 0; w < (nt + 31) / 32; w++)
            cur->warps.push_back(std::make_unique<Warp>(std::min(32, nt - 32 * w)));
        next++;
    };
    std::barrier round(nt, setup);
    std::vector<Thread> ts(nt);
    for (int t = 0; t < nt; t++) {
        ts[t].run = [&, t] {
            thread_idx = {t % blk.x, t / blk.x % blk.y, t / (blk.x * blk.y)};
            lane = t % 32;
            for (;;) {
                round.arrive_and_wait();
                if (!cur) return;
                block_idx = at;
                block = cur.get();
                warp = cur->warps[t / 32].get();
                body();
                // An exited thread no longer holds up its block's or warp's barriers.
                warp->bar.arrive_and_drop();
                block->bar.arrive_and_drop();
            }
        };
        ts[t].start();
    }
    for (auto& t : ts) t.join();
}

// Lane `src` of the calling warp's value `v` (every live lane of the warp must call it).
template <class T>
T exchange(T v, int src) {
    static_assert(sizeof(T) <= 16);
    std::memcpy(warp->slot[lane], &v, sizeof(T));
    warp->bar.arrive_and_wait();
    T r;
    std::memcpy(&r, warp->slot[src & 31], sizeof(T));
    warp->bar.arrive_and_wait();
    return r;
}

// The 32 lanes' values of `v`, in lane order, to every lane (for the mma emulations).
template <class T>
void gather(T v, T (&all)[32]) {
    static_assert(sizeof(T) <= 16);
    std::memcpy(warp->slot[lane], &v, sizeof(T));
    warp->bar.arrive_and_wait();
    for (int l = 0; l < 32; l++) std::memcpy(&all[l], warp->slot[l], sizeof(T));
    warp->bar.arrive_and_wait();
}
} // namespace sim

#define threadIdx (sim::thread_idx)
#define blockIdx (sim::block_idx)
#define blockDim (sim::block_dim)
#define gridDim (sim::grid_dim)

inline void __syncthreads() { sim::block->bar.arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { sim::warp->bar.arrive_and_wait(); }

template <class T>
T __shfl_sync(unsigned, T v, int src, int width = 32) {
    return sim::exchange(v, (sim::lane & ~(width - 1)) + (src & (width - 1)));
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int mask, int width = 32) {
    (void)width;
    return sim::exchange(v, sim::lane ^ mask);
}
template <class T>
T __shfl_down_sync(unsigned, T v, unsigned d, int width = 32) {
    const int seg = sim::lane & ~(width - 1), src = sim::lane + (int)d;
    const T r = sim::exchange(v, src < seg + width ? src : sim::lane);
    return r;
}

// Integer SIMD intrinsics.
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; i++) c += (int)(int8_t)(a >> (8 * i)) * (int)(int8_t)(b >> (8 * i));
    return c;
}
inline unsigned __dp4a(unsigned a, unsigned b, unsigned c) {
    for (int i = 0; i < 4; i++) c += ((a >> (8 * i)) & 0xff) * ((b >> (8 * i)) & 0xff);
    return c;
}
inline int __vsubss4(int a, int b) {
    unsigned r = 0;
    for (int i = 0; i < 4; i++) {
        int v = (int)(int8_t)(a >> (8 * i)) - (int)(int8_t)(b >> (8 * i));
        v = v < -128 ? -128 : v > 127 ? 127 : v;
        r |= (unsigned)(uint8_t)v << (8 * i);
    }
    return (int)r;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
    const uint64_t v = ((uint64_t)y << 32) | x;
    unsigned r = 0;
    for (int i = 0; i < 4; i++) r |= (unsigned)((v >> (8 * ((s >> (4 * i)) & 7))) & 0xff) << (8 * i);
    return r;
}

// Loads with cache hints: plain loads here.
template <class T>
T __ldcs(const T* p) { return *p; }
template <class T>
T __ldg(const T* p) { return *p; }

// Float intrinsics, bit casts and conversions.
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline float __int_as_float(int u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __float_as_int(float f) { int u; std::memcpy(&u, &f, 4); return u; }
inline int __float2int_rn(float f) { return (int)std::nearbyint(f); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
using std::fabs, std::exp, std::sqrt, std::tanh;
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

inline float atomicAdd(float* p, float v) { return std::atomic_ref<float>(*p).fetch_add(v); }
inline int atomicAdd(int* p, int v) { return std::atomic_ref<int>(*p).fetch_add(v); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return std::atomic_ref<unsigned>(*p).fetch_add(v); }

// cuda_fp16.h's types and conversions over the compiler's _Float16 (IEEE binary16, round to
// nearest even, as the device converts).
struct alignas(2) __half { uint16_t bits; };
struct alignas(4) __half2 { __half x, y; };
inline float __half2float(__half h) { _Float16 f; std::memcpy(&f, &h.bits, 2); return (float)f; }
inline __half __float2half_rn(float v) { _Float16 f = (_Float16)v; __half h; std::memcpy(&h.bits, &f, 2); return h; }
inline __half __float2half(float v) { return __float2half_rn(v); }
inline __half __ushort_as_half(unsigned short u) { return __half{u}; }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline float __low2float(__half2 h) { return __half2float(h.x); }
inline float __high2float(__half2 h) { return __half2float(h.y); }

namespace sim {
// PTX mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 for the calling warp, from the fragment
// layouts the PTX ISA gives (common.cuh `mma_16816` repeats them): every lane passes its
// registers, the warp's A (16x16) and B (16x8) are assembled, each lane gets its four of D.
inline float half_bits(uint32_t w, int hi) { return __half2float(__ushort_as_half((unsigned short)(w >> (16 * hi)))); }
inline void mma_f16_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    // Two exchanges of 16 bytes: the A words, then the B words.
    uint4 wa{a[0], a[1], a[2], a[3]}, all_a[32];
    uint2 wb{b[0], b[1]}, all_b[32];
    gather(wa, all_a);
    gather(wb, all_b);
    float A[16][16], B[16][8];
    for (int l = 0; l < 32; l++) {
        const int g = l / 4, t = l % 4;
        const uint32_t w[4] = {all_a[l].x, all_a[l].y, all_a[l].z, all_a[l].w};
        for (int h = 0; h < 2; h++) {
            A[g][2 * t + h] = half_bits(w[0], h);
            A[g + 8][2 * t + h] = half_bits(w[1], h);
            A[g][2 * t + 8 + h] = half_bits(w[2], h);
            A[g + 8][2 * t + 8 + h] = half_bits(w[3], h);
            B[2 * t + h][g] = half_bits(all_b[l].x, h);
            B[2 * t + 8 + h][g] = half_bits(all_b[l].y, h);
        }
    }
    const int g = lane / 4, t = lane % 4;
    for (int i = 0; i < 4; i++) {
        const int row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float s = 0.0f;
        for (int kk = 0; kk < 16; kk++) s += A[row][kk] * B[kk][col];
        d[i] += s;
    }
}
} // namespace sim

// Writes ggml's reference quantizations (quantize_row_*_ref from ggml-quants.c) of the rows that
// kernels/tests/quantize.rs generates, so the test can check our quantizers byte for byte.
// Regenerate (from a llama.cpp checkout's ggml/src):
//   gcc -O2 -c ggml-quants.c -I. -I../include -o ggml-quants.o
//   gcc -O2 -I. -I../include ggml_ref_quants.c ggml-quants.o -lm -o ggml_ref_quants
//   ./ggml_ref_quants > ggml_ref_quants.bin
// (ggml.c is not linked: the four functions it would provide are stubbed below.)
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include "ggml.h"
#include "ggml-quants.h"

void ggml_abort(const char *file, int line, const char *fmt, ...) { fprintf(stderr, "abort %s:%d\n", file, line); abort(); }
size_t ggml_row_size(enum ggml_type t, int64_t n) { (void)t; (void)n; abort(); }
const char *ggml_type_name(enum ggml_type t) { (void)t; return "?"; }
size_t ggml_type_size(enum ggml_type t) { (void)t; abort(); }

#define ROWS 8
#define K 512

// splitmix64, exactly as the Rust test.
static uint64_t st;
static uint64_t next64(void) {
    st += 0x9e3779b97f4a7c15ULL;
    uint64_t z = st;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
// Uniform on [-1, 1): every step exact in f32.
static float unif(void) { return (float)(next64() >> 40) / 16777216.0f * 2.0f - 1.0f; }

static void make_rows(float *x) {
    st = 42;
    for (int r = 0; r < ROWS; r++) {
        float *row = x + r * K;
        for (int i = 0; i < K; i++) {
            float v;
            switch (r) {
            case 0: v = unif() * 0.02f; break;
            case 1: v = unif() * 0.05f; break;
            case 2: v = 0.0f; break;
            case 3: v = (unif() + 1.0f) * 0.01f; break;
            case 4: { float a = unif(), b = unif(), c = unif(); v = ((a + b) + c) * 0.03f; break; }
            case 5: v = 0.25f; break;
            case 6: v = (i % 16 == 0) ? 0.0f : unif() * 1e-3f; break;
            default: v = unif() * 2.0f; break;
            }
            row[i] = v;
        }
        if (r == 1) row[7] = 0.9f;
    }
}

int main(void) {
    static float x[ROWS * K];
    static uint8_t buf[ROWS * K * 4];
    make_rows(x);
    const int n = ROWS * K;
    quantize_row_q4_0_ref(x, (block_q4_0 *)buf, n); fwrite(buf, 1, n / 32 * sizeof(block_q4_0), stdout);
    quantize_row_q4_1_ref(x, (block_q4_1 *)buf, n); fwrite(buf, 1, n / 32 * sizeof(block_q4_1), stdout);
    quantize_row_q8_0_ref(x, (block_q8_0 *)buf, n); fwrite(buf, 1, n / 32 * sizeof(block_q8_0), stdout);
    quantize_row_q4_K_ref(x, (block_q4_K *)buf, n); fwrite(buf, 1, n / 256 * sizeof(block_q4_K), stdout);
    quantize_row_q6_K_ref(x, (block_q6_K *)buf, n); fwrite(buf, 1, n / 256 * sizeof(block_q6_K), stdout);
    quantize_row_q5_K_ref(x, (block_q5_K *)buf, n); fwrite(buf, 1, n / 256 * sizeof(block_q5_K), stdout);
    quantize_row_q5_0_ref(x, (block_q5_0 *)buf, n); fwrite(buf, 1, n / 32 * sizeof(block_q5_0), stdout);
    quantize_row_q5_1_ref(x, (block_q5_1 *)buf, n); fwrite(buf, 1, n / 32 * sizeof(block_q5_1), stdout);
    quantize_row_q2_K_ref(x, (block_q2_K *)buf, n); fwrite(buf, 1, n / 256 * sizeof(block_q2_K), stdout);
    quantize_row_q3_K_ref(x, (block_q3_K *)buf, n); fwrite(buf, 1, n / 256 * sizeof(block_q3_K), stdout);
    // IQ4: what llama-quantize runs without an importance matrix (the _ref of IQ4_NL skips the
    // scale search).
    quantize_iq4_nl(x, buf, ROWS, K, NULL); fwrite(buf, 1, n / 32 * sizeof(block_iq4_nl), stdout);
    quantize_iq4_xs(x, buf, ROWS, K, NULL); fwrite(buf, 1, n / 256 * sizeof(block_iq4_xs), stdout);
    return 0;
}

// What csrc/blocks.c and csrc/blocks512.c share: a GGUF matrix's parts, the quantized activations and the
// blocks' fields.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q4_K = 12, Q5_K = 13, Q6_K = 14 };

typedef struct {            // one part of a matrix (kernels.GGUFLinear fills it)
    int type;               // a GGMLQuantizationType value
    int rows;               // its output rows
    int64_t stride;         // bytes per row in the file
    const uint8_t *data;    // the file's rows
    const int32_t *map;     // output row r reads file row map[r], or r where NULL
} Part;

#define MAX_PARTS 3
typedef struct Matrix {
    int n;
    Part part[MAX_PARTS];   // output rows: part 0's, then part 1's ...
} Matrix;

typedef struct {            // x [M, K] quantized for the parts' kinds of block
    int8_t *q32;            // per 32: [M][K / 32 * 32], scale d32 [M][K / 32], sums s32 [M][K / 32]
    float *d32;
    int32_t *s32;
    int8_t *q256;           // per 256: [M][K], scale d256 [M][K / 256], sums of each 16 b256 [M][K / 16]
    float *d256;
    int16_t *b256;
    int8_t *q256p;          // the same for pairs of rows (2p, 2p + 1), p < M / 2, side by side (csrc/blocks512.c):
    float *d256p;           // [p][K / 256][2 x 32 bytes per 32 of K], [p][K / 256][2], [p][K / 256][2 x 16]
    int16_t *b256p;
} Acts;

// a buffer of the activations: on cache lines of its own, so that no 64-byte vector of it straddles two
static inline void *lines(int64_t bytes) { return aligned_alloc(64, (bytes + 63) / 64 * 64); }

static inline float fp16(const uint8_t *p) {          // IEEE half -> float32 (exact; F16C)
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

// Q4_K / Q5_K: 8 six-bit scales and 8 mins packed in 12 bytes -> sc (scale s in byte s) and mn (min s in byte s),
// in registers: a vector load of words just stored would wait on the stores (no store forwarding across them)
static inline void scale_min_bytes(const uint8_t *s, uint64_t *sc, uint64_t *mn) {
    uint32_t a, b, c;
    memcpy(&a, s, 4), memcpy(&b, s + 4, 4), memcpy(&c, s + 8, 4);
    *sc = (a & 0x3f3f3f3f) | (uint64_t)((c & 0x0f0f0f0f) | ((a >> 2) & 0x30303030)) << 32;
    *mn = (b & 0x3f3f3f3f) | (uint64_t)(((c >> 4) & 0x0f0f0f0f) | ((b >> 2) & 0x30303030)) << 32;
}

// gguf_dequantize_grid: the IQ kinds of 1-3 bits a weight (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S) ->
// float32, with the `gguf` package's arithmetic, bit for bit. Each holds, per 256 weights, an fp16 d, a scale per 16
// or 32 weights and indices into a grid of 4 or 8 values; the grids are the package's own (gguf.quants.<KIND>.grid,
// float32 [entries][width]) and IQ2_XXS.ksigns (128 bytes: 7 bits of sign index -> 8 signs,
// the 8th their parity), handed in. The kernels do not multiply these kinds: a matrix of them is dequantized at
// load (model/loader.py).

#include "api.h"
#include "blocks.h"

static int grid_block_bytes(int type) {
    switch (type) {
        case IQ2_XXS: return 66;
        case IQ2_XS: return 74;
        case IQ2_S: return 82;
        case IQ3_XXS: return 98;
        case IQ3_S: return 110;
        case IQ1_S: return 50;
        case IQ1_M: return 56;
        default: return 0;
    }
}

static inline uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

// y[0..n) = db g[j] with the sign of bit j of `signs` (set: negative), as numpy's db * grid * signs
static EXACT void signed_row(float db, const float *g, int n, unsigned signs, float *y) {
    for (int j = 0; j < n; j++) {
        const float v = db * g[j];
        y[j] = (signs >> j) & 1 ? -v : v;
    }
}

// y[0..8) = dl (g[j] + delta), as numpy's dl * (grid + delta) (IQ1_S, IQ1_M)
static EXACT void shifted_row(float dl, const float *g, float delta, float *y) {
    for (int j = 0; j < 8; j++) y[j] = dl * (g[j] + delta);
}

// one 256-block b of `type` -> y[256]
static EXACT void grid_block(int type, const uint8_t *b, const float *grid, const uint8_t *ksigns, float *y) {
    if (type == IQ1_S) {                    // qs[32], qh u16[8]: 3 more index bits per 8, the scale, delta's sign
        const float d = fp16(b);
        for (int s = 0; s < 8; s++) {
            const uint16_t qh = u16(b + 34 + 2 * s);
            const float dl = d * (float)(2 * ((qh >> 12) & 7) + 1), delta = qh & 0x8000 ? -0.125f : 0.125f;
            for (int k = 0; k < 4; k++) {
                shifted_row(dl, grid + 8 * (b[2 + 4 * s + k] | ((qh >> (3 * k)) & 7) << 8), delta, y + 32 * s + 8 * k);
            }
        }
        return;
    }
    if (type == IQ1_M) {        // qs[32], qh[16] (3 index bits and delta's sign per 8), scales u16[4]: 3 bits per 16
        uint16_t sc[4];             // and, in their top nibbles, d
        memcpy(sc, b + 48, 8);
        const uint16_t h = (sc[0] >> 12) | (sc[1] & 0xF000) >> 8 | (sc[2] & 0xF000) >> 4 | (sc[3] & 0xF000);
        const float d = _cvtsh_ss(h);
        for (int k = 0; k < 32; k++) {
            const int q = (b[32 + k / 2] >> (4 * (k % 2))) & 0x0F, s = (sc[k / 8] >> (3 * ((k / 2) % 4))) & 7;
            const float dl = d * (float)(2 * s + 1), delta = q & 0x08 ? -0.125f : 0.125f;
            shifted_row(dl, grid + 8 * (b[k] | (q & 7) << 8), delta, y + 8 * k);
        }
        return;
    }
    const float d = fp16(b);
    if (type == IQ2_XXS || type == IQ3_XXS) {      // per 32: indices, then a word of 4 x 7 sign bits and the scale
        const int three = type == IQ3_XXS;
        for (int s = 0; s < 8; s++) {
            const uint8_t *qs = b + 2 + 8 * s;
            const uint32_t a = three ? u32(b + 66 + 4 * s) : u32(b + 6 + 8 * s);
            const float db = d * (0.5f + (float)(a >> 28)) * (three ? 0.5f : 0.25f);
            for (int l = 0; l < 4; l++) {
                const unsigned signs = ksigns[(a >> (7 * l)) & 127];
                if (three) {
                    signed_row(db, grid + 4 * qs[2 * l], 4, signs, y + 32 * s + 8 * l);
                    signed_row(db, grid + 4 * qs[2 * l + 1], 4, signs >> 4, y + 32 * s + 8 * l + 4);
                } else {
                    signed_row(db, grid + 8 * qs[l], 8, signs, y + 32 * s + 8 * l);
                }
            }
        }
        return;
    }
    if (type == IQ2_XS) {                           // qs u16[32]: 9 index bits, 7 sign bits; a 4-bit scale per 16
        for (int k = 0; k < 32; k++) {
            const uint16_t q = u16(b + 2 + 2 * k);
            const int s = (b[66 + k / 4] >> (4 * ((k / 2) % 2))) & 0x0F;
            const float db = d * (0.5f + (float)s) * 0.25f;
            signed_row(db, grid + 8 * (q & 511), 8, ksigns[q >> 9], y + 8 * k);
        }
        return;
    }
    if (type == IQ2_S) {                  // qs[32], signs[32], qh[8] (2 index bits each), a 4-bit scale per 16
        for (int k = 0; k < 32; k++) {
            const int index = b[2 + k] | ((b[66 + k / 4] >> (2 * (k % 4))) & 3) << 8;
            const int s = (b[74 + k / 4] >> (4 * ((k / 2) % 2))) & 0x0F;
            const float db = d * (0.5f + (float)s) * 0.25f;
            signed_row(db, grid + 8 * index, 8, b[34 + k], y + 8 * k);
        }
        return;
    }
    // IQ3_S: qs[64] of 4 weights each, qh[8] (their 9th bits), signs[32] (a bit a weight), a 4-bit scale per 32
    for (int k = 0; k < 64; k++) {
        const int index = b[2 + k] | ((b[66 + k / 8] >> (k % 8)) & 1) << 8;
        const int s = (b[106 + k / 16] >> (4 * ((k / 8) % 2))) & 0x0F;
        const float db = d * (float)(1 + 2 * s);
        signed_row(db, grid + 4 * index, 4, b[74 + k / 2] >> (4 * (k % 2)), y + 4 * k);
    }
}

// n weights of `type` from src (whole 256-blocks) -> out; returns 0, or -1 for a type this file does not know
int gguf_dequantize_grid(int type, const uint8_t *src, int64_t n, float *out, const float *grid,
                         const uint8_t *ksigns) {
    const int bb = grid_block_bytes(type);
    if (!bb) return -1;
    for (int64_t b = 0; b < n / 256; b++) grid_block(type, src + b * bb, grid, ksigns, out + b * 256);
    return 0;
}

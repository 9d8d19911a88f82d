// The IQ kinds of 1-3 bits a weight (IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S). Each holds, per 256
// weights, an fp16 d, a scale per 16 or 32 weights and indices into a grid of 4 or 8 values; the grids are the
// `gguf` package's own (gguf.quants.<KIND>.grid, float32 [entries][width]) and IQ2_XXS.ksigns (128 bytes: 7 bits
// of sign index -> 8 signs, the 8th their parity), handed in once (gguf_grid: kernels/grids.py).
// grid_block: a block -> float32 with the package's arithmetic, bit for bit (gguf_dequantize).
// grid_levels: a 32-block as its scale (a float32 per 32; IQ2_XS, IQ2_S and IQ1_M: d / 8 times an odd multiplier per
// 16) and 4-bit indices into its kind's 16 levels (blocks.h's levels_of), which the 32-block kernels multiply as
// IQ4_NL's: the weights exactly, since each is its scale times an integer level.

#include "api.h"
#include "blocks.h"

static const float *GRID[IQ1_M + 1];        // by kind: the grid handed in, or NULL
static uint8_t *LEVEL[IQ1_M + 1];           // the kinds run as levels: each grid value's index into their levels
static const uint8_t *KSIGNS;

static int iq1(int type) { return type == IQ1_S || type == IQ1_M; }

void gguf_grid(int type, const float *grid, int64_t n, const uint8_t *ksigns) {
    if (!grid_kind(type) || GRID[type]) return;
    const int8_t *levels = levels_of(runs_as(type));
    LEVEL[type] = malloc(n);
    for (int64_t i = 0; i < n; i++) {       // g (IQ1_S, IQ1_M: 8 g + 1) -> its index
        const int v = iq1(type) ? 8 * (int)grid[i] + 1 : (int)grid[i];
        for (int l = 0; l < 16; l++)
            if (levels[l] == v) LEVEL[type][i] = (uint8_t)l;
    }
    KSIGNS = ksigns, GRID[type] = grid;
}

int grid_ready(int type) { return grid_kind(type) && GRID[type] && KSIGNS; }

static inline uint32_t u32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline uint16_t u16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }

typedef struct {            // a 32-block of a grid kind: weight j is scale[j / 16] times its value, the grid's
    float scale[2];         // g = grid[at[j / width] + j % width], negative where bit j of signs is set (IQ1_S,
    int width;              // IQ1_M: 8 g + delta[j / 8], delta +-1, under a scale dl / 8: dl (g + delta / 8), the
    int delta[4];           // same product rounded once)
    uint32_t signs;
    int at[8];
    uint16_t d;             // the kinds of a scale per 16: scale[half] = d odd[half] / 8, d the fp16 of the block
    uint8_t odd[2];
} Sub;

// sub-block s (weights 32 s ..) of a 256-block b of a grid kind
static EXACT Sub sub_block(int type, const uint8_t *b, int s) {
    Sub u = {0};
    if (type == IQ1_M) {    // qs[32], qh[16] (3 index bits and delta's sign per 8), scales u16[4]: 3 bits per 16 and,
        uint16_t sc[4];     // in their top nibbles, d
        memcpy(sc, b + 48, 8);
        const uint16_t h = (sc[0] >> 12) | (sc[1] & 0xF000) >> 8 | (sc[2] & 0xF000) >> 4 | (sc[3] & 0xF000);
        const float d = _cvtsh_ss(h);
        u.width = 8, u.d = h;
        for (int k = 0; k < 4; k++) {
            const int j = 4 * s + k, q = (b[32 + j / 2] >> (4 * (j % 2))) & 0x0F;
            u.at[k] = 8 * (b[j] | (q & 7) << 8), u.delta[k] = q & 0x08 ? -1 : 1;
        }
        for (int half = 0; half < 2; half++) {
            u.odd[half] = (uint8_t)(2 * ((sc[s / 2] >> (6 * (s % 2) + 3 * half)) & 7) + 1);
            u.scale[half] = d * (float)u.odd[half] * 0.125f;
        }
        return u;
    }
    const float d = fp16(b);
    if (type == IQ2_XS || type == IQ2_S) {      // 8 weights k a grid entry, a 4-bit s per 16: d (0.5 + s) / 4
        u.width = 8, u.d = u16(b);
        for (int k = 0; k < 4; k++) {
            const int j = 4 * s + k;
            if (type == IQ2_XS) {               // qs u16[32]: 9 index bits, 7 sign bits
                const uint16_t q = u16(b + 2 + 2 * j);
                u.at[k] = 8 * (q & 511), u.signs |= (uint32_t)KSIGNS[q >> 9] << (8 * k);
            } else {                            // IQ2_S: qs[32], signs[32], qh[8] (2 index bits each)
                u.at[k] = 8 * (b[2 + j] | ((b[66 + j / 4] >> (2 * (j % 4))) & 3) << 8);
                u.signs |= (uint32_t)b[34 + j] << (8 * k);
            }
        }
        for (int half = 0; half < 2; half++) {
            const int q = (b[(type == IQ2_XS ? 66 : 74) + s] >> (4 * half)) & 0x0F;
            u.odd[half] = (uint8_t)(2 * q + 1);
            u.scale[half] = d * (0.5f + (float)q) * 0.25f;
        }
        return u;
    }
    if (type == IQ1_S) {                    // qs[32], qh u16[8]: 3 more index bits per 8, the scale, delta's sign
        const uint16_t qh = u16(b + 34 + 2 * s);
        u.scale[0] = u.scale[1] = d * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f, u.width = 8;
        for (int k = 0; k < 4; k++)
            u.at[k] = 8 * (b[2 + 4 * s + k] | ((qh >> (3 * k)) & 7) << 8), u.delta[k] = qh & 0x8000 ? -1 : 1;
        return u;
    }
    if (type == IQ3_S) {    // qs[64] of 4 weights each, qh[8] (their 9th bits), signs[32] (a bit a weight), a 4-bit
        u.scale[0] = u.scale[1] = d * (float)(1 + 2 * ((b[106 + s / 2] >> (4 * (s % 2))) & 0x0F)), u.width = 4;
        u.signs = u32(b + 74 + 4 * s);                                                           // scale per 32
        for (int k = 0; k < 8; k++) u.at[k] = 4 * (b[2 + 8 * s + k] | ((b[66 + s] >> k) & 1) << 8);
        return u;
    }
    const int three = type == IQ3_XXS;      // per 32: indices, then a word of 4 x 7 sign bits and the scale
    const uint8_t *qs = b + 2 + 8 * s;
    const uint32_t a = three ? u32(b + 66 + 4 * s) : u32(b + 6 + 8 * s);
    u.scale[0] = u.scale[1] = d * (0.5f + (float)(a >> 28)) * (three ? 0.5f : 0.25f), u.width = three ? 4 : 8;
    for (int l = 0; l < 4; l++) u.signs |= (uint32_t)KSIGNS[(a >> (7 * l)) & 127] << (8 * l);
    for (int k = 0; k < (three ? 8 : 4); k++) u.at[k] = u.width * qs[k];
    return u;
}

// u's weights' indices into their levels, from the index of each grid value (LEVEL): the levels are laid so that
// level 15 - i is -(level i), and IQ1's 8 g - 1 just before its 8 g + 1 (blocks.h)
static inline __attribute__((always_inline)) void level_indices(const Sub *u, const uint8_t *level, const int WIDTH,
                                                                const int IQ1, uint8_t *index) {
    for (int k = 0; k < 32 / WIDTH; k++)
        for (int c = 0; c < WIDTH; c++) {
            const int j = WIDTH * k + c;
            const uint8_t l = level[u->at[k] + c];
            index[j] = IQ1 ? l - (u->delta[j / 8] < 0) : (u->signs >> j) & 1 ? l ^ 15 : l;
        }
}

void grid_levels(int type, const uint8_t *b, int s, uint8_t *out) {
    const Sub u = sub_block(type, b, s);
    uint8_t index[32];
    if (iq1(type)) level_indices(&u, LEVEL[type], 8, 1, index);
    else if (u.width == 8) level_indices(&u, LEVEL[type], 8, 0, index);
    else level_indices(&u, LEVEL[type], 4, 0, index);
    if (halves32(runs_as(type))) memcpy(out, &u.d, 2), memcpy(out + 2, u.odd, 2);
    else memcpy(out, u.scale, 4);
    for (int l = 0; l < 16; l++) out[4 + l] = index[l] | index[l + 16] << 4;
}

// a grid kind's 256-block b -> y[256]: scale v, as the package's product
EXACT void grid_block(int type, const uint8_t *b, float *y) {
    const float *grid = GRID[type];
    for (int s = 0; s < 8; s++) {
        const Sub u = sub_block(type, b, s);
        for (int j = 0; j < 32; j++) {
            const float g = grid[u.at[j / u.width] + j % u.width];
            const float v = iq1(type) ? 8 * g + (float)u.delta[j / 8] : (u.signs >> j) & 1 ? -g : g;
            y[32 * s + j] = u.scale[j / 16] * v;
        }
    }
}

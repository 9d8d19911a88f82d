// What csrc/blocks.c and csrc/blocks512.c share: a GGUF matrix's parts, the quantized activations and the
// blocks' fields.
#pragma once
#include <immintrin.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

enum { F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8, Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13,
       Q6_K = 14, IQ2_XXS = 16, IQ2_XS = 17, IQ3_XXS = 18, IQ1_S = 19, IQ4_NL = 20, IQ3_S = 21, IQ2_S = 22,
       IQ4_XS = 23, IQ1_M = 29 };

#define EXACT __attribute__((optimize("fp-contract=off")))     // each product and sum rounded as written (the gguf
                                                                // package's arithmetic, bit for bit)

// the packed kinds of the grid kinds that run from their bits (never a file's type): IQ4_NL's layout, each 32-block a
// float32 scale and 4-bit indices into the kind's own 16 levels (levels_of): IQ3_S's, IQ3_XXS's, and IQ2_XXS's and
// IQ1_S's in one table (IQ1_S's weights dl (grid + delta) as levels 8 grid +- 1 under a scale dl / 8). HALVES_IQ2_IQ1:
// the same table under a scale per 16 (IQ2_XS, IQ2_S, IQ1_M: d / 8 times an odd multiplier of at most 31)
enum { LEVELS_IQ3_S = 100, LEVELS_IQ3_XXS = 101, LEVELS_IQ2_IQ1 = 102, HALVES_IQ2_IQ1 = 103 };

// the type a file's type is packed and multiplied as: IQ4_XS's 256-blocks are 8 IQ4_NL 32-blocks (packed with float32
// scales: IQ4_XS's d (s - 32) exactly), the grid kinds' 8 32-blocks of their levels
static inline int runs_as(int type) {
    switch (type) {
        case IQ4_XS: return IQ4_NL;
        case IQ3_S: return LEVELS_IQ3_S;
        case IQ3_XXS: return LEVELS_IQ3_XXS;
        case IQ2_XXS: case IQ1_S: return LEVELS_IQ2_IQ1;
        case IQ2_XS: case IQ2_S: case IQ1_M: return HALVES_IQ2_IQ1;
        default: return type;
    }
}

// whether a packed type scales each 16 weights of its 32-blocks apart
static inline int halves32(int type) { return type == HALVES_IQ2_IQ1; }

// whether a packed type's 4-bit q index levels (IQ4_NL's, the grid kinds')
static inline int leveled(int type) { return type == IQ4_NL || type >= LEVELS_IQ3_S; }

// the IQ kinds of 256-blocks indexing grids of values (csrc/grids.c)
static inline int grid_kind(int type) {
    return type == IQ2_XXS || type == IQ2_XS || type == IQ3_XXS || type == IQ1_S || type == IQ3_S || type == IQ2_S ||
           type == IQ1_M;
}

// the weights of a block of `type` (F32, F16: 1)
static inline int block_size(int type) {
    return (type >= Q2_K && type <= Q6_K) || type == IQ4_XS || grid_kind(type) ? 256 : type <= F16 ? 1 : 32;
}

// the bytes of a block of a file's `type` (0: one this code does not read)
static inline int block_bytes(int type) {
    switch (type) {
        case F32: return 4;
        case F16: return 2;
        case Q4_0: return 18;
        case Q4_1: return 20;
        case Q5_0: return 22;
        case Q5_1: return 24;
        case Q8_0: return 34;
        case Q2_K: return 84;
        case Q3_K: return 110;
        case Q4_K: return 144;
        case Q5_K: return 176;
        case Q6_K: return 210;
        case IQ4_NL: return 18;
        case IQ4_XS: return 136;
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

// csrc/grids.c: whether a grid kind's grid was handed in (gguf_grid); its 256-block b -> y[256], the `gguf` package's
// arithmetic; sub-block s (32 weights) of a grid kind as levels -> out: its float32 scale (HALVES_IQ2_IQ1's kinds:
// the fp16 d and the odd multipliers of the weights 0 .. 15 and 16 .. 31, a byte each), then 16 bytes of 4-bit level
// indices (the low nibbles weights 0 .. 15, the high ones 16 .. 31)
#define LEVELED_BYTES 20    // a 32-block recoded as levels: 4 bytes of scale and 16 bytes
int grid_ready(int type);
void grid_block(int type, const uint8_t *b, float *y);
void grid_levels(int type, const uint8_t *b, int s, uint8_t *out);

typedef struct {            // one part of a matrix (kernels.GGUFLinear fills it)
    int type;               // a GGMLQuantizationType value
    int rows;               // its output rows
    int64_t stride;         // bytes per row in the file
    const uint8_t *data;    // the file's rows
    const int32_t *map;     // output row r reads file row map[r], or r where NULL
    const uint8_t *packed;  // NULL, or the rows interleaved by PACK_ROWS in output order (gguf_pack)
} Part;

#define MAX_PARTS 3
#define PASS_ROWS 8         // activation rows multiplied in one pass over a task's weights (gguf_linear's block_rows)
typedef struct Matrix {
    int n;
    Part part[MAX_PARTS];   // output rows: part 0's, then part 1's ...
} Matrix;

typedef struct {            // x [M, K] quantized for the parts' kinds of block
    int8_t *q32;            // per 32: [M][K / 32 * 32], scale d32 [M][K / 32], sums s32 [M][K / 32] and
    float *d32;             // ds32 = d32 s32 as a float [M][K / 32] (what a Q4_1 or Q5_1 block's minimum multiplies)
    int32_t *s32;
    float *ds32;
    int8_t *q256;           // per 256: [M][K], scale d256 [M][K / 256], sums of each 16 b256 [M][K / 16]
    float *d256;
    int16_t *b256;
    int16_t *s256;          // and sums of each 32 [M][K / 32] (the packed Q4_K's and Q5_K's mins)
    int32_t *h32;           // sums of each 32's first 16 [M][K / 32] (HALVES_IQ2_IQ1's), or NULL
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

// -- K-quants packed (gguf_pack): 8 rows' blocks b interleaved. A group-block of Q4_K (Q4K_PACKED bytes) holds
// d [8 rows], dmin [8] (fp16), scales sc [8 sub-blocks s][8 rows], mins mn [4 pairs p][8 rows][2: s = 2p, 2p + 1]
// and the file's qs [4 j][4 t][8 rows][8 bytes: row r's qs 32 j + 8 t ..]: low nibbles are sub-block 2j's weights
// 8t .. 8t + 7, high nibbles 2j + 1's. One of Q5_K (Q5K_PACKED) is Q4_K's with the file's fifth bits qh [4 t][8 rows]
// [8 bytes: qh 8 t ..] before the qs (bit s of byte l: sub-block s's weight l). One of Q6_K (Q6K_PACKED, the file's bytes, no more) holds d [8 rows] (fp16),
// sc [8 p][8 rows][2] (int8) and the file's ql and qh as [2 h][4 t][3][8 rows][8 bytes: ql 64 h + 8 t .., ql 64 h +
// 32 + 8 t .., qh 32 h + 8 t ..], in the order the kernels read them (out of order, the streams run at a third of
// the speed). One of Q2_K (Q2K_PACKED: 100 bytes a row's block of 84) is laid as Q6_K's without the ql: d [8 rows],
// its 4-bit scales as sc, the file's qs as [2 h][4 t][8 rows][8 bytes: qs 32 h + 8 t ..] (Q6_K's qh: bits 2 g of byte
// l are weight 128 h + 32 g + l's 2-bit q), then dmin [8 rows] (fp16) and its 4-bit mins mn [8 p][8 rows][2] (a min
// per 16 weights). One of Q3_K (Q3K_PACKED: 114 bytes for 110) is Q2_K's d, sc (its 6-bit scales less 32, int8) and
// qs, then the file's hmask as [4 t][8 rows][8 bytes: hmask 8 t ..] (bit 4 h + g of byte l: weight 128 h + 32 g + l's
// third bit): q = the 2 bits + 4 x the third, 0..7, is Q3_K's q + 4. Every kernel of the layout computes a row's block
// as exact integers (Q4_K, Q5_K: T = sum_s sc_s sum(q x over s), Mn = sum_s mn_s sum(x over s); Q6_K: T = sum_s sc_s
// sum((q - 32) x); Q3_K: sum_s sc_s sum((q - 4) x); Q2_K: T = sum_s sc_s sum(q x), Mn over its 16 sub-blocks), then
// the one float part below, so a row's result is the same on AVX2 and AVX-512 and whatever the batch.
enum { PACK_ROWS = 8, Q4K_PACKED = 1184, Q4K_SC = 32, Q4K_MN = 96, Q4K_QS = 160, Q5K_PACKED = 1440, Q5K_QH = 160,
       Q5K_QS = 416,
       Q6K_PACKED = 1680, Q6K_SC = 16, Q6K_QS = 144,
       Q2K_PACKED = 800, Q2K_QS = 144, Q2K_DMIN = 656, Q2K_MN = 672, Q3K_PACKED = 912, Q3K_HM = 656 };

// a packed K-quant kind as the kernels' flags: FIVE (Q5_K's fifth bits), SIX (sub-blocks of 16: Q6_K 1, Q2_K 2, Q3_K 3)
static inline int k_size(const int FIVE, const int SIX) {
    return SIX == 3 ? Q3K_PACKED : SIX == 2 ? Q2K_PACKED : SIX ? Q6K_PACKED : FIVE ? Q5K_PACKED : Q4K_PACKED;
}

// a K-quant type's SIX flag (Q6_K's layout of 16-weight sub-blocks), 0 for Q4_K and Q5_K
static inline int six_of(int type) { return type == Q6_K ? 1 : type == Q2_K ? 2 : type == Q3_K ? 3 : 0; }

// Q6_K's and Q3_K's offset of q (T's q - offset: Q6_K 32, Q3_K 4, as a shift); Q2_K has none (its mins instead)
static inline int offset_shift(const int SIX) { return SIX == 1 ? 5 : SIX == 3 ? 2 : 0; }

// -- 32-blocks packed (gguf_pack): 8 rows' blocks b interleaved. A group-block holds d [8 rows] (fp16), then m [8]
// (fp16; Q4_1, Q5_1), then the fifth bits qh [4 c][8 rows] (Q5_0, Q5_1: byte c of the row's qh, bit k its weight
// 8 c + k), then the qs: Q8_0's [4 t][8 rows][8 bytes: q of the weights 8 t ..], Q4's and Q5's [2 t][8 rows][8 bytes:
// the file's qs 8 t ..: low nibbles the weights 8 t + k, high nibbles 16 + 8 t + k]. The file's bytes, no more.
// A leveled type's (IQ4_NL's, IQ4_XS's sub-blocks, the grid kinds') holds its scales as float32 [8 rows]
// (HALVES_IQ2_IQ1: d [8 rows] (fp16), then the odd multipliers of the weights 0 .. 15 [8 rows] and of 16 .. 31 [8
// rows], a byte each: halves_scales), then Q4's qs: a nibble is the index of its weight's level (levels_of). Every
// kernel computes a row's block as the exact integer T = sum(q x) (q in -128..127 for Q8_0 and the levels, the
// unsigned 0..15 or 0..31 for the others; HALVES_IQ2_IQ1: a T for each half), then the one float part below.
static inline int mins32(int type) { return type == Q4_1 || type == Q5_1; }
static inline int five32(int type) { return type == Q5_0 || type == Q5_1; }
static inline int qh32(int type) { return 16 + 16 * mins32(type); }            // where qh starts
static inline int qs32(int type) { return leveled(type) ? 32 : qh32(type) + 32 * five32(type); }   // the qs' start
// w = d (q - offset) (+ m), q unsigned; the grid kinds' levels run as q = level + 64 (<= 126: a maddubs pair of
// them stays within int16)
static inline int q32_offset(int type) { return type == Q4_0 ? 8 : type == Q5_0 ? 16 : type >= LEVELS_IQ3_S ? 64 : 0; }

// a group-block's bytes for a packed type (0: a type that is not packed)
static inline int packed_block(int type) {
    switch (type) {
        case Q4_K: return Q4K_PACKED;
        case Q5_K: return Q5K_PACKED;
        case Q6_K: return Q6K_PACKED;
        case Q2_K: return Q2K_PACKED;
        case Q3_K: return Q3K_PACKED;
        case Q8_0: return 16 + 256;
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: case IQ4_NL: case LEVELS_IQ3_S: case LEVELS_IQ3_XXS:
        case LEVELS_IQ2_IQ1: case HALVES_IQ2_IQ1: return qs32(type) + 128;
        default: return 0;
    }
}

// packed_rows' switch over the packed types, for blocks.c's kernels and blocks512.c's, in a scope of type, g0, K, a,
// m0 and out: DOT (a K-quant's: its group-blocks, C chunks, R rows more, FIVE, SIX) or DOT32 (a 32-block's: its
// blocks, C, R, TYPE) of group g0 against activation rows m0 .. into out
#define PACKED_TYPES(DOT, DOT32, C, R) switch (type) {                                                              \
        case Q4_K: DOT(g0, K / 256, a, m0, C, R, 0, 0, out); break;                                                   \
        case Q5_K: DOT(g0, K / 256, a, m0, C, R, 1, 0, out); break;                                                   \
        case Q6_K: DOT(g0, K / 256, a, m0, C, R, 0, 1, out); break;                                                   \
        case Q2_K: DOT(g0, K / 256, a, m0, C, R, 0, 2, out); break;                                                   \
        case Q3_K: DOT(g0, K / 256, a, m0, C, R, 0, 3, out); break;                                                   \
        case Q8_0: DOT32(g0, K / 32, a, m0, C, R, Q8_0, out); break;                                                  \
        case Q4_0: DOT32(g0, K / 32, a, m0, C, R, Q4_0, out); break;                                                  \
        case Q4_1: DOT32(g0, K / 32, a, m0, C, R, Q4_1, out); break;                                                  \
        case Q5_0: DOT32(g0, K / 32, a, m0, C, R, Q5_0, out); break;                                                  \
        case Q5_1: DOT32(g0, K / 32, a, m0, C, R, Q5_1, out); break;                                                  \
        case IQ4_NL: DOT32(g0, K / 32, a, m0, C, R, IQ4_NL, out); break;                                              \
        case LEVELS_IQ3_S: DOT32(g0, K / 32, a, m0, C, R, LEVELS_IQ3_S, out); break;                                  \
        case LEVELS_IQ3_XXS: DOT32(g0, K / 32, a, m0, C, R, LEVELS_IQ3_XXS, out); break;                              \
        case LEVELS_IQ2_IQ1: DOT32(g0, K / 32, a, m0, C, R, LEVELS_IQ2_IQ1, out); break;                              \
        case HALVES_IQ2_IQ1: DOT32(g0, K / 32, a, m0, C, R, HALVES_IQ2_IQ1, out); break;                              \
    }

// a leveled type's 16 levels: a 4-bit q's weight, before the block's scale. IQ4_NL's and IQ4_XS's are
// gguf.quants.IQ4_NL.kvalues; the grid kinds' are their grids' values with either sign (IQ3_S: the odd 1 .. 15;
// IQ3_XXS: 4, 12, .. 52, 62; the IQ2 kinds: 8, 25, 43; the IQ1 kinds: 8 grid +- 1 of grid -1, 0, 1; unused levels
// 0), laid so that level 15 - i is -(level i) and IQ1's 8 grid - 1 is just before its 8 grid + 1 (csrc/grids.c's
// recoding)
static const int8_t IQ4_LEVELS[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};
static const int8_t IQ3_S_LEVELS[16] = {-15, -13, -11, -9, -7, -5, -3, -1, 1, 3, 5, 7, 9, 11, 13, 15};
static const int8_t IQ3_XXS_LEVELS[16] = {-62, -52, -44, -36, -28, -20, -12, -4, 4, 12, 20, 28, 36, 44, 52, 62};
static const int8_t IQ2_IQ1_LEVELS[16] = {-43, -25, -9, -7, -8, 0, 0, -1, 1, 0, 0, 8, 7, 9, 25, 43};
static inline const int8_t *levels_of(int type) {
    return type == LEVELS_IQ3_S ? IQ3_S_LEVELS : type == LEVELS_IQ3_XXS ? IQ3_XXS_LEVELS
         : type == LEVELS_IQ2_IQ1 || type == HALVES_IQ2_IQ1 ? IQ2_IQ1_LEVELS : IQ4_LEVELS;
}

// the packed kernels fetch the group-blocks AHEAD of the one they multiply, into L2 (_MM_HINT_T1): one row of
// activations streams the weights faster than the hardware's prefetch alone fetches them, and fetched into L2 alone
// they streamed faster than fetched into L1 too (measured; the cause not known)
#define AHEAD 4
#define AHEAD_BYTES (AHEAD * Q4K_PACKED)    // the 32-blocks' (smaller) group-blocks: about the same distance

// bytes (r, r) for 8 rows r: a sub-block's scale in the lanes (2r, 2r + 1) of a row's two 4-byte halves
static inline __m128i q4k_scales(const uint8_t *g, int s) {
    const __m128i v = _mm_loadl_epi64((const __m128i *)(g + Q4K_SC + 8 * s));
    return _mm_unpacklo_epi8(v, v);
}
static inline __m128i q6k_scales(const uint8_t *g, int s) {
    const __m128i odd = _mm_set1_epi8(s % 2), even = _mm_setr_epi8(0, 0, 2, 2, 4, 4, 6, 6, 8, 8, 10, 10, 12, 12, 14, 14);
    return _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(g + Q6K_SC + 16 * (s / 2))), _mm_add_epi8(even, odd));
}

// lane r: sum over the 4 pairs p of w[p][r][0] xs[2p] + w[p][r][1] xs[2p + 1] (w: 4 x 16 bytes, unsigned or not)
static inline __m256i pair_sums(const uint8_t *w, const int16_t *xs, const int SIGNED) {
    __m256i m = _mm256_setzero_si256();
    for (int p = 0; p < 4; p++) {
        int32_t pair;
        memcpy(&pair, xs + 2 * p, 4);
        const __m128i v = _mm_loadu_si128((const __m128i *)(w + 16 * p));
        m = _mm256_add_epi32(m, _mm256_madd_epi16(SIGNED ? _mm256_cvtepi8_epi16(v) : _mm256_cvtepu8_epi16(v),
                                                  _mm256_set1_epi32(pair)));
    }
    return m;
}

// pair_sums over a table of 16 sub-blocks' bytes [8 p][8 rows][2] and an activation row's 16 sums
static inline __m256i sums16(const uint8_t *w, const int16_t *xs, const int SIGNED) {
    return _mm256_add_epi32(pair_sums(w, xs, SIGNED), pair_sums(w + 64, xs + 8, SIGNED));
}

// acc[r] += T[r] (d[r] dx) (- Mn[r] (dmin[r] dx)): a group-block's float part. Q4_K, Q5_K: xs the activation row's sums of
// each 32 in the block; Q6_K, Q3_K, Q2_K: its sums of each 16 (for their q's offset, Q2_K's mins)
static inline __m256 packed_float(__m256 acc, __m256i T, const uint8_t *g, const int16_t *xs, float dx, const int SIX) {
    const __m256 vdx = _mm256_set1_ps(dx);
    if (offset_shift(SIX)) {
        T = _mm256_sub_epi32(T, _mm256_slli_epi32(sums16(g + Q6K_SC, xs, 1), offset_shift(SIX)));
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T), _mm256_mul_ps(d, vdx), acc);
    if (SIX == 1 || SIX == 3) return acc;
    const __m256 dmin = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + (SIX ? Q2K_DMIN : 16))));
    const __m256i Mn = SIX ? sums16(g + Q2K_MN, xs, 0) : pair_sums(g + Q4K_MN, xs, 0);
    return _mm256_fnmadd_ps(_mm256_cvtepi32_ps(Mn), _mm256_mul_ps(dmin, vdx), acc);
}

// acc[r] += (T[r] - offset s) (d[r] dx) (+ m[r] ds): a 32-block group-block's float part, s the activation row's sum
// of the block's 32 bytes, ds = dx s as a float
static inline __m256 packed_float32(__m256 acc, __m256i T, const uint8_t *g, float dx, int32_t s, float ds,
                                    const int TYPE) {
    if (q32_offset(TYPE)) T = _mm256_sub_epi32(T, _mm256_set1_epi32(q32_offset(TYPE) * s));
    const __m256 d = leveled(TYPE) ? _mm256_loadu_ps((const float *)g) : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(T), _mm256_mul_ps(d, _mm256_set1_ps(dx)), acc);
    if (!mins32(TYPE)) return acc;
    return _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(g + 16))), _mm256_set1_ps(ds), acc);
}

// a HALVES_IQ2_IQ1 group-block's scales of its 8 rows' weights 0 .. 15 (dl) and 16 .. 31 (dh): d odd / 8, exactly
// (an fp16 times an integer of 5 bits fits float32's 24; / 8 a power of two), the float32 the file's scale is
static inline void halves_scales(const uint8_t *g, __m256 *dl, __m256 *dh) {
    const __m256 d = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)g)), _mm256_set1_ps(0.125f));
    *dl = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + 16)))));
    *dh = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(g + 24)))));
}

// packed_float32 for HALVES_IQ2_IQ1, its two halves in turn: Tl and Th the sums over the weights 0 .. 15 and 16 .. 31
// (q = level + 64), h the activation row's sum of the block's first 16 bytes: acc[r] += (Tl[r] - 64 h) (dl[r] dx),
// then += (Th[r] - 64 (s - h)) (dh[r] dx)
static inline __m256 halves_float32(__m256 acc, __m256i Tl, __m256i Th, const uint8_t *g, float dx, int32_t s,
                                    int32_t h) {
    const int offset = q32_offset(HALVES_IQ2_IQ1);
    const __m256 vdx = _mm256_set1_ps(dx);
    __m256 dl, dh;
    halves_scales(g, &dl, &dh);
    Tl = _mm256_sub_epi32(Tl, _mm256_set1_epi32(offset * h)), Th = _mm256_sub_epi32(Th, _mm256_set1_epi32(offset * (s - h)));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(Tl), _mm256_mul_ps(dl, vdx), acc);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(Th), _mm256_mul_ps(dh, vdx), acc);
}

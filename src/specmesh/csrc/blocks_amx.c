// The packed blocks (blocks.h) on AMX's int8 tiles, for products of 9 rows of activations or more (Q2_K, Q3_K: 12;
// the 32-blocks: 40; below, blocks512.c's are faster): the same bits as blocks.c's and blocks512.c's packed
// kernels. A tile product gives one sub-block's (a 32-block's) exact int32 sums for up to 16 activation rows x 16
// weight rows (two groups of 8); the sub-blocks' scales, the mins and the float step follow in AVX-512, lane for
// lane blocks.h's packed_float (and packed_float32).
//
// Tiles: C = A . B with A the activations [rows m][K of a sub-block] (signed bytes, read in place from Acts.q256 or
// Acts.q32 at a stride of K), B a sub-block's weights in VNNI order [K / 4][16 weight rows][4 bytes] (unpacked once per
// block into L1, then used for every 16 activation rows), C [m][16 weight rows] int32. A sub-block is 32 weights
// (Q4_K, Q5_K, the 32-blocks) or 16 (Q2_K, Q3_K, Q6_K): a tile product may not span two scales.
#pragma GCC target("amx-tile,amx-int8,avx512f,avx512bw,avx512dq,avx512vl")
#include "blocks.h"
#include "blocks512.h"
#include <stdlib.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} TileConfig;

#define C0 0                // tile registers by number: the intrinsics paste them into the instruction's text
#define C1 1
#define C2 2
#define C3 3
#define A0 4
#define B0 5
#define A1 6
#define B1 7

// C tiles of `m` rows x 16 int32, A tiles of m rows x `kw` bytes, B tiles of kw / 4 rows x 64 bytes
static void configure(int m, int kw) {
    TileConfig c = {0};
    c.palette = 1;
    for (int t = C0; t <= C3; t++) c.rows[t] = (uint8_t)m, c.colsb[t] = 64;
    c.rows[A0] = c.rows[A1] = (uint8_t)m, c.colsb[A0] = c.colsb[A1] = (uint16_t)kw;
    c.rows[B0] = c.rows[B1] = (uint8_t)(kw / 4), c.colsb[B0] = c.colsb[B1] = 64;
    _tile_loadconfig(&c);
}

// a block of 16 weight rows made ready for the tiles: B [sub-block][its K / 4][64 bytes], the sub-blocks' scales
// [sub-block][16 rows] (int32), the scales' or mins' pairs [pair][16 rows] (int16 pairs in int32 lanes, for the
// activations' sums; Q2_K: the scales', then the mins' in mins), and d, dmin [16 rows]
typedef struct {
    int8_t b[4096] __attribute__((aligned(64)));   // a sub-block's B at 16 kw bytes (kw: its weights)
    __m512i sc[16], pairs[8], mins[8];
    __m512 d, dmin;
} Ready;

static const uint8_t zero_group[Q6K_PACKED] __attribute__((aligned(64)));   // (the largest of 16-weight sub-blocks)

static inline __m512i two_groups(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

static void ready_q45(const uint8_t *ga, const uint8_t *gb, int five, Ready *r) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const int qs = five ? Q5K_QS : Q4K_QS;
    for (int j = 0; j < 4; j++)
        for (int t = 0; t < 4; t++) {                  // sub-blocks 2j (low nibbles), 2j + 1: weights 8t ..
            const __m512i va = _mm512_loadu_si512(ga + qs + (4 * j + t) * 64), vb = _mm512_loadu_si512(gb + qs + (4 * j + t) * 64);
            __m512i la = _mm512_and_si512(va, nib), ha = _mm512_and_si512(_mm512_srli_epi16(va, 4), nib);
            __m512i lb = _mm512_and_si512(vb, nib), hb = _mm512_and_si512(_mm512_srli_epi16(vb, 4), nib);
            if (five) {
                const __m512i qa = _mm512_loadu_si512(ga + Q5K_QH + 64 * t), qb = _mm512_loadu_si512(gb + Q5K_QH + 64 * t);
                la = _mm512_or_si512(la, fifth512(qa, 2 * j)), ha = _mm512_or_si512(ha, fifth512(qa, 2 * j + 1));
                lb = _mm512_or_si512(lb, fifth512(qb, 2 * j)), hb = _mm512_or_si512(hb, fifth512(qb, 2 * j + 1));
            }
            sixteen_rows(la, lb, r->b + 512 * (2 * j) + 128 * t);
            sixteen_rows(ha, hb, r->b + 512 * (2 * j + 1) + 128 * t);
        }
    for (int s = 0; s < 8; s++)
        r->sc[s] = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(ga + Q4K_SC + 8 * s)),
                                                           _mm_loadl_epi64((const __m128i *)(gb + Q4K_SC + 8 * s))));
    for (int p = 0; p < 4; p++)
        r->pairs[p] = two_groups(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ga + Q4K_MN + 16 * p))),
                                 _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(gb + Q4K_MN + 16 * p))));
    r->d = halves(ga, gb), r->dmin = halves(ga + 16, gb + 16);
}

// Q6_K's (and Q2_K's) scales of 16 weights, as int32 and as int16 pairs, and d
static void q6_scales(const uint8_t *ga, const uint8_t *gb, Ready *r) {
    for (int p = 0; p < 8; p++) {                      // scales 2p, 2p + 1 of each row, as int16 pairs
        const __m512i pair = two_groups(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(ga + Q6K_SC + 16 * p))),
                                        _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(gb + Q6K_SC + 16 * p))));
        r->pairs[p] = pair;
        r->sc[2 * p] = _mm512_srai_epi32(_mm512_slli_epi32(pair, 16), 16), r->sc[2 * p + 1] = _mm512_srai_epi32(pair, 16);
    }
    r->d = halves(ga, gb);
}

static void ready_q6(const uint8_t *ga, const uint8_t *gb, Ready *r) {
    for (int hh = 0; hh < 2; hh++)
        for (int t = 0; t < 4; t++) {
            const uint8_t *a3 = ga + Q6K_QS + (4 * hh + t) * 192, *b3 = gb + Q6K_QS + (4 * hh + t) * 192;
            const __m512i a0 = _mm512_loadu_si512(a3), a1 = _mm512_loadu_si512(a3 + 64), ah = _mm512_loadu_si512(a3 + 128);
            const __m512i b0 = _mm512_loadu_si512(b3), b1 = _mm512_loadu_si512(b3 + 64), bh = _mm512_loadu_si512(b3 + 128);
            for (int gr = 0; gr < 4; gr++)             // weights 128 hh + 32 gr + 8 t ..: sub-block 8 hh + 2 gr + t / 2
                sixteen_rows(q6_bits512(a0, a1, ah, gr), q6_bits512(b0, b1, bh, gr), r->b + 256 * (8 * hh + 2 * gr + t / 2) + 128 * (t % 2));
        }
    q6_scales(ga, gb, r);
}

// Q2_K's (three: Q3_K's) q from their 2 bits (and third bit)
static void ready_q23(const uint8_t *ga, const uint8_t *gb, int three, Ready *r) {
    for (int v = 0; v < 8; v++) {                      // v = 4 hh + t, as ready_q6's
        const int hh = v / 4, t = v % 4;
        const __m512i a = _mm512_loadu_si512(ga + Q2K_QS + 64 * v), b = _mm512_loadu_si512(gb + Q2K_QS + 64 * v);
        for (int gr = 0; gr < 4; gr++) {
            __m512i qa = q2_bits512(a, gr), qb = q2_bits512(b, gr);
            if (three) {                               // (a Q2_K group-block ends where Q3_K's hmask begins)
                const __m512i ha = _mm512_loadu_si512(ga + Q3K_HM + 64 * t), hb = _mm512_loadu_si512(gb + Q3K_HM + 64 * t);
                qa = _mm512_or_si512(qa, q3_third512(ha, 4 * hh + gr)), qb = _mm512_or_si512(qb, q3_third512(hb, 4 * hh + gr));
            }
            sixteen_rows(qa, qb, r->b + 256 * (8 * hh + 2 * gr + t / 2) + 128 * (t % 2));
        }
    }
    q6_scales(ga, gb, r);
    if (three) return;
    for (int p = 0; p < 8; p++)
        r->mins[p] = two_groups(_mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(ga + Q2K_MN + 16 * p))),
                                _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(gb + Q2K_MN + 16 * p))));
    r->dmin = halves(ga + Q2K_DMIN, gb + Q2K_DMIN);
}

// lane n: sum over pairs p < P of pairs[p] (two int16) times the activation row's sums xs[2p], xs[2p + 1]
static inline __m512i pair_sums16(const __m512i *pairs, const int16_t *xs, int P) {
    __m512i m = _mm512_setzero_si512();
    for (int p = 0; p < P; p++) {
        int32_t two;
        memcpy(&two, xs + 2 * p, 4);
        m = _mm512_add_epi32(m, _mm512_madd_epi16(pairs[p], _mm512_set1_epi32(two)));
    }
    return m;
}

// sub-block s's exact sums into tile Cn: the activations' bytes of it (rows at a stride of K) times its B
#define SUB_BLOCK(Cn, An, Bn, s) do {                                                                                \
        _tile_loadd(An, x + kw * (s), K);                                                                            \
        _tile_loadd(Bn, r->b + 16 * kw * (s), 64);                                                                   \
        _tile_zero(Cn);                                                                                              \
        _tile_dpbssd(Cn, An, Bn);                                                                                    \
    } while (0)

// One slab of 16 weight rows (groups ga, gb; gb NULL: none, its outputs zero) against activation rows 0 .. M, with
// the tiles configured for `configured` rows: acc [M][16], rows 0..7 of group a then of group b
static void slab(int type, const uint8_t *ga, const uint8_t *gb, int K, const Acts *a, int M, Ready *r,
                 int32_t (*c)[16][16], int *configured, float *acc) {
    const int six = six_of(type), two = six == 2, three = six == 3, five = type == Q5_K;
    const int S = six ? 16 : 8, kw = 256 / S, offset = offset_shift(six);
    const int KB = K / 256;
    const int size = packed_block(type);
    for (int64_t i = 0; i < (int64_t)M * 16; i++) acc[i] = 0;
    for (int b = 0; b < KB; b++, ga += size, gb = gb ? gb + size : NULL) {
        if (two || three) ready_q23(ga, gb ? gb : zero_group, three, r);
        else if (six) ready_q6(ga, gb ? gb : zero_group, r);
        else ready_q45(ga, gb ? gb : zero_group, five, r);
        for (int m0 = 0; m0 < M; m0 += 16) {
            const int mt = M - m0 < 16 ? M - m0 : 16;
            if (mt != *configured) configure(mt, kw), *configured = mt;
            const int8_t *x = a->q256 + (int64_t)m0 * K + 256 * b;
            for (int s = 0; s < S; s += 4) {       // four sub-blocks at a time, each on a C tile of its own
                SUB_BLOCK(C0, A0, B0, s);
                SUB_BLOCK(C1, A1, B1, s + 1);
                SUB_BLOCK(C2, A0, B0, s + 2);
                SUB_BLOCK(C3, A1, B1, s + 3);
                _tile_stored(C0, c[s], 64);
                _tile_stored(C1, c[s + 1], 64);
                _tile_stored(C2, c[s + 2], 64);
                _tile_stored(C3, c[s + 3], 64);
            }
            for (int i = 0; i < mt; i++) {
                const int64_t at = (int64_t)(m0 + i) * KB + b;
                __m512i T = _mm512_setzero_si512();
                for (int s = 0; s < S; s++) T = _mm512_add_epi32(T, _mm512_mullo_epi32(_mm512_load_si512(c[s][i]), r->sc[s]));
                const __m512 dx = _mm512_set1_ps(a->d256[at]);
                float *o = acc + 16 * (int64_t)(m0 + i);
                __m512 v = _mm512_loadu_ps(o);
                if (offset) T = _mm512_sub_epi32(T, _mm512_slli_epi32(pair_sums16(r->pairs, a->b256 + at * 16, 8), offset));
                v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T), _mm512_mul_ps(r->d, dx), v);
                if (!six) v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(pair_sums16(r->pairs, a->s256 + at * 8, 4)),
                                               _mm512_mul_ps(r->dmin, dx), v);
                if (two) v = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(pair_sums16(r->mins, a->b256 + at * 16, 8)),
                                              _mm512_mul_ps(r->dmin, dx), v);
                _mm512_storeu_ps(o, v);
            }
        }
    }
}

// -- The 32-blocks: a tile product is one block's exact sums for up to 16 activation rows x 16 weight rows
// (HALVES_IQ2_IQ1: one half's, a scale's 16 weights: a unit). B is sixteen32's weights as they are (unsigned bytes; A
// the activations' signed ones: tdpbsud), so C holds the T the vector kernels sum and the float step is theirs
// (float16_32, halves16_32). Four units at a time, each on a C tile of its own.
#define UNIT32(Cn, An, Bn, u) do {                                                                                   \
        _tile_loadd(An, x + kw * (u), 32 * QB);                                                                      \
        _tile_loadd(Bn, bs + 16 * kw * (u), 64);                                                                     \
        _tile_zero(Cn);                                                                                              \
        _tile_dpbsud(Cn, An, Bn);                                                                                    \
    } while (0)

// slab's work for a 32-block type: bs [4][512] the B of four blocks, c [4][16][16] the C of four units
static void slab32(int type, const uint8_t *ga, const uint8_t *gb, int K, const Acts *a, int M, int8_t *bs,
                   int32_t (*c)[16][16], int *configured, float *acc) {
    const int QB = K / 32, size = packed_block(type), units = 1 + halves32(type), kw = 32 / units, step = 4 / units;
    for (int64_t i = 0; i < (int64_t)M * 16; i++) acc[i] = 0;
    for (int b = 0; b < QB; b += step) {
        const int nb = QB - b < step ? QB - b : step, nu = nb * units;
        __m512 d[4], m[4];
        for (int j = 0; j < nb; j++) {
            __m512i w[8];
            sixteen32(ga + (int64_t)(b + j) * size, gb ? gb + (int64_t)(b + j) * size : zero_group, type, w, &d[j], &m[j]);
            for (int h = 0; h < 8; h++) _mm512_store_si512(bs + 512 * j + 64 * h, w[h]);
        }
        for (int m0 = 0; m0 < M; m0 += 16) {
            const int mt = M - m0 < 16 ? M - m0 : 16;
            if (mt != *configured) configure(mt, kw), *configured = mt;
            const int8_t *x = a->q32 + ((int64_t)m0 * QB + b) * 32;
            if (nu == 4) {
                UNIT32(C0, A0, B0, 0);
                UNIT32(C1, A1, B1, 1);
                UNIT32(C2, A0, B0, 2);
                UNIT32(C3, A1, B1, 3);
                _tile_stored(C0, c[0], 64);
                _tile_stored(C1, c[1], 64);
                _tile_stored(C2, c[2], 64);
                _tile_stored(C3, c[3], 64);
            } else {
                for (int u = 0; u < nu; u++) {
                    UNIT32(C0, A0, B0, u);
                    _tile_stored(C0, c[u], 64);
                }
            }
            for (int i = 0; i < mt; i++) {
                float *o = acc + 16 * (int64_t)(m0 + i);
                __m512 v = _mm512_loadu_ps(o);
                for (int j = 0; j < nb; j++) {
                    const int64_t at = (int64_t)(m0 + i) * QB + b + j;
                    if (units == 2)
                        v = halves16_32(v, _mm512_load_si512(c[2 * j][i]), _mm512_load_si512(c[2 * j + 1][i]), d[j], m[j], a, at);
                    else v = float16_32(v, _mm512_load_si512(c[j][i]), d[j], m[j], a, at, type);
                }
                _mm512_storeu_ps(o, v);
            }
        }
    }
}

// Rows `rows` of a packed part of `type` (its first group g; rows a multiple of 16 or the part's last) against
// activation rows 0 .. M: y[i][n + c] = the product + bias[n + c] (y of N columns). Each value is the one
// packed_float (packed_float32) gives it.
void packed_tiles(int type, const uint8_t *g, int rows, int K, const Acts *a, int M, const float *bias, float *y,
                  int N, int n) {
    const int blocks32 = block_size(type) == 32;
    const int64_t group = (int64_t)(K / block_size(type)) * packed_block(type);
    Ready *r = aligned_alloc(64, sizeof(Ready));
    int32_t (*c)[16][16] = aligned_alloc(64, sizeof(int32_t) * 16 * 16 * 16);
    float *acc = aligned_alloc(64, sizeof(float) * 16 * (int64_t)M);
    int configured = 0;
    for (int r0 = 0; r0 < rows; r0 += 16, g += 2 * group) {
        const int cols = rows - r0 < 16 ? rows - r0 : 16;
        const uint8_t *gb = cols > PACK_ROWS ? g + group : NULL;
        if (blocks32) slab32(type, g, gb, K, a, M, r->b, c, &configured, acc);
        else slab(type, g, gb, K, a, M, r, c, &configured, acc);
        for (int i = 0; i < M; i++)
            for (int col = 0; col < cols; col++)
                y[(int64_t)i * N + n + r0 + col] = acc[16 * i + col] + (bias ? bias[n + r0 + col] : 0.0f);
    }
    _tile_release();
    free(acc);
    free(c);
    free(r);
}

// gguf_linear's products on AVX-512 with VNNI (csrc/blocks.c calls them where use_vnni is on), the same bits as
// blocks.c's: the 32-blocks up to PASS_ROWS rows of activations per unpacked weight row, a 512-bit register holding
// two of blocks.c's 256-bit vectors (each int32 lane sums the same products as the AVX2 kernel's lane, and the
// float part is blocks.c's, instruction for instruction); the packed K-quants 8 weight rows per register.
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include "blocks.h"
#include "blocks512.h"
#include "vec.h"
#include <stdlib.h>

// The 32-blocks, two at a time: blocks b and b + 1 in the low and high halves. A block's int32 lanes are
// AVX2's maddubs + madd(1) (no pair saturates: |q| <= 128, |x| <= 127) as one dpbusd; x takes q's sign as
// AVX2's sign_epi8 gives it.
static inline __attribute__((always_inline)) __m256i unpack32(const uint8_t *w, const int TYPE) {
    const int mins = TYPE == Q4_1 || TYPE == Q5_1, five = TYPE == Q5_0 || TYPE == Q5_1;
    if (TYPE == Q8_0) return _mm256_loadu_si256((const __m256i *)(w + 2));
    const uint8_t *qs = w + 2 + 2 * mins + 4 * five;
    const __m128i v = _mm_loadu_si128((const __m128i *)qs);
    __m256i q = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v), _mm256_set1_epi8(0x0F));
    if (five) {
        uint32_t qh;
        memcpy(&qh, w + 2 + 2 * mins, 4);
        q = _mm256_or_si256(q, _mm256_maskz_mov_epi8(qh, _mm256_set1_epi8(0x10)));
    }
    return mins ? q : _mm256_sub_epi8(q, _mm256_set1_epi8(five ? 16 : 8));
}

static inline __attribute__((always_inline)) void dot32_512(const uint8_t *w, int QB, const Acts *a, int64_t m0,
                                                            const int MB, const int TYPE, float *out) {
    const int mins = TYPE == Q4_1 || TYPE == Q5_1;
    const int BB = TYPE == Q8_0 ? 34 : TYPE == Q4_0 ? 18 : TYPE == Q4_1 ? 20 : TYPE == Q5_0 ? 22 : 24;
    __m256 acc[PASS_ROWS];
    float off[PASS_ROWS];
    for (int i = 0; i < MB; i++) acc[i] = _mm256_setzero_ps(), off[i] = 0;
    for (int b = 0; b < QB; b += 2, w += 2 * BB) {
        const int two = b + 1 < QB;                    // a last block alone: the high half is zero, unused
        const float d0 = fp16(w), d1 = two ? fp16(w + BB) : 0;
        const float m0w = mins ? fp16(w + 2) : 0, m1w = mins && two ? fp16(w + BB + 2) : 0;
        const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(unpack32(w, TYPE)),
                                             two ? unpack32(w + BB, TYPE) : _mm256_setzero_si256(), 1);
        const __m512i mag = mins ? q : _mm512_abs_epi8(q);
        const __mmask64 neg = _mm512_movepi8_mask(q);
        for (int i = 0; i < MB; i++) {
            const int64_t at = (m0 + i) * QB + b;
            __m512i x = two ? _mm512_loadu_si512(a->q32 + at * 32)
                            : _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(a->q32 + at * 32)));
            if (!mins) x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
            const __m512 dot = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_setzero_si512(), mag, x));
            acc[i] = _mm256_fmadd_ps(_mm512_castps512_ps256(dot), _mm256_set1_ps(d0 * a->d32[at]), acc[i]);
            if (mins) off[i] += m0w * a->d32[at] * (float)a->s32[at];
            if (two) {
                acc[i] = _mm256_fmadd_ps(_mm512_extractf32x8_ps(dot, 1), _mm256_set1_ps(d1 * a->d32[at + 1]), acc[i]);
                if (mins) off[i] += m1w * a->d32[at + 1] * (float)a->s32[at + 1];
            }
        }
    }
    for (int i = 0; i < MB; i++) out[i] = hsum(acc[i]) + off[i];
}

#define ROWS_CASES512(CALL) switch (mb) { \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
    case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break; default: CALL(8); }

// one weight row of a 32-block `type` against rows m0 .. m0 + mb (mb <= PASS_ROWS) of the activations
void dot_rows512(int type, const uint8_t *w, int K, const Acts *a, int64_t m0, int mb, float *out) {
#define C32(T, n) dot32_512(w, K / 32, a, m0, n, T, out)
#define C_Q4_0(n) C32(Q4_0, n)
#define C_Q4_1(n) C32(Q4_1, n)
#define C_Q5_0(n) C32(Q5_0, n)
#define C_Q5_1(n) C32(Q5_1, n)
#define C_Q8_0(n) C32(Q8_0, n)
    switch (type) {
        case Q4_0: ROWS_CASES512(C_Q4_0) break;
        case Q4_1: ROWS_CASES512(C_Q4_1) break;
        case Q5_0: ROWS_CASES512(C_Q5_0) break;
        case Q5_1: ROWS_CASES512(C_Q5_1) break;
        case Q8_0: ROWS_CASES512(C_Q8_0) break;
    }
}

// K-quants packed by 8 rows (blocks.h): each 512-bit vector the 8 rows' 8 bytes against the activation row's 8 bytes
// broadcast, one dpbusd; int32 lane (r, e) holds what blocks.c's packed_dot holds in its lane (r, e) of rows 4h ..
#define PACKED_MB512 4

static inline __m512i dot8_512(__m512i acc, __m512i q, const int8_t *x) {
    int64_t v;
    memcpy(&v, x, 8);
    return _mm512_dpbusd_epi32(acc, q, _mm512_set1_epi64(v));
}

// Q4_K: sub-blocks 2j and 2j + 1's scales as int16 in packs_epi32(D0, D1)'s order, each twice: 128-bit lane k holds
// c[2j][2k], c[2j][2k], c[2j][2k + 1], c[2j][2k + 1], then the same of sub-block 2j + 1 (rows 2k, 2k + 1)
static inline __m512i q4k_pair_scales(const uint8_t *g, int j) {
    const __m512i v = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(g + Q4K_SC + 16 * j)));
    const __m512i at = _mm512_set_epi8(
        -1, 15, -1, 15, -1, 14, -1, 14, -1, 7, -1, 7, -1, 6, -1, 6, -1, 13, -1, 13, -1, 12, -1, 12, -1, 5, -1, 5, -1, 4, -1, 4,
        -1, 11, -1, 11, -1, 10, -1, 10, -1, 3, -1, 3, -1, 2, -1, 2, -1, 9, -1, 9, -1, 8, -1, 8, -1, 1, -1, 1, -1, 0, -1, 0);
    return _mm512_shuffle_epi8(v, at);
}

// Q5_K's sub-blocks 2j, 2j + 1 (e = 0), Q6_K's 8 (j / 2) + 2e + j % 2 and the one 2 on (e = 0, 2): lane 2r the first's
// scale of row r, lane 2r + 1 the second's
static inline __m512i two_scales(const uint8_t *g, int j, int e, const int SIX) {
    if (!SIX) {
        const __m128i v = _mm_loadu_si128((const __m128i *)(g + Q4K_SC + 16 * j));
        return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, _mm_srli_si128(v, 8)));
    }
    const uint8_t *sc = g + Q6K_SC + 16 * (4 * (j / 2) + e);   // sub-block s's scales: bytes 2r + s % 2 of row s / 2
    const int o = j % 2;
    const __m128i first = _mm_setr_epi8(o, -1, 2 + o, -1, 4 + o, -1, 6 + o, -1, 8 + o, -1, 10 + o, -1, 12 + o, -1, 14 + o, -1);
    const __m128i second = _mm_setr_epi8(-1, o, -1, 2 + o, -1, 4 + o, -1, 6 + o, -1, 8 + o, -1, 10 + o, -1, 12 + o, -1, 14 + o);
    const __m128i v = _mm_or_si128(_mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)sc), first),
                                   _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(sc + 16)), second));
    return _mm512_cvtepi8_epi32(v);
}

// group-block b (at g) of 8 rows of Q4_K, Q5_K (FIVE) or Q6_K (SIX) against activation rows m0 .. m0 + MB: acc[i] += its part
static inline __attribute__((always_inline)) void group_block512(const uint8_t *g, int KB, int b, const Acts *a, int64_t m0,
                                                                  const int MB, const int FIVE, const int SIX, __m256 *acc) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const int8_t *x = a->q256 + (m0 * KB + b) * 256;
    __m512i T[PACKED_MB512];
    for (int i = 0; i < MB; i++) T[i] = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {   // as blocks.c's packed_dot
        __m512i D[4][PACKED_MB512];
        for (int i = 0; i < MB; i++) D[0][i] = D[1][i] = D[2][i] = D[3][i] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int u = 0; u < (SIX ? 2 : 4); u++) {
            if (SIX) {
                const int hh = j / 2, t = 2 * (j % 2) + u;
                const uint8_t *q3 = g + Q6K_QS + (4 * hh + t) * 192;
                const __m512i l0 = _mm512_loadu_si512(q3), l1 = _mm512_loadu_si512(q3 + 64), hb = _mm512_loadu_si512(q3 + 128);
                _Pragma("GCC unroll 4") for (int gr = 0; gr < 4; gr++) {
                    const __m512i q = q6_bits512(l0, l1, hb, gr);
                    for (int i = 0; i < MB; i++) D[gr][i] = dot8_512(D[gr][i], q, x + i * KB * 256 + 128 * hh + 32 * gr + 8 * t);
                }
            } else {
                const __m512i v = _mm512_loadu_si512(g + (FIVE ? Q5K_QS : Q4K_QS) + (4 * j + u) * 64);
                __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
                if (FIVE) {
                    const __m512i qh = _mm512_loadu_si512(g + Q5K_QH + 64 * u);
                    lo = _mm512_or_si512(lo, fifth512(qh, 2 * j)), hi = _mm512_or_si512(hi, fifth512(qh, 2 * j + 1));
                }
                for (int i = 0; i < MB; i++) {
                    D[0][i] = dot8_512(D[0][i], lo, x + i * KB * 256 + 64 * j + 8 * u);
                    D[1][i] = dot8_512(D[1][i], hi, x + i * KB * 256 + 64 * j + 32 + 8 * u);
                }
            }
        }
        if (!SIX && !FIVE) {                       // Q4_K: a lane's 16 products of q <= 15 fit int16, so one
            const __m512i c = q4k_pair_scales(g, j);  // madd scales both sub-blocks and adds a row's two lanes
            for (int i = 0; i < MB; i++) T[i] = _mm512_add_epi32(T[i], _mm512_madd_epi16(_mm512_packs_epi32(D[0][i], D[1][i]), c));
            continue;
        }
        _Pragma("GCC unroll 2") for (int e = 0; e < (SIX ? 4 : 2); e += 2) {   // two sub-blocks a product:
            const __m512i c = two_scales(g, j, e, SIX);     // lane 2r their row r's total, 2r + 1 the other's
            for (int i = 0; i < MB; i++) {
                const __m512i a = _mm512_add_epi32(D[e][i], _mm512_shuffle_epi32(D[e][i], _MM_PERM_CDAB));
                const __m512i b = _mm512_add_epi32(D[e + 1][i], _mm512_shuffle_epi32(D[e + 1][i], _MM_PERM_CDAB));
                T[i] = _mm512_add_epi32(T[i], _mm512_mullo_epi32(_mm512_mask_blend_epi32(0xAAAA, a, b), c));
            }
        }
    }
    for (int i = 0; i < MB; i++) {
        const int64_t at = (m0 + i) * KB + b;
        __m256i rows;                              // the 8 rows' totals T
        if (!SIX && !FIVE) {                       // lanes (k, 0..3): rows 2k, 2k + 1 of the even sub-blocks, then of the odd
            const __m512i t = _mm512_add_epi32(T[i], _mm512_shuffle_epi32(T[i], _MM_PERM_BADC));
            rows = _mm512_castsi512_si256(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13), t));
        } else {                                   // lanes (r, e): row r's halves
            rows = _mm512_cvtepi64_epi32(_mm512_add_epi32(T[i], _mm512_shuffle_epi32(T[i], _MM_PERM_CDAB)));
        }
        acc[i] = packed_float(acc[i], rows, g, SIX ? a->b256 + at * 16 : a->s256 + at * 8, a->d256[at], SIX);
    }
}

// A group's 8 rows against activation rows m0 .. m0 + 4 chunks + REST (at most PASS_ROWS): out[i][r]. One pass over the
// weights, each group-block multiplied by every chunk of 4 rows in turn: fetching the next block overlaps the products
// (a pass a chunk would fetch the weights in the first alone).
static inline __attribute__((always_inline)) void packed_dot512(const uint8_t *g, int KB, const Acts *a, int64_t m0,
                                                                int chunks, const int REST, const int FIVE, const int SIX,
                                                                float *out) {
    __m256 acc[PASS_ROWS];
    for (int i = 0; i < PACKED_MB512 * chunks + REST; i++) acc[i] = _mm256_setzero_ps();
    const int size = SIX ? Q6K_PACKED : FIVE ? Q5K_PACKED : Q4K_PACKED;
    for (int b = 0; b < KB; b++, g += size) {
        for (int l = 0; l < size; l += 64) _mm_prefetch((const char *)g + AHEAD * size + l, _MM_HINT_T0);
        for (int c = 0; c < chunks; c++)
            group_block512(g, KB, b, a, m0 + PACKED_MB512 * c, PACKED_MB512, FIVE, SIX, acc + PACKED_MB512 * c);
        if (REST) group_block512(g, KB, b, a, m0 + PACKED_MB512 * chunks, REST, FIVE, SIX, acc + PACKED_MB512 * chunks);
    }
    for (int i = 0; i < PACKED_MB512 * chunks + REST; i++) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// group g0 (its first byte) of `type` against rows m0 .. m0 + mb (mb <= PASS_ROWS): out [mb][8]
void packed_rows512(int type, const uint8_t *g0, int K, const Acts *a, int64_t m0, int mb, float *out) {
#define PACKED_CASE(r) type == Q6_K ? packed_dot512(g0, K / 256, a, m0, mb / PACKED_MB512, r, 0, 1, out)              \
                     : type == Q5_K ? packed_dot512(g0, K / 256, a, m0, mb / PACKED_MB512, r, 1, 0, out)              \
                                    : packed_dot512(g0, K / 256, a, m0, mb / PACKED_MB512, r, 0, 0, out)
    switch (mb % PACKED_MB512) {
        case 0: PACKED_CASE(0); break;
        case 1: PACKED_CASE(1); break;
        case 2: PACKED_CASE(2); break;
        default: PACKED_CASE(3);
    }
}

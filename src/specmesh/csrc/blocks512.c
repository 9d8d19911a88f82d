// gguf_linear's products on AVX-512 with VNNI (csrc/blocks.c calls them where use_vnni is on), the same bits as
// blocks.c's: the packed types 8 weight rows per 512-bit register, where blocks.c holds 4 in each of two 256-bit
// vectors; a row's block sums the same exact integer, and the float part is blocks.h's, instruction for instruction.
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include "blocks.h"
#include "blocks512.h"
#include <stdlib.h>

// K-quants packed by 8 rows (blocks.h): each 512-bit vector the 8 rows' 8 bytes against the activation row's 8 bytes
// broadcast, one dpbusd (Q6_K: a maddubs, as blocks.c does); int32 lane (r, e) holds what blocks.c's packed_dot holds
// in its lane (r, e) of rows 4h ..
#define PACKED_MB512 4

static inline __m512i dot8_512(__m512i acc, __m512i q, const int8_t *x) {
    int64_t v;
    memcpy(&v, x, 8);
    return _mm512_dpbusd_epi32(acc, q, _mm512_set1_epi64(v));
}

// blocks.c's pairs8 on 512 bits: int16 lane (r, p) sums 2 products of q and the activation row's 8 bytes at x
static inline __m512i pairs8_512(__m512i q, const int8_t *x) {
    int64_t v;
    memcpy(&v, x, 8);
    return _mm512_maddubs_epi16(q, _mm512_set1_epi64(v));
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

// Q5_K's sub-blocks 2j, 2j + 1: lane 2r the first's scale of row r, lane 2r + 1 the second's
static inline __m512i two_scales(const uint8_t *g, int j) {
    const __m128i v = _mm_loadu_si128((const __m128i *)(g + Q4K_SC + 16 * j));
    return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(v, _mm_srli_si128(v, 8)));
}

// group-block b (at g) of 8 rows of Q4_K or Q5_K (FIVE) against activation rows m0 .. m0 + MB: acc[i] += its part
static inline __attribute__((always_inline)) void group_block512(const uint8_t *g, int KB, int b, const Acts *a, int64_t m0,
                                                                  const int MB, const int FIVE, __m256 *acc) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    const int8_t *x = a->q256 + (m0 * KB + b) * 256;
    __m512i T[PACKED_MB512];
    for (int i = 0; i < MB; i++) T[i] = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int j = 0; j < 4; j++) {   // as blocks.c's packed_dot
        __m512i D[2][PACKED_MB512];
        for (int i = 0; i < MB; i++) D[0][i] = D[1][i] = _mm512_setzero_si512();
        _Pragma("GCC unroll 4") for (int u = 0; u < 4; u++) {
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
        if (!FIVE) {                               // Q4_K: a lane's 16 products of q <= 15 fit int16, so one
            const __m512i c = q4k_pair_scales(g, j);  // madd scales both sub-blocks and adds a row's two lanes
            for (int i = 0; i < MB; i++) T[i] = _mm512_add_epi32(T[i], _mm512_madd_epi16(_mm512_packs_epi32(D[0][i], D[1][i]), c));
            continue;
        }
        const __m512i c = two_scales(g, j);        // the two sub-blocks a product: lane 2r row r's total of the first,
        for (int i = 0; i < MB; i++) {             // 2r + 1 of the second
            const __m512i lo_sum = _mm512_add_epi32(D[0][i], _mm512_shuffle_epi32(D[0][i], _MM_PERM_CDAB));
            const __m512i hi_sum = _mm512_add_epi32(D[1][i], _mm512_shuffle_epi32(D[1][i], _MM_PERM_CDAB));
            T[i] = _mm512_add_epi32(T[i], _mm512_mullo_epi32(_mm512_mask_blend_epi32(0xAAAA, lo_sum, hi_sum), c));
        }
    }
    for (int i = 0; i < MB; i++) {
        const int64_t at = (m0 + i) * KB + b;
        __m256i rows;                              // the 8 rows' totals T
        if (!FIVE) {                               // lanes (k, 0..3): rows 2k, 2k + 1 of the even sub-blocks, then of the odd
            const __m512i t = _mm512_add_epi32(T[i], _mm512_shuffle_epi32(T[i], _MM_PERM_BADC));
            rows = _mm512_castsi512_si256(_mm512_permutexvar_epi32(_mm512_setr_epi32(0, 1, 4, 5, 8, 9, 12, 13, 0, 1, 4, 5, 8, 9, 12, 13), t));
        } else {                                   // lanes (r, e): row r's halves
            rows = _mm512_cvtepi64_epi32(_mm512_add_epi32(T[i], _mm512_shuffle_epi32(T[i], _MM_PERM_CDAB)));
        }
        acc[i] = packed_float(acc[i], rows, g, a->s256 + at * 8, a->d256[at], 0);
    }
}

// Q6_K's sub-block s scales as int16, row r's in its 4 lanes (r, p)
static inline __m512i q6k_scales512(const uint8_t *g, int s) {
    const __m256i v = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g + Q6K_SC + 16 * (s / 2))));
    const int o = s % 2;
    const __m256i at = _mm256_setr_epi8(o, o, o, o, 2 + o, 2 + o, 2 + o, 2 + o, 4 + o, 4 + o, 4 + o, 4 + o, 6 + o, 6 + o, 6 + o, 6 + o,
                                        8 + o, 8 + o, 8 + o, 8 + o, 10 + o, 10 + o, 10 + o, 10 + o, 12 + o, 12 + o, 12 + o, 12 + o, 14 + o, 14 + o, 14 + o, 14 + o);
    return _mm512_cvtepi8_epi16(_mm256_shuffle_epi8(v, at));
}

// Q6_K's group-block b against activation rows m0 .. m0 + MB: a sub-block of 16 is 2 maddubs (int16 lane (r, p): 2
// products, the two summing within int16: |sum| <= 32004), then one dpwssd by its rows' scales (sc: q6k_scales512 of
// each sub-block, or NULL: made here) into int32 lanes (r, e). Fewer instructions than dpbusd's int32 sums, whose
// scales take a 32-bit multiply.
static inline __attribute__((always_inline)) void group_block512_q6(const uint8_t *g, const __m512i *sc, int KB, int b,
                                                                     const Acts *a, int64_t m0, const int MB, const int SIX,
                                                                     __m256 *acc) {
    const int8_t *x = a->q256 + (m0 * KB + b) * 256;
    __m512i T[PACKED_MB512];
    for (int i = 0; i < MB; i++) T[i] = _mm512_setzero_si512();
    _Pragma("GCC unroll 2") for (int hh = 0; hh < 2; hh++)
        _Pragma("GCC unroll 2") for (int o = 0; o < 2; o++) {      // sub-blocks 8 hh + 2 gr + o: weights 128 hh + 32 gr + 16 o ..
            __m512i S[4][PACKED_MB512];
            _Pragma("GCC unroll 2") for (int u = 0; u < 2; u++) {
                const int t = 2 * o + u;
                const uint8_t *q3 = g + Q6K_QS + (4 * hh + t) * 192, *q2 = g + Q2K_QS + (4 * hh + t) * 64;
                const __m512i hb = _mm512_loadu_si512(SIX >= 2 ? q2 : q3 + 128);   // Q2_K, Q3_K: their 2 bits
                const __m512i l0 = SIX >= 2 ? hb : _mm512_loadu_si512(q3), l1 = SIX >= 2 ? hb : _mm512_loadu_si512(q3 + 64);
                const __m512i hm = SIX == 3 ? _mm512_loadu_si512(g + Q3K_HM + 64 * t) : hb;    // Q3_K's third bits
                _Pragma("GCC unroll 4") for (int gr = 0; gr < 4; gr++) {
                    const __m512i q = SIX == 3 ? _mm512_or_si512(q2_bits512(hb, gr), q3_third512(hm, 4 * hh + gr))
                                    : SIX == 2 ? q2_bits512(hb, gr) : q6_bits512(l0, l1, hb, gr);
                    for (int i = 0; i < MB; i++) {
                        const __m512i p = pairs8_512(q, x + i * KB * 256 + 128 * hh + 32 * gr + 8 * t);
                        S[gr][i] = u ? _mm512_add_epi16(S[gr][i], p) : p;
                    }
                }
            }
            _Pragma("GCC unroll 4") for (int gr = 0; gr < 4; gr++) {
                const __m512i c = sc ? sc[8 * hh + 2 * gr + o] : q6k_scales512(g, 8 * hh + 2 * gr + o);
                for (int i = 0; i < MB; i++) T[i] = _mm512_dpwssd_epi32(T[i], S[gr][i], c);
            }
        }
    for (int i = 0; i < MB; i++) {
        const int64_t at = (m0 + i) * KB + b;
        const __m256i rows = _mm512_cvtepi64_epi32(_mm512_add_epi32(T[i], _mm512_shuffle_epi32(T[i], _MM_PERM_CDAB)));
        acc[i] = packed_float(acc[i], rows, g, a->b256 + at * 16, a->d256[at], SIX);
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
    const int size = k_size(FIVE, SIX);
    for (int b = 0; b < KB; b++, g += size) {
        for (int l = 0; l < size; l += 64) _mm_prefetch((const char *)g + AHEAD * size + l, _MM_HINT_T1);
        if (SIX && !chunks) {                          // the scales made as they are used
            group_block512_q6(g, NULL, KB, b, a, m0, REST, SIX, acc);
            continue;
        }
        if (SIX) {                                     // the scales once for every chunk
            __m512i sc[16];
            for (int s = 0; s < 16; s++) sc[s] = q6k_scales512(g, s);
            for (int c = 0; c < chunks; c++)
                group_block512_q6(g, sc, KB, b, a, m0 + PACKED_MB512 * c, PACKED_MB512, SIX, acc + PACKED_MB512 * c);
            if (REST) group_block512_q6(g, sc, KB, b, a, m0 + PACKED_MB512 * chunks, REST, SIX, acc + PACKED_MB512 * chunks);
            continue;
        }
        for (int c = 0; c < chunks; c++)
            group_block512(g, KB, b, a, m0 + PACKED_MB512 * c, PACKED_MB512, FIVE, acc + PACKED_MB512 * c);
        if (REST) group_block512(g, KB, b, a, m0 + PACKED_MB512 * chunks, REST, FIVE, acc + PACKED_MB512 * chunks);
    }
    for (int i = 0; i < PACKED_MB512 * chunks + REST; i++) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// 32-blocks packed by 8 rows (blocks.h): each 512-bit vector the 8 rows' 8 bytes against the activation row's 8 bytes
// broadcast, one dpbusd (unsigned weights: Q8_0's q + 128, its extra 128 sum(x) taken off after). The float part is
// blocks.h's packed_float32, lane for lane, on two activation rows at once: acc[p] holds rows 2p (low 8 lanes) and
// 2p + 1 (high 8), the weights' scales converted once a block for every pair
static inline __attribute__((always_inline)) void group_block32_512(const uint8_t *g, int QB, int b, const Acts *a,
                                                                     int64_t m0, const int MB, const int TYPE,
                                                                     __m512 *acc) {
    const int8_t *x = a->q32 + (m0 * QB + b) * 32;
    __m512i q[4], T[PACKED_MB512], U[PACKED_MB512];   // U: HALVES_IQ2_IQ1's sums of the weights 16 .., T's of 0 ..
    eights32(g, TYPE, q);
    for (int i = 0; i < MB; i++) T[i] = U[i] = _mm512_setzero_si512();
    _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++)
        for (int i = 0; i < MB; i++) {
            if (halves32(TYPE) && c >= 2) U[i] = dot8_512(U[i], q[c], x + i * QB * 32 + 8 * c);
            else T[i] = dot8_512(T[i], q[c], x + i * QB * 32 + 8 * c);
        }
    if (halves32(TYPE)) {
        __m256 dl, dh;
        halves_scales(g, &dl, &dh);
        for (int i = 0; i < MB; i += 2) {           // rows i and j, as below
            const int j = i + 1 < MB ? i + 1 : i;
            const int64_t ai = (m0 + i) * QB + b, aj = (m0 + j) * QB + b;
            acc[i / 2] = halves16_32_rows(acc[i / 2], _mm512_add_epi32(firsts(T[i], T[j]), lasts(T[i], T[j])),
                                          _mm512_add_epi32(firsts(U[i], U[j]), lasts(U[i], U[j])),
                                          _mm512_broadcast_f32x8(dl), _mm512_broadcast_f32x8(dh), a, ai, aj);
        }
        return;
    }
    const __m512 d = leveled(TYPE) ? _mm512_broadcast_f32x8(_mm256_loadu_ps((const float *)g))
                                   : _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)g)));
    const __m512 m = mins32(TYPE) ? _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(g + 16))))
                                  : _mm512_setzero_ps();
    const int offset = offset512(TYPE);
    for (int i = 0; i < MB; i += 2) {               // rows i and j (an odd last row paired with itself, its copy unused)
        const int j = i + 1 < MB ? i + 1 : i;
        const int64_t ai = (m0 + i) * QB + b, aj = (m0 + j) * QB + b;
        // lanes (r, e) of T: row r's two halves, summed: the 8 rows' totals of row i, then of row j
        __m512i rows = _mm512_add_epi32(firsts(T[i], T[j]), lasts(T[i], T[j]));
        if (offset)
            rows = _mm512_sub_epi32(rows, _mm512_inserti32x8(_mm512_set1_epi32(offset * a->s32[ai]),
                                                             _mm256_set1_epi32(offset * a->s32[aj]), 1));
        const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(a->d32[ai]), _mm256_set1_ps(a->d32[aj]), 1);
        __m512 out = _mm512_fmadd_ps(_mm512_cvtepi32_ps(rows), _mm512_mul_ps(d, dx), acc[i / 2]);
        if (mins32(TYPE))
            out = _mm512_fmadd_ps(m, _mm512_insertf32x8(_mm512_set1_ps(a->ds32[ai]), _mm256_set1_ps(a->ds32[aj]), 1),
                                  out);
        acc[i / 2] = out;
    }
}

// packed_dot512 for the 32-blocks (a loop of its own, as blocks.c's packed_dot32)
static inline __attribute__((always_inline)) void packed_dot32_512(const uint8_t *g, int QB, const Acts *a, int64_t m0,
                                                                   int chunks, const int REST, const int TYPE,
                                                                   float *out) {
    __m512 acc[PASS_ROWS / 2];                     // acc[p]: rows 2p, 2p + 1
    const int rows = PACKED_MB512 * chunks + REST;
    for (int p = 0; p < (rows + 1) / 2; p++) acc[p] = _mm512_setzero_ps();
    const int size = packed_block(TYPE);
    for (int b = 0; b < QB; b++, g += size) {
        for (int l = 0; l < size; l += 64) _mm_prefetch((const char *)g + AHEAD_BYTES + l, _MM_HINT_T1);
        for (int c = 0; c < chunks; c++)
            group_block32_512(g, QB, b, a, m0 + PACKED_MB512 * c, PACKED_MB512, TYPE, acc + PACKED_MB512 / 2 * c);
        if (REST) group_block32_512(g, QB, b, a, m0 + PACKED_MB512 * chunks, REST, TYPE, acc + PACKED_MB512 / 2 * chunks);
    }
    for (int p = 0; p < rows / 2; p++) _mm512_storeu_ps(out + 16 * p, acc[p]);
    if (rows % 2) _mm256_storeu_ps(out + 16 * (rows / 2), _mm512_castps512_ps256(acc[rows / 2]));
}

// group g0 (its first byte) of `type` against rows m0 .. m0 + mb (mb <= PASS_ROWS): out [mb][8]
void packed_rows512(int type, const uint8_t *g0, int K, const Acts *a, int64_t m0, int mb, float *out) {
    const int c = mb / PACKED_MB512;
#define ROWS(R) PACKED_TYPES(packed_dot512, packed_dot32_512, c, R)
    switch (mb % PACKED_MB512) {
        case 0: ROWS(0) break;
        case 1: ROWS(1) break;
        case 2: ROWS(2) break;
        default: ROWS(3)
    }
#undef ROWS
}

// -- Two groups of 32-blocks at once (16 weight rows, blocks512.h's sixteen32: once a block for every activation row):
// a dpbusd takes the activations' 4 bytes broadcast and an int32 lane holds a row's whole block: no halves to add,
// and one float step for the 16 rows. The same integers and the same float part as group_block32_512's: the same bits.

// block b of groups ga, gb against activation rows m0 .. m0 + rows: acc[i] (16 weight rows) += its part; w[h] the 16
// rows' weights 4h .., d and m their scales
static inline __attribute__((always_inline)) void pair_block32(const __m512i *w, __m512 d, __m512 m, int QB, int b,
                                                                const Acts *a, int64_t m0, int rows, const int TYPE,
                                                                __m512 *acc) {
    for (int i = 0; i < rows; i++) {
        const int64_t at = (m0 + i) * QB + b;
        const int8_t *x = a->q32 + at * 32;
        __m512i T = _mm512_setzero_si512(), U = T;  // U: HALVES_IQ2_IQ1's sums of the weights 16 .., T's of 0 ..
        for (int h = 0; h < 8; h++) {
            int32_t v;
            memcpy(&v, x + 4 * h, 4);
            if (halves32(TYPE) && h >= 4) U = _mm512_dpbusd_epi32(U, w[h], _mm512_set1_epi32(v));
            else T = _mm512_dpbusd_epi32(T, w[h], _mm512_set1_epi32(v));
        }
        acc[i] = halves32(TYPE) ? halves16_32(acc[i], T, U, d, m, a, at) : float16_32(acc[i], T, d, m, a, at, TYPE);
    }
}

// groups g0 and g0 + 1 against activation rows m0 .. m0 + rows: out[i][16]
static inline __attribute__((always_inline)) void pair_dot32_512(const uint8_t *ga, int QB, const Acts *a, int64_t m0,
                                                                  int rows, const int TYPE, float *out) {
    __m512 acc[PASS_ROWS];
    for (int i = 0; i < rows; i++) acc[i] = _mm512_setzero_ps();
    const int size = packed_block(TYPE);
    const uint8_t *gb = ga + (int64_t)QB * size;
    for (int b = 0; b < QB; b++, ga += size, gb += size) {
        for (int l = 0; l < size; l += 64) {          // two streams, each fetched twice one stream's distance ahead (the faster)
            _mm_prefetch((const char *)ga + 2 * AHEAD_BYTES + l, _MM_HINT_T1);
            _mm_prefetch((const char *)gb + 2 * AHEAD_BYTES + l, _MM_HINT_T1);
        }
        __m512i w[8];
        __m512 d, m;
        sixteen32(ga, gb, TYPE, w, &d, &m);
        pair_block32(w, d, m, QB, b, a, m0, rows, TYPE, acc);
    }
    for (int i = 0; i < rows; i++) _mm512_storeu_ps(out + 16 * i, acc[i]);
}

#define NO_PAIR(...)        // (the K-quants have no pair kernel)
#define PAIR32(g0, QB, a, m0, C, R, TYPE, out) pair_dot32_512(g0, QB, a, m0, R, TYPE, out)

// groups g0 and the next (g0 its first byte) of a 32-block type against activation rows m0 .. m0 + mb (1 <= mb <=
// PASS_ROWS): out [mb][16], the first group's 8 rows, then the second's
void packed_pair512(int type, const uint8_t *g0, int K, const Acts *a, int64_t m0, int mb, float *out) {
    PACKED_TYPES(NO_PAIR, PAIR32, 0, mb)
}

// gguf_linear's products on AVX-512 with VNNI (csrc/blocks.c calls dot_rows512 where use_vnni is on): up to
// ROWS512 rows of activations per unpacked weight row, a 512-bit register holding two of blocks.c's 256-bit
// vectors. Each int32 lane sums the same products as the AVX2 kernel's lane (the two halves are folded back
// before the float part, which is blocks.c's, instruction for instruction), so a row's result is bit for bit
// the same on either kernel, and the same whatever the batch.
#pragma GCC target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")
#include "blocks.h"
#include "vec.h"
#include <stdlib.h>

#define ROWS512 8

// blocks.c's PAIRS: element 2g of 8 int16 (both 128-bit lanes) in the low 8 words of a lane, 2g + 1 in the high 8
#define W16(e) 2 * (e), 2 * (e) + 1
#define X8(e) W16(e), W16(e), W16(e), W16(e), W16(e), W16(e), W16(e), W16(e)
static const int8_t PAIRS512[4][32] __attribute__((aligned(32))) = {{X8(0), X8(1)}, {X8(2), X8(3)}, {X8(4), X8(5)},
                                                                    {X8(6), X8(7)}};

// the 8 int32 lanes of AVX2's vector: lane u of v's low half plus lane u of its high half
static inline __m256i fold(__m512i v) {
    return _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1));
}

// rows i and i + 1 at once: [fold(a), fold(b)], and a float of each row's in its half
static inline __m512i fold2(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                            _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
}

static inline __m512 halves_ps(float lo, float hi) {
    return _mm512_insertf32x8(_mm512_set1_ps(lo), _mm256_set1_ps(hi), 1);
}

static inline __m512i load2(const void *lo, const void *hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo)), _mm256_loadu_si256(hi), 1);
}

// the sums of rows 0 .. MB into out, from their accumulators: pairs of rows in acc2, an odd last row in acc1
static inline __attribute__((always_inline)) void row_sums(const __m512 *acc2, __m256 acc1, const int MB, float *out) {
    for (int i = 0; i + 1 < MB; i += 2)
        out[i] = hsum(_mm512_castps512_ps256(acc2[i / 2])), out[i + 1] = hsum(_mm512_extractf32x8_ps(acc2[i / 2], 1));
    if (MB % 2) out[MB - 1] = hsum(acc1);
}

// words of one value in the low half and another in the high half (the halves' shifts and scale indices)
static inline __m512i halves16(short lo, short hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_set1_epi16(lo)), _mm256_set1_epi16(hi), 1);
}

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
    __m256 acc[ROWS512];
    float off[ROWS512];
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

// Rows 2p and 2p + 1 of the per-256 activations side by side (Acts.q256p, d256p, b256p): each 32 bytes of the one
// row's x beside the same 32 of the other's, so that a pair's products of one 256-bit weight vector are one
// 512-bit instruction and its int32 lanes are, half for half, the AVX2 kernel's lanes of each row.
void pair_rows512(Acts *a, int M, int K) {
    const int KB = K / 256, P = M / 2;
    a->q256p = lines((int64_t)P * K * 2);
    a->d256p = lines(sizeof(float) * (int64_t)P * KB * 2);
    a->b256p = lines(sizeof(int16_t) * (int64_t)P * KB * 32);
    for (int p = 0; p < P; p++)
        for (int b = 0; b < KB; b++) {
            const int64_t at = (int64_t)p * KB + b;
            for (int e = 0; e < 2; e++) {
                const int64_t row = (int64_t)(2 * p + e) * KB + b;
                for (int c = 0; c < 8; c++)
                    memcpy(a->q256p + (at * 8 + c) * 64 + 32 * e, a->q256 + row * 256 + 32 * c, 32);
                a->d256p[at * 2 + e] = a->d256[row];
                memcpy(a->b256p + at * 32 + 16 * e, a->b256 + row * 16, 32);
            }
        }
}

// a pair's d x dx: lanes 0-7 d dx of row 2p, lanes 8-15 of row 2p + 1 (dx2: the two rows' scales)
static inline __m512 pair_scale(float d, const float *dx2) {
    const __m512i idx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m128 two = _mm_castpd_ps(_mm_load_sd((const double *)dx2));
    return _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(_mm_mul_ps(two, _mm_set1_ps(d))));
}

// Q4_K and Q5_K: a weight row's sub-blocks 2j (low nibbles) and 2j + 1 (high) as blocks.c unpacks them, each in
// both halves of a register for the pairs of rows, and side by side ([2j | 2j + 1], a scale each) for an odd
// last row; maddubs, then dpwssd by the scales (AVX2's madd and add).
static inline __attribute__((always_inline)) void dot_k45_512(const uint8_t *w, int KB, const Acts *a, int64_t m0,
                                                              const int MB, const int FIVE, float *out) {
    const int BB = FIVE ? 176 : 144, P = MB / 2, ODD = MB % 2;
    const int64_t p0 = m0 / 2, last = m0 + MB - 1;
    const __m256i nib = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m512 acc2[ROWS512 / 2];
    __m256 acc1 = _mm256_setzero_ps();
    for (int p = 0; p < P; p++) acc2[p] = _mm512_setzero_ps();
    for (int b = 0; b < KB; b++, w += BB) {
        const float d = fp16(w), dmin = fp16(w + 2);
        uint64_t sc, mn;
        scale_min_bytes(w + 4, &sc, &mn);
        const __m512i scales = _mm512_castsi128_si512(_mm_cvtepu8_epi16(_mm_cvtsi64_si128((int64_t)sc)));
        const __m128i m8 = _mm_cvtsi64_si128((int64_t)mn);
        const __m256i mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(m8, m8));    // mn_0 mn_0 mn_1 mn_1 ...
        const uint8_t *qs = w + 16 + 32 * FIVE;
        const __m256i hb = FIVE ? _mm256_loadu_si256((const __m256i *)(w + 16)) : _mm256_setzero_si256();
        // int32 sums in independent chains (a pair's low and high nibbles; an odd row's j), added at the end: a
        // chain of dependent dpwssd would bound a block by their latency
        __m512i sum2[ROWS512 / 2], high2[ROWS512 / 2], sum1[4];
        for (int p = 0; p < P; p++) sum2[p] = high2[p] = _mm512_setzero_si512();
        for (int j = 0; j < 4; j++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * j));
            __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
            if (FIVE) {
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j), one), 4));
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * j + 1), one), 4));
            }
            if (P) {
                const __m512i lo2 = _mm512_broadcast_i64x4(lo), hi2 = _mm512_broadcast_i64x4(hi);
                const __m512i s0 = _mm512_set1_epi16((short)(sc >> 16 * j & 0xff)), s1 = _mm512_set1_epi16((short)(sc >> (16 * j + 8) & 0xff));
                for (int p = 0; p < P; p++) {
                    const int8_t *x = a->q256p + ((p0 + p) * KB + b) * 512 + 128 * j;
                    sum2[p] = _mm512_dpwssd_epi32(sum2[p], _mm512_maddubs_epi16(lo2, _mm512_loadu_si512(x)), s0);
                    high2[p] = _mm512_dpwssd_epi32(high2[p], _mm512_maddubs_epi16(hi2, _mm512_loadu_si512(x + 64)), s1);
                }
            }
            if (ODD) {
                const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
                const __m512i s = _mm512_permutexvar_epi16(halves16(2 * j, 2 * j + 1), scales);
                const int8_t *x = a->q256 + (last * KB + b) * 256 + 64 * j;
                sum1[j] = _mm512_madd_epi16(_mm512_maddubs_epi16(q, _mm512_loadu_si512(x)), s);
            }
        }
        if (P) {
            const __m512i mins2 = _mm512_broadcast_i64x4(mins);
            for (int p = 0; p < P; p++) {
                const int64_t at = (p0 + p) * KB + b;
                const __m512i low = _mm512_madd_epi16(_mm512_loadu_si512(a->b256p + at * 32), mins2);
                const __m512 sums = _mm512_cvtepi32_ps(_mm512_add_epi32(sum2[p], high2[p]));
                acc2[p] = _mm512_fmadd_ps(sums, pair_scale(d, a->d256p + at * 2), acc2[p]);
                acc2[p] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(low), pair_scale(dmin, a->d256p + at * 2), acc2[p]);
            }
        }
        if (ODD) {
            const int64_t at = last * KB + b;
            const __m256i low = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a->b256 + at * 16)), mins);
            const float dx = a->d256[at];
            const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(sum1[0], sum1[1]), _mm512_add_epi32(sum1[2], sum1[3]));
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(fold(sum)), _mm256_set1_ps(d * dx), acc1);
            acc1 = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(low), _mm256_set1_ps(dmin * dx), acc1);
        }
    }
    row_sums(acc2, acc1, MB, out);
}

// Q6_K: blocks.c's vector of 32 weights for group g of half h (sub-blocks 8h + 2g and + 1 in its 128-bit lanes),
// in both halves for the pairs of rows; for an odd last row its groups 2G and 2G + 1 side by side (one sub-block
// per 128-bit lane: 8h + 4G + lane).
static inline __attribute__((always_inline)) void dot_q6_k_512(const uint8_t *w, int KB, const Acts *a, int64_t m0,
                                                               const int MB, float *out) {
    const int P = MB / 2, ODD = MB % 2;
    const int64_t p0 = m0 / 2, last = m0 + MB - 1;
    const __m256i nib = _mm256_set1_epi8(0x0F), two = _mm256_set1_epi8(3);
    __m512 acc2[ROWS512 / 2];
    __m256 acc1 = _mm256_setzero_ps();
    for (int p = 0; p < P; p++) acc2[p] = _mm512_setzero_ps();
    for (int b = 0; b < KB; b++, w += 210) {
        const int8_t *sc = (const int8_t *)(w + 192);
        const float d = fp16(w + 208);
        const __m256i scales = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc));
        __m512i sum2[ROWS512 / 2][2], sum1[4];             // independent chains, as dot_k45_512's
        for (int p = 0; p < P; p++) sum2[p][0] = sum2[p][1] = _mm512_setzero_si512();
        for (int h = 0; h < 2; h++) {
            const __m256i hb = _mm256_loadu_si256((const __m256i *)(w + 128 + 32 * h));
            const __m256i half = _mm256_broadcastsi128_si256(_mm_cvtepi8_epi16(_mm_loadl_epi64((const __m128i *)(sc + 8 * h))));
            __m256i q[4], s[4];
            for (int g = 0; g < 4; g++) {
                const __m256i l = _mm256_loadu_si256((const __m256i *)(w + 64 * h + 32 * (g % 2)));
                const __m256i low = _mm256_and_si256(g < 2 ? l : _mm256_srli_epi16(l, 4), nib);
                q[g] = _mm256_or_si256(low, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2 * g), two), 4));
                s[g] = _mm256_shuffle_epi8(half, _mm256_load_si256((const __m256i *)PAIRS512[g]));
                for (int p = 0; p < P; p++) {
                    const int8_t *x = a->q256p + ((p0 + p) * KB + b) * 512 + 64 * (4 * h + g);
                    sum2[p][g % 2] = _mm512_dpwssd_epi32(sum2[p][g % 2], _mm512_maddubs_epi16(
                        _mm512_broadcast_i64x4(q[g]), _mm512_loadu_si512(x)), _mm512_broadcast_i64x4(s[g]));
                }
            }
            if (ODD)
                for (int G = 0; G < 2; G++) {
                    const __m512i q2 = _mm512_inserti64x4(_mm512_castsi256_si512(q[2 * G]), q[2 * G + 1], 1);
                    const __m512i s2 = _mm512_inserti64x4(_mm512_castsi256_si512(s[2 * G]), s[2 * G + 1], 1);
                    const int8_t *x = a->q256 + (last * KB + b) * 256 + 128 * h + 64 * G;
                    sum1[2 * h + G] = _mm512_madd_epi16(_mm512_maddubs_epi16(q2, _mm512_loadu_si512(x)), s2);
                }
        }
        if (P) {                                       // - 32 sum_s sc_s sum(x over s)
            const __m512i scales2 = _mm512_broadcast_i64x4(scales);
            for (int p = 0; p < P; p++) {
                const int64_t at = (p0 + p) * KB + b;
                const __m512i low = _mm512_madd_epi16(_mm512_loadu_si512(a->b256p + at * 32), scales2);
                const __m512i total = _mm512_sub_epi32(_mm512_add_epi32(sum2[p][0], sum2[p][1]), _mm512_slli_epi32(low, 5));
                acc2[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), pair_scale(d, a->d256p + at * 2), acc2[p]);
            }
        }
        if (ODD) {
            const int64_t at = last * KB + b;
            const __m256i low = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)(a->b256 + at * 16)), scales);
            const __m512i sum = _mm512_add_epi32(_mm512_add_epi32(sum1[0], sum1[1]), _mm512_add_epi32(sum1[2], sum1[3]));
            const __m256i total = _mm256_sub_epi32(fold(sum), _mm256_slli_epi32(low, 5));
            acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(d * a->d256[at]), acc1);
        }
    }
    row_sums(acc2, acc1, MB, out);
}

#define ROWS512_CASES(CALL) switch (mb) { \
    case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; case 4: CALL(4); break; \
    case 5: CALL(5); break; case 6: CALL(6); break; case 7: CALL(7); break; default: CALL(8); }

// one weight row of `type` against rows m0 .. m0 + mb (mb <= ROWS512) of the activations
void dot_rows512(int type, const uint8_t *w, int K, const Acts *a, int64_t m0, int mb, float *out) {
#define C32(T, n) dot32_512(w, K / 32, a, m0, n, T, out)
#define C_Q4_0(n) C32(Q4_0, n)
#define C_Q4_1(n) C32(Q4_1, n)
#define C_Q5_0(n) C32(Q5_0, n)
#define C_Q5_1(n) C32(Q5_1, n)
#define C_Q8_0(n) C32(Q8_0, n)
#define C_Q4_K(n) dot_k45_512(w, K / 256, a, m0, n, 0, out)
#define C_Q5_K(n) dot_k45_512(w, K / 256, a, m0, n, 1, out)
#define C_Q6_K(n) dot_q6_k_512(w, K / 256, a, m0, n, out)
    switch (type) {
        case Q4_0: ROWS512_CASES(C_Q4_0) break;
        case Q4_1: ROWS512_CASES(C_Q4_1) break;
        case Q5_0: ROWS512_CASES(C_Q5_0) break;
        case Q5_1: ROWS512_CASES(C_Q5_1) break;
        case Q8_0: ROWS512_CASES(C_Q8_0) break;
        case Q4_K: ROWS512_CASES(C_Q4_K) break;
        case Q5_K: ROWS512_CASES(C_Q5_K) break;
        case Q6_K: ROWS512_CASES(C_Q6_K) break;
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

static inline __m512i q6_bits512(__m512i ql0, __m512i ql1, __m512i qh, int gr) {      // blocks.c's q6_bits
    const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const __m512i l = gr % 2 ? ql1 : ql0;
    const __m512i low = _mm512_and_si512(gr < 2 ? l : _mm512_srli_epi16(l, 4), nib);
    const __m512i high = gr == 0 ? _mm512_slli_epi16(qh, 4) : gr == 1 ? _mm512_slli_epi16(qh, 2)
                       : gr == 2 ? qh : _mm512_srli_epi16(qh, 2);
    return _mm512_or_si512(low, _mm512_and_si512(high, top));
}

// Q5_K: sub-block s's fifth bits (bit s of each byte of qh) at bit 4, the rest of the byte zero
static inline __m512i fifth512(__m512i qh, int s) {
    const __m512i at4 = s < 4 ? _mm512_slli_epi16(qh, 4 - s) : s == 4 ? qh : _mm512_srli_epi16(qh, s - 4);
    return _mm512_and_si512(at4, _mm512_set1_epi8(0x10));
}

static inline __attribute__((always_inline)) void packed_dot512(const uint8_t *g, int KB, const Acts *a, int64_t m0,
                                                                const int MB, const int FIVE, const int SIX, float *out) {
    const __m512i nib = _mm512_set1_epi8(0x0F);
    __m256 acc[PACKED_MB512];
    for (int i = 0; i < MB; i++) acc[i] = _mm256_setzero_ps();
    for (int b = 0; b < KB; b++, g += SIX ? Q6K_PACKED : FIVE ? Q5K_PACKED : Q4K_PACKED) {
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
            _Pragma("GCC unroll 4") for (int e = 0; e < (SIX ? 4 : 2); e++) {
                const __m512i c = SIX ? _mm512_cvtepi8_epi32(q6k_scales(g, 8 * (j / 2) + 2 * e + j % 2))
                                      : _mm512_cvtepu8_epi32(q4k_scales(g, 2 * j + e));
                for (int i = 0; i < MB; i++) T[i] = _mm512_add_epi32(T[i], _mm512_mullo_epi32(D[e][i], c));
            }
        }
        for (int i = 0; i < MB; i++) {
            const int64_t at = (m0 + i) * KB + b;
            const __m512i pairs = _mm512_add_epi32(T[i], _mm512_shuffle_epi32(T[i], _MM_PERM_CDAB));
            acc[i] = packed_float(acc[i], _mm512_cvtepi64_epi32(pairs), g, SIX ? a->b256 + at * 16 : a->s256 + at * 8,
                                  a->d256[at], SIX);
        }
    }
    for (int i = 0; i < MB; i++) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

void packed_rows512(int type, const uint8_t *g0, int K, const Acts *a, int64_t m0, int mb, float *out) {
#define PACKED_CASE(n) type == Q6_K ? packed_dot512(g0, K / 256, a, m0 + i, n, 0, 1, o)                              \
                     : type == Q5_K ? packed_dot512(g0, K / 256, a, m0 + i, n, 1, 0, o) : packed_dot512(g0, K / 256, a, m0 + i, n, 0, 0, o)
    for (int i = 0; i < mb; i += PACKED_MB512) {
        float *o = out + 8 * i;
        switch (mb - i) {
            case 1: PACKED_CASE(1); break;
            case 2: PACKED_CASE(2); break;
            case 3: PACKED_CASE(3); break;
            default: PACKED_CASE(4);
        }
    }
}

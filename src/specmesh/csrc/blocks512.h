// What csrc/blocks512.c and csrc/blocks_amx.c share: the packed K-quants' weights unpacked 512 bits at a time.
// Included after a file's AVX-512 target pragma.
#pragma once
#include "blocks.h"

static inline __m512i q6_bits512(__m512i ql0, __m512i ql1, __m512i qh, int gr) {      // blocks.c's q6_bits, 8 rows
    const __m512i nib = _mm512_set1_epi8(0x0F), top = _mm512_set1_epi8(0x30);
    const __m512i l = gr % 2 ? ql1 : ql0;
    const __m512i low = _mm512_and_si512(gr < 2 ? l : _mm512_srli_epi16(l, 4), nib);
    const __m512i high = gr == 0 ? _mm512_slli_epi16(qh, 4) : gr == 1 ? _mm512_slli_epi16(qh, 2)
                       : gr == 2 ? qh : _mm512_srli_epi16(qh, 2);
    return _mm512_or_si512(low, _mm512_and_si512(high, top));
}

// Q2_K's q (0..3) of group gr of the weights 128 h + 32 gr + 8 t ..: bits 2 gr of its qs (blocks.c's q2_bits)
static inline __m512i q2_bits512(__m512i qs, int gr) {
    return _mm512_and_si512(gr ? _mm512_srli_epi16(qs, 2 * gr) : qs, _mm512_set1_epi8(3));
}

// Q3_K's third bit, worth 4: bit `bit` of its hmask bytes at bit 2 (blocks.c's q3_third)
static inline __m512i q3_third512(__m512i hm, int bit) {
    const __m512i at2 = bit > 2 ? _mm512_srli_epi16(hm, bit - 2) : bit < 2 ? _mm512_slli_epi16(hm, 2 - bit) : hm;
    return _mm512_and_si512(at2, _mm512_set1_epi8(4));
}

// Q5_K: sub-block s's fifth bits (bit s of each byte of qh) at bit 4, the rest of the byte zero
static inline __m512i fifth512(__m512i qh, int s) {
    const __m512i at4 = s < 4 ? _mm512_slli_epi16(qh, 4 - s) : s == 4 ? qh : _mm512_srli_epi16(qh, s - 4);
    return _mm512_and_si512(at4, _mm512_set1_epi8(0x10));
}

// 8 rows' fp16 of each of two groups: lanes 0..7 group a's, 8..15 group b's
static inline __m512 halves(const uint8_t *a, const uint8_t *b) {
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)b), 1));
}

// two groups' vectors of 8 rows x 8 bytes (a: rows 0..7, b: rows 8..15) as 16 rows x 4 bytes: firsts, each row's first
// 4 bytes; lasts, its last 4 (the VNNI order of the tiles' B, and of a dpbusd with the activations' 4 bytes broadcast)
static inline __m512i firsts(__m512i a, __m512i b) {
    return _mm512_permutex2var_epi32(a, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), b);
}

static inline __m512i lasts(__m512i a, __m512i b) {
    return _mm512_permutex2var_epi32(a, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), b);
}

static inline void sixteen_rows(__m512i a, __m512i b, int8_t *out) {       // both, stored: out, out + 64
    _mm512_store_si512(out, firsts(a, b));
    _mm512_store_si512(out + 64, lasts(a, b));
}

// the offset of eights32's unsigned q: Q8_0's and IQ4's signed bytes + 128, the others' own (q32_offset)
static inline int offset512(int type) { return type == Q8_0 || type == IQ4_NL ? 128 : q32_offset(type); }

// weights 8c .. 8c + 7 of a group-block's 8 rows in v[c] (lanes (r, k)), unsigned: q + offset512
static inline __attribute__((always_inline)) void eights32(const uint8_t *g, const int TYPE, __m512i v[4]) {
    const __m512i nib = _mm512_set1_epi8(0x0F), fifth = _mm512_set1_epi8(0x10);
    if (TYPE == Q8_0) {
        for (int c = 0; c < 4; c++) v[c] = _mm512_xor_si512(_mm512_loadu_si512(g + qs32(TYPE) + 64 * c), _mm512_set1_epi8(-128));
        return;
    }
    for (int t = 0; t < 2; t++) {                  // low nibbles: the weights 8 t .., high: 16 + 8 t ..
        const __m512i q = _mm512_loadu_si512(g + qs32(TYPE) + 64 * t);
        __m512i lo = _mm512_and_si512(q, nib), hi = _mm512_and_si512(_mm512_srli_epi16(q, 4), nib);
        if (leveled(TYPE)) {
            const __m512i levels = _mm512_add_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)levels_of(TYPE))),
                                                   _mm512_set1_epi8((char)offset512(TYPE)));
            lo = _mm512_shuffle_epi8(levels, lo), hi = _mm512_shuffle_epi8(levels, hi);
        }
        if (five32(TYPE)) {
            uint64_t l, u;
            memcpy(&l, g + qh32(TYPE) + 8 * t, 8), memcpy(&u, g + qh32(TYPE) + 8 * (2 + t), 8);
            lo = _mm512_or_si512(lo, _mm512_maskz_mov_epi8(l, fifth));
            hi = _mm512_or_si512(hi, _mm512_maskz_mov_epi8(u, fifth));
        }
        v[t] = lo, v[2 + t] = hi;
    }
}

// two groups' 32-blocks (a: rows 0..7, b: rows 8..15) as 16 rows: w[h] their weights 4h .. 4h + 3 in VNNI order
// (unsigned, as eights32 gives them), d and m their scales (m: the mins, or zero; HALVES_IQ2_IQ1: d and m the scales
// of the weights 0 .. 15 and 16 .., halves_scales')
static inline __attribute__((always_inline)) void sixteen32(const uint8_t *ga, const uint8_t *gb, const int TYPE,
                                                             __m512i w[8], __m512 *d, __m512 *m) {
    __m512i va[4], vb[4];
    eights32(ga, TYPE, va), eights32(gb, TYPE, vb);
    for (int c = 0; c < 4; c++) w[2 * c] = firsts(va[c], vb[c]), w[2 * c + 1] = lasts(va[c], vb[c]);
    if (halves32(TYPE)) {
        __m256 la, ha, lb, hb;
        halves_scales(ga, &la, &ha), halves_scales(gb, &lb, &hb);
        *d = _mm512_insertf32x8(_mm512_castps256_ps512(la), lb, 1), *m = _mm512_insertf32x8(_mm512_castps256_ps512(ha), hb, 1);
        return;
    }
    *d = leveled(TYPE) ? _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps((const float *)ga)),
                                            _mm256_loadu_ps((const float *)gb), 1)
                       : halves(ga, gb);
    *m = mins32(TYPE) ? halves(ga + 16, gb + 16) : _mm512_setzero_ps();
}

// blocks.h's halves_float32, lane for lane: Tl, Th the sums over the weights 0 .. 15, 16 .. 31, dl, dh their
// scales, dx, h and s the lane's activation row's scale and sums (of the block's first 16 bytes, of its 32)
static inline __m512 halves512(__m512 acc, __m512i Tl, __m512i Th, __m512 dl, __m512 dh, __m512 dx, __m512i h,
                               __m512i s) {
    const __m512i offset = _mm512_set1_epi32(q32_offset(HALVES_IQ2_IQ1));
    Tl = _mm512_sub_epi32(Tl, _mm512_mullo_epi32(offset, h));
    Th = _mm512_sub_epi32(Th, _mm512_mullo_epi32(offset, _mm512_sub_epi32(s, h)));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(Tl), _mm512_mul_ps(dl, dx), acc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(Th), _mm512_mul_ps(dh, dx), acc);
}

// halves512 for 16 weight rows against activation row-block `at`
static inline __m512 halves16_32(__m512 acc, __m512i Tl, __m512i Th, __m512 dl, __m512 dh, const Acts *a, int64_t at) {
    return halves512(acc, Tl, Th, dl, dh, _mm512_set1_ps(a->d32[at]), _mm512_set1_epi32(a->h32[at]),
                     _mm512_set1_epi32(a->s32[at]));
}

// halves512 for 8 weight rows against activation row-blocks ai (lanes 0 .. 7) and aj (8 .. 15)
static inline __m512 halves16_32_rows(__m512 acc, __m512i Tl, __m512i Th, __m512 dl, __m512 dh, const Acts *a,
                                      int64_t ai, int64_t aj) {
    const __m512 dx = _mm512_insertf32x8(_mm512_set1_ps(a->d32[ai]), _mm256_set1_ps(a->d32[aj]), 1);
    const __m512i h = _mm512_inserti32x8(_mm512_set1_epi32(a->h32[ai]), _mm256_set1_epi32(a->h32[aj]), 1);
    const __m512i s = _mm512_inserti32x8(_mm512_set1_epi32(a->s32[ai]), _mm256_set1_epi32(a->s32[aj]), 1);
    return halves512(acc, Tl, Th, dl, dh, dx, h, s);
}

// acc += (T - offset s) (d dx) (+ m ds) for 16 weight rows against activation row-block `at`: blocks.h's
// packed_float32, lane for lane, on T = sum(q x) of eights32's unsigned q (Q8_0's, IQ4's levels: q + 128)
static inline __m512 float16_32(__m512 acc, __m512i T, __m512 d, __m512 m, const Acts *a, int64_t at, const int TYPE) {
    const int offset = offset512(TYPE);
    if (offset) T = _mm512_sub_epi32(T, _mm512_set1_epi32(offset * a->s32[at]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(T), _mm512_mul_ps(d, _mm512_set1_ps(a->d32[at])), acc);
    return mins32(TYPE) ? _mm512_fmadd_ps(m, _mm512_set1_ps(a->ds32[at]), acc) : acc;
}

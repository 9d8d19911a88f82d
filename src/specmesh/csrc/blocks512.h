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

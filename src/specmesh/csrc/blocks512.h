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

// A GGUF file's quantized matrices as they are, read from the file's own pages (kernels.GGUFLinear):
// gguf_dequantize: blocks -> float32 with the `gguf` package's arithmetic, bit for bit;
// gguf_linear: y[M, N] = x[M, K] . w[N, K]^T (+ bias) over the blocks, for Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL
//   (blocks of 32 weights; IQ4_XS as IQ4_NL's, IQ3_S, IQ3_XXS, IQ2_XXS and IQ1_S as it with levels of their own:
//   csrc/grids.c) and Q2_K ... Q6_K (blocks of 256; Q2_K and Q3_K laid out as Q6_K, their q where Q6_K has its high
//   bits).
//   The activations are quantized to 8 bits per block as llama.cpp
//   does for each kind: per 32 with one scale and their sum for the 32-blocks, per 256 with one scale and sums of
//   each 16 (and of each 32, its Q8_K) for the K-quants. Every type multiplies packed (gguf_pack: 8 rows
//   interleaved, blocks.h), 8 weight rows a vector. A block's products sum exactly in int32, blocks add in float32
//   in order, the same instructions for every row whatever M, so a row's result does not depend on the others.
// A matrix is up to three parts of rows (a fused projection: q, k, v of their own types), each row read at a
// stride from the file, through a map of rows where the model's order differs from the file's (rope's q and k).
#include "api.h"
#include "blocks.h"
#include "pool.h"
#include <stdlib.h>

// -- dequantization (gguf.quants' numpy arithmetic: products and differences rounded one by one: EXACT) ---------

static inline void scale_min(const uint8_t *s, uint8_t *sc, uint8_t *mn) {
    uint64_t a, b;
    scale_min_bytes(s, &a, &b);
    memcpy(sc, &a, 8), memcpy(mn, &b, 8);
}

// Q3_K's 16 6-bit scales (12 bytes at sc) less 32, as Q6_K keeps its int8 scales
static void q3k_scales(const uint8_t *sc, int8_t *out) {
    for (int s = 0; s < 16; s++) {
        const int low = s < 8 ? sc[s] & 0x0F : sc[s - 8] >> 4, high = (sc[8 + s % 4] >> (2 * (s / 4))) & 3;
        out[s] = (int8_t)((low | high << 4) - 32);
    }
}

// 32 weights d IQ4_LEVELS[q] of 16 bytes of 4-bit q: the low nibbles, then the high ones
static EXACT void iq4_levels(float d, const uint8_t *qs, float *y) {
    for (int l = 0; l < 16; l++) y[l] = d * (float)IQ4_LEVELS[qs[l] & 0x0F], y[l + 16] = d * (float)IQ4_LEVELS[qs[l] >> 4];
}

// 32 weights s of an IQ4_NL or IQ4_XS block w as out (grid_levels' layout): the float32 scale (IQ4_XS: d (s's 6-bit
// scale - 32), as gguf.quants computes it: exact), then the 16 bytes of 4-bit level indices
static void iq4_block(int type, const uint8_t *w, int s, uint8_t *out) {
    float d = fp16(w);
    if (type == IQ4_XS) {
        const int high = (w[2] | w[3] << 8) >> (2 * s) & 3, scale = ((w[4 + s / 2] >> (4 * (s % 2))) & 0x0F) | high << 4;
        d *= (float)(scale - 32);
    }
    memcpy(out, &d, 4);
    memcpy(out + 4, type == IQ4_XS ? w + 8 + 16 * s : w + 2, 16);
}

// one block of `type` -> its weights y
static EXACT void dequantize_block(int type, const uint8_t *b, float *y) {
    switch (type) {
        case F32: memcpy(y, b, 4); return;
        case F16: y[0] = fp16(b); return;
        case IQ4_NL: case IQ4_XS:
            for (int s = 0; s < block_size(type) / 32; s++) {
                uint8_t u[LEVELED_BYTES];
                float d;
                iq4_block(type, b, s, u), memcpy(&d, u, 4);
                iq4_levels(d, u + 4, y + 32 * s);
            }
            return;
        case Q8_0: {
            const float d = fp16(b);
            for (int l = 0; l < 32; l++) y[l] = (float)(int8_t)b[2 + l] * d;
            return;
        }
        case Q4_0: case Q4_1: case Q5_0: case Q5_1: {
            const int mins = type == Q4_1 || type == Q5_1, five = type == Q5_0 || type == Q5_1;
            const float d = fp16(b), m = mins ? fp16(b + 2) : 0;
            uint32_t qh = 0;
            if (five) memcpy(&qh, b + 2 + 2 * mins, 4);
            const uint8_t *qs = b + 2 + 2 * mins + 4 * five;
            const int offset = mins ? 0 : five ? 16 : 8;
            for (int l = 0; l < 32; l++) {
                int q = (l < 16 ? qs[l] & 0x0F : qs[l - 16] >> 4) | (five ? ((qh >> l) & 1) << 4 : 0);
                y[l] = mins ? d * (float)q + m : d * (float)(q - offset);
            }
            return;
        }
        case Q2_K: {                                   // weight 128 h + 32 g + l: (d sc_s) q - (dmin mn_s), s its 16th
            const float d = fp16(b + 80), dmin = fp16(b + 82);
            for (int e = 0; e < 256; e++) {
                const int s = e / 16, q = (b[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32))) & 3;
                y[e] = d * (float)(b[s] & 0x0F) * (float)q - dmin * (float)(b[s] >> 4);
            }
            return;
        }
        case Q4_K: case Q5_K: {
            const float d = fp16(b), dmin = fp16(b + 2);
            uint8_t sc[8], mn[8];
            scale_min(b + 4, sc, mn);
            const uint8_t *qh = b + 16, *qs = b + 16 + (type == Q5_K ? 32 : 0);
            for (int s = 0; s < 8; s++) {              // sub-block s: nibble s % 2 of bytes 32 (s / 2) ..
                const float ds = d * (float)sc[s], ms = dmin * (float)mn[s];
                for (int l = 0; l < 32; l++) {
                    int q = (qs[32 * (s / 2) + l] >> (4 * (s % 2))) & 0x0F;
                    if (type == Q5_K) q |= ((qh[l] >> s) & 1) << 4;
                    y[32 * s + l] = ds * (float)q - ms;
                }
            }
            return;
        }
        case Q3_K: {                                   // q: 2 bits of qs, less 4 where its hmask bit is clear
            const float d = fp16(b + 108);
            int8_t sc[16];
            q3k_scales(b + 96, sc);
            for (int e = 0; e < 256; e++) {            // half h, group g of 32, lane l (as Q6_K's)
                const int h = e / 128, g = (e / 32) % 4, l = e % 32;
                const int q = ((b[32 + 32 * h + l] >> (2 * g)) & 3) - ((b[l] >> (4 * h + g)) & 1 ? 0 : 4);
                y[e] = (d * (float)sc[e / 16]) * (float)q;
            }
            return;
        }
        case Q6_K: {
            const uint8_t *ql = b, *qh = b + 128;
            const int8_t *sc = (const int8_t *)(b + 192);
            const float d = fp16(b + 208);
            for (int e = 0; e < 256; e++) {            // half h, group g of 32, lane l
                const int h = e / 128, g = (e / 32) % 4, l = e % 32;
                const int low = (ql[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 0x0F;
                const int q = (low | ((qh[32 * h + l] >> (2 * g)) & 3) << 4) - 32;
                y[e] = (d * (float)sc[e / 16]) * (float)q;
            }
            return;
        }
        default: grid_block(type, b, y);             // the grid kinds (gguf_dequantize checks grid_ready)
    }
}

// n weights of `type` from src (whole blocks) -> out; returns 0, or -1 for a type this file does not know
int gguf_dequantize(int type, const uint8_t *src, int64_t n, float *out) {
    const int bs = block_size(type), bb = block_bytes(type);
    if (!bb || (grid_kind(type) && !grid_ready(type))) return -1;
    for (int64_t b = 0; b < n / bs; b++) dequantize_block(type, src + b * bb, out + b * bs);
    return 0;
}

// rows ids[0..n) of a one-part matrix of K columns -> out [n, K] (an embedding's lookup)
void gguf_rows(const Matrix *w, int K, const int64_t *ids, int n, float *out) {
    const Part *p = &w->part[0];
    for (int i = 0; i < n; i++) {
        const int64_t r = p->map ? p->map[ids[i]] : ids[i];
        gguf_dequantize(p->type, p->data + r * p->stride, K, out + (int64_t)i * K);
    }
}

// -- activations ----------------------------------------------------------------------------------------------
void q8_quantize_rows(const float *x, int M, int K, int QB, int8_t *xq, float *xd, int32_t *xsum);   // csrc/avx2.c

static inline float amax8(__m256 a) {
    __m128 r = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    r = _mm_max_ps(r, _mm_movehl_ps(r, r));
    return _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
}

// x [M, K] (K a multiple of 256) -> per block of 256: d = max |x| / 127, q = x / d to nearest (even), sums of 16
// and of 32
static void quantize_256(const float *x, int M, int K, int8_t *xq, float *xd, int16_t *xb, int16_t *xs) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const int KB = K / 256;
    for (int m = 0; m < M; m++)
        for (int b = 0; b < KB; b++) {
            const float *v = x + (int64_t)m * K + 256 * b;
            __m256 a = _mm256_setzero_ps();
            for (int k = 0; k < 256; k += 8) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + k)));
            const float amax = amax8(a);
            const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
            int8_t *q = xq + (int64_t)m * K + 256 * b;
            for (int k = 0; k < 256; k += 32) {
                __m256i i[4];
                for (int h = 0; h < 4; h++)
                    i[h] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + k + 8 * h), inv));
                __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
                bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256((__m256i *)(q + k), bytes);
            }
            int16_t *s = xb + ((int64_t)m * KB + b) * 16;
            for (int g = 0; g < 16; g++) {
                int sum = 0;
                for (int l = 0; l < 16; l++) sum += q[16 * g + l];
                s[g] = (int16_t)sum;
            }
            for (int g = 0; g < 8; g++) xs[((int64_t)m * KB + b) * 8 + g] = (int16_t)(s[2 * g] + s[2 * g + 1]);
            xd[(int64_t)m * KB + b] = amax / 127.0f;
        }
}

// csrc/blocks512.c, where it builds; used where use_vnni is on (csrc/avx2.c), with the same results
void packed_rows512(int type, const uint8_t *g, int K, const Acts *a, int64_t m0, int mb, float *out) __attribute__((weak));
extern int vnni;

static int wide(void) { return vnni && packed_rows512; }
void packed_pair512(int type, const uint8_t *g, int K, const Acts *a, int64_t m0, int mb, float *out) __attribute__((weak));

// csrc/blocks_amx.c, where it builds; used where use_tiles is on for products of least_tile_rows(type) rows or more of
// activations (the same bits): below, the tiles' per-sub-block sums cost more than the vector kernels (the results log)
void packed_tiles(int type, const uint8_t *g, int rows, int K, const Acts *a, int M, const float *bias, float *y, int N,
                  int n) __attribute__((weak));
static int tiles = 0;
void use_tiles(int on) { tiles = on && packed_tiles; }
static int packed_size(int type) { return block_size(runs_as(type)); }     // the weights of a packed block
// the 32-blocks' tiles pay at a prefill's widths only: the vector pair kernel is the faster for verification's
static int least_tile_rows(int type) { return packed_size(type) == 32 ? 40 : six_of(type) >= 2 ? 12 : 9; }

static int least_matrix_tile_rows(const Matrix *w) {            // of any of its parts
    int least = INT32_MAX;
    for (int i = 0; i < w->n; i++) {
        const int rows = least_tile_rows(w->part[i].type);
        if (rows < least) least = rows;
    }
    return least;
}

static void quantize_acts(const Matrix *w, const float *x, int M, int K, Acts *a) {
    int k256 = 0, k32 = 0, k16 = 0;
    for (int i = 0; i < w->n; i++) {
        if (packed_size(w->part[i].type) == 256) k256 = 1;
        else k32 = 1;
        k16 |= halves32(runs_as(w->part[i].type));
    }
    memset(a, 0, sizeof *a);
    if (k32) {
        const int QB = K / 32;
        a->q32 = lines((int64_t)M * QB * 32);
        a->d32 = lines(sizeof(float) * (int64_t)M * QB);
        a->s32 = lines(sizeof(int32_t) * (int64_t)M * QB);
        a->ds32 = lines(sizeof(float) * (int64_t)M * QB);
        q8_quantize_rows(x, M, K, QB, a->q32, a->d32, a->s32);
        for (int64_t i = 0; i < (int64_t)M * QB; i++) a->ds32[i] = a->d32[i] * (float)a->s32[i];
    }
    if (k16) {
        a->h32 = lines(sizeof(int32_t) * (int64_t)M * (K / 32));
        for (int64_t i = 0; i < (int64_t)M * (K / 32); i++) {
            int32_t h = 0;
            for (int l = 0; l < 16; l++) h += a->q32[32 * i + l];
            a->h32[i] = h;
        }
    }
    if (k256) {
        a->q256 = lines((int64_t)M * K);
        a->d256 = lines(sizeof(float) * (int64_t)M * (K / 256));
        a->b256 = lines(sizeof(int16_t) * (int64_t)M * (K / 16));
        a->s256 = lines(sizeof(int16_t) * (int64_t)M * (K / 32));
        quantize_256(x, M, K, a->q256, a->d256, a->b256, a->s256);
    }
}

static void free_acts(Acts *a) {
    free(a->q32); free(a->d32); free(a->s32); free(a->ds32); free(a->h32); free(a->q256); free(a->d256); free(a->b256); free(a->s256);
}

// -- K-quants packed by 8 rows (blocks.h) ----------------------------------------------------------------------
#define PACKED_MB 2

// Each 256-bit vector is 4 rows' 8 bytes (h: rows 4h .. 4h + 3) against the activation row's 8 bytes broadcast:
// int16 lane (r, p) sums 2 products (maddubs; q <= 63 and |x| <= 127, so none saturates). A sub-block's int16 sums
// add in int16 (at most 4 of Q4_K, Q5_K or 2 of Q6_K: |sum| <= 32004), then one madd by the rows' scales gives int32
// lanes (r, e), a row's two lanes added at the block's end.
static inline __m256i pairs8(__m256i q, const int8_t *x) {
    int64_t v;
    memcpy(&v, x, 8);
    return _mm256_maddubs_epi16(q, _mm256_set1_epi64x(v));
}

// rows 4h .. 4h + 3 of a sub-block's scales (q4k_scales, q6k_scales: bytes (r, r)) as int16, each in its row's 4 lanes
static inline __m256i half_scales(__m128i s, int h, const int SIGNED) {
    const __m128i v = _mm_shuffle_epi8(s, _mm_add_epi8(_mm_set1_epi8(8 * h), _mm_setr_epi8(0, 0, 0, 0, 2, 2, 2, 2,
                                                                                             4, 4, 4, 4, 6, 6, 6, 6)));
    return SIGNED ? _mm256_cvtepi8_epi16(v) : _mm256_cvtepu8_epi16(v);
}

// sub-block s's scales of rows 4h .. 4h + 3 (half_scales), Q6_K's (and Q2_K's, Q3_K's) signed
static inline __m256i sub_scales(const uint8_t *g, int s, int h, const int SIX) {
    return SIX ? half_scales(q6k_scales(g, s), h, 1) : half_scales(q4k_scales(g, s), h, 0);
}

// the 8 rows' int32 sums from the halves' lanes (r, e)
static inline __m256i row_totals(__m256i t0, __m256i t1) {
    return _mm256_permutevar8x32_epi32(_mm256_hadd_epi32(t0, t1), _mm256_setr_epi32(0, 1, 4, 5, 2, 3, 6, 7));
}

// Q6_K's q (0..63) of group gr of the weights 128 h + 32 gr + 8 t ..: ql's nibble gr / 2 of vector c = gr % 2 and
// qh's bits 2 gr, 2 gr + 1
static inline __m256i q6_bits(__m256i ql0, __m256i ql1, __m256i qh, int gr) {
    const __m256i nib = _mm256_set1_epi8(0x0F), top = _mm256_set1_epi8(0x30);
    const __m256i l = gr % 2 ? ql1 : ql0;
    const __m256i low = _mm256_and_si256(gr < 2 ? l : _mm256_srli_epi16(l, 4), nib);
    const __m256i high = gr == 0 ? _mm256_slli_epi16(qh, 4) : gr == 1 ? _mm256_slli_epi16(qh, 2)
                       : gr == 2 ? qh : _mm256_srli_epi16(qh, 2);
    return _mm256_or_si256(low, _mm256_and_si256(high, top));
}

// Q2_K's q (0..3) of group gr of its weights 128 h + 32 gr + 8 t ..: bits 2 gr of its qs (where Q6_K has its qh)
static inline __m256i q2_bits(__m256i qs, int gr) {
    return _mm256_and_si256(gr ? _mm256_srli_epi16(qs, 2 * gr) : qs, _mm256_set1_epi8(3));
}

// Q3_K's third bit of those weights, worth 4: bit 4 hh + gr of its hmask bytes, at bit 2
static inline __m256i q3_third(__m256i hm, int bit) {
    const __m256i at2 = bit > 2 ? _mm256_srli_epi16(hm, bit - 2) : bit < 2 ? _mm256_slli_epi16(hm, 2 - bit) : hm;
    return _mm256_and_si256(at2, _mm256_set1_epi8(4));
}

// Q5_K: sub-block s's fifth bits (bit s of each byte of qh) at bit 4, the rest of the byte zero
static inline __m256i fifth(__m256i qh, int s) {
    const __m256i at4 = s < 4 ? _mm256_slli_epi16(qh, 4 - s) : s == 4 ? qh : _mm256_srli_epi16(qh, s - 4);
    return _mm256_and_si256(at4, _mm256_set1_epi8(0x10));
}

// A group-block's weights unpacked to bytes for several activation rows: q (unsigned; Q6_K's q - 32 is taken off in
// packed_float) in vectors W[unpacked_at(sub-block s, t, h)] = the weights L s + 8 t .. of rows 4h .. 4h + 3, L = 32
// (Q4_K, Q5_K) or 16 (Q6_K).
#define UNPACKED 64
static inline int sub_len(const int SIX) { return SIX ? 16 : 32; }
static inline int unpacked_at(int s, int t, int h, const int SIX) { return (s * (sub_len(SIX) / 8) + t) * 2 + h; }

// the k-th vector of half h of a group-block (k < 8 for the 16-weight sub-blocks, 16 otherwise) unpacked: w[e] the
// weights of the e-th sub-block it holds (4 of 16 weights: sub-block 8 (k / 4) + 2 e + k % 4 / 2, its weights 8 (k %
// 2) ..; or 2 of 32: sub-block 2 (k / 4) + e, its weights 8 (k % 4) ..). A few registers: a decoding row streams them.
static inline __attribute__((always_inline)) void unpack_k(const uint8_t *g, int k, int h, const int FIVE, const int SIX,
                                                            __m256i *w) {
    if (SIX >= 2) {                             // as Q6_K's, from the 2-bit q (Q3_K: and its third bit)
        const int hh = k / 4, t = k % 4;
        const __m256i qs = _mm256_loadu_si256((const __m256i *)(g + Q2K_QS + (4 * hh + t) * 64 + 32 * h));
        const __m256i hm = SIX == 3 ? _mm256_loadu_si256((const __m256i *)(g + Q3K_HM + 64 * t + 32 * h)) : qs;
        for (int gr = 0; gr < 4; gr++)
            w[gr] = SIX == 3 ? _mm256_or_si256(q2_bits(qs, gr), q3_third(hm, 4 * hh + gr)) : q2_bits(qs, gr);
        return;
    }
    if (SIX) {                                  // the weights 128 hh + 32 gr + 8 t .. for gr = 0 .. 3
        const int hh = k / 4, t = k % 4;
        const uint8_t *q3 = g + Q6K_QS + (4 * hh + t) * 192 + 32 * h;
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)q3);
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(q3 + 64));
        const __m256i hb = _mm256_loadu_si256((const __m256i *)(q3 + 128));
        for (int gr = 0; gr < 4; gr++) w[gr] = q6_bits(l0, l1, hb, gr);
        return;
    }
    const int j = k / 4, u = k % 4;             // sub-blocks 2j (low nibbles) and 2j + 1 (high): the weights 8 u ..
    const __m256i nib = _mm256_set1_epi8(0x0F);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(g + (FIVE ? Q5K_QS : Q4K_QS) + (4 * j + u) * 64 + 32 * h));
    w[0] = _mm256_and_si256(v, nib), w[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    if (FIVE) {
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(g + Q5K_QH + 64 * u + 32 * h));
        w[0] = _mm256_or_si256(w[0], fifth(qh, 2 * j)), w[1] = _mm256_or_si256(w[1], fifth(qh, 2 * j + 1));
    }
}

// sub-block and step of the e-th vector unpack_k gives for vector k
static inline int k_sub(int k, int e, const int SIX) { return SIX ? 8 * (k / 4) + 2 * e + k % 4 / 2 : 2 * (k / 4) + e; }
static inline int k_step(int k, const int SIX) { return SIX ? k % 2 : k % 4; }

// unpack_k's vectors into W (unpacked_at's places), for several rows
static inline __attribute__((always_inline)) void unpack_vector(const uint8_t *g, int k, int h, const int FIVE,
                                                                 const int SIX, __m256i *W) {
    __m256i w[4];
    unpack_k(g, k, h, FIVE, SIX, w);
    for (int e = 0; e < (SIX ? 4 : 2); e++) W[unpacked_at(k_sub(k, e, SIX), k_step(k, SIX), h, SIX)] = w[e];
}

// vector k of half h of group-block b against the one activation row x: its sub-blocks' int16 sums into S, and each
// sub-block it completes, times its scales, into T
static inline __attribute__((always_inline)) void streamed_vector(const uint8_t *g, int k, int h,
                                                                   const int8_t *x, const int FIVE, const int SIX,
                                                                   __m256i *S, __m256i *T) {
    const int L = sub_len(SIX);
    __m256i w[4];
    unpack_k(g, k, h, FIVE, SIX, w);
    for (int e = 0; e < (SIX ? 4 : 2); e++) {
        const int s = k_sub(k, e, SIX), t = k_step(k, SIX);
        const __m256i p = pairs8(w[e], x + L * s + 8 * t);
        S[s] = t ? _mm256_add_epi16(S[s], p) : p;
        if (t == L / 8 - 1) *T = _mm256_add_epi32(*T, _mm256_madd_epi16(S[s], sub_scales(g, s, h, SIX)));
    }
}

// group-block b (at g) of 8 rows against the one activation row m: acc += its part, the weights unpacked in registers
// as they are read (a decoding row streams them: one pass, nothing stored)
static inline __attribute__((always_inline)) void group_block(const uint8_t *g, int KB, int b,
                                                               const Acts *a, int64_t m, const int FIVE, const int SIX,
                                                               __m256 *acc) {
    const int8_t *x = a->q256 + (m * KB + b) * 256;
    __m256i T[2], S[16];
    for (int h = 0; h < 2; h++) {
        T[h] = _mm256_setzero_si256();
        if (SIX) _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) streamed_vector(g, k, h, x, 0, SIX, S, &T[h]);
        else _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++) streamed_vector(g, k, h, x, FIVE, 0, S, &T[h]);
    }
    const int64_t at = m * KB + b;
    *acc = packed_float(*acc, row_totals(T[0], T[1]), g, SIX ? a->b256 + at * 16 : a->s256 + at * 8, a->d256[at], SIX);
}

// Step t of sub_block2: the weights 8 t .. of both halves (w: vectors 2 t, 2 t + 1) against the two activation rows'
// 8 bytes (a broadcast serves both halves), into the int16 sums ymm4 (half 0, row 0), ymm5 (1, 0), ymm6 (0, 1),
// ymm7 (1, 1), which step 0 starts; ymm0 .. ymm3 scratch
#define SUB_LOAD(t, x)                                                                                                \
    "vmovdqa " #t "*64(%[w]), %%ymm0\n\tvmovdqa " #t "*64+32(%[w]), %%ymm1\n\t"                                    \
    "vpbroadcastq " #t "*8(%[" #x "]), %%ymm2\n\t"
#define SUB_FIRST(a, b) "vpmaddubsw %%ymm2, %%ymm0, %%ymm" #a "\n\tvpmaddubsw %%ymm2, %%ymm1, %%ymm" #b "\n\t"
#define SUB_ADD(a, b) "vpmaddubsw %%ymm2, %%ymm0, %%ymm3\n\tvpaddw %%ymm3, %%ymm" #a ", %%ymm" #a "\n\t"             \
                      "vpmaddubsw %%ymm2, %%ymm1, %%ymm3\n\tvpaddw %%ymm3, %%ymm" #b ", %%ymm" #b "\n\t"
#define SUB_STEP0 SUB_LOAD(0, x0) SUB_FIRST(4, 5) "vpbroadcastq (%[x1]), %%ymm2\n\t" SUB_FIRST(6, 7)
#define SUB_STEP(t) SUB_LOAD(t, x0) SUB_ADD(4, 5) "vpbroadcastq " #t "*8(%[x1]), %%ymm2\n\t" SUB_ADD(6, 7)
#define SUB_END "vpmaddwd (%[s0]), %%ymm4, %%ymm4\n\tvpaddd %%ymm4, %[t00], %[t00]\n\t"                                \
                "vpmaddwd (%[s1]), %%ymm5, %%ymm5\n\tvpaddd %%ymm5, %[t10], %[t10]\n\t"                                \
                "vpmaddwd (%[s0]), %%ymm6, %%ymm6\n\tvpaddd %%ymm6, %[t01], %[t01]\n\t"                                \
                "vpmaddwd (%[s1]), %%ymm7, %%ymm7\n\tvpaddd %%ymm7, %[t11], %[t11]\n\t"

// A sub-block of the unpacked weights w (STEPS = its length / 8; vector (t, h) at w[2 t + h]) against activation rows
// x0 and x1: T[h][i] += its int16 sums times the rows' scales s_h (madd). A broadcast of x serves both halves, which
// saves a third of the loads; written out because gcc's schedule of the same intrinsics spilled the sums and loaded
// each weight vector twice.
static inline __attribute__((always_inline)) void sub_block2(const __m256i *w, const int8_t *x0, const int8_t *x1,
                                                              const __m256i *s0, const __m256i *s1, const int STEPS,
                                                              __m256i T[2][PACKED_MB]) {
#define SUB_OPERANDS                                                                                                  \
    : [t00] "+x"(T[0][0]), [t01] "+x"(T[0][1]), [t10] "+x"(T[1][0]), [t11] "+x"(T[1][1])                            \
    : [w] "r"(w), [x0] "r"(x0), [x1] "r"(x1), [s0] "r"(s0), [s1] "r"(s1), "m"(*(const char (*)[64 * STEPS])w),       \
      "m"(*(const char (*)[8 * STEPS])x0), "m"(*(const char (*)[8 * STEPS])x1), "m"(*s0), "m"(*s1)                  \
    : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7"
    if (STEPS == 2) __asm__(SUB_STEP0 SUB_STEP(1) SUB_END SUB_OPERANDS);
    else __asm__(SUB_STEP0 SUB_STEP(1) SUB_STEP(2) SUB_STEP(3) SUB_END SUB_OPERANDS);
#undef SUB_OPERANDS
}

// sub_block2 for the one activation row x: T[h][0] += the sub-block's int16 sums times s_h
static inline __attribute__((always_inline)) void sub_block1(const __m256i *w, const int8_t *x, const __m256i *s0,
                                                              const __m256i *s1, const int STEPS,
                                                              __m256i T[2][PACKED_MB]) {
    __m256i S[2];
    _Pragma("GCC unroll 4") for (int t = 0; t < STEPS; t++)
        for (int h = 0; h < 2; h++) {
            const __m256i p = pairs8(w[2 * t + h], x + 8 * t);
            S[h] = t ? _mm256_add_epi16(S[h], p) : p;
        }
    T[0][0] = _mm256_add_epi32(T[0][0], _mm256_madd_epi16(S[0], *s0));
    T[1][0] = _mm256_add_epi32(T[1][0], _mm256_madd_epi16(S[1], *s1));
}

// the unpacked group-block W against activation rows m0 .. m0 + MB (1 or 2): acc[i] += its part, a sub-block's int16
// sums of each half, then its scales
static inline __attribute__((always_inline)) void unpacked_block(const __m256i *W, const uint8_t *g, const __m256i *sc,
                                                                  int KB, int b, const Acts *a, int64_t m0, const int MB,
                                                                  const int SIX, __m256 *acc) {
    const int L = sub_len(SIX);
    const int8_t *x = a->q256 + (m0 * KB + b) * 256;
    __m256i T[2][PACKED_MB];
    for (int i = 0; i < PACKED_MB; i++) T[0][i] = T[1][i] = _mm256_setzero_si256();
    for (int s = 0; s < 256 / L; s++) {
        const __m256i *w = W + unpacked_at(s, 0, 0, SIX);
        if (MB == 2) sub_block2(w, x + L * s, x + KB * 256 + L * s, sc + s, sc + 16 + s, L / 8, T);
        else sub_block1(w, x + L * s, sc + s, sc + 16 + s, L / 8, T);
    }
    for (int i = 0; i < MB; i++) {
        const int64_t at = (m0 + i) * KB + b;
        acc[i] = packed_float(acc[i], row_totals(T[0][i], T[1][i]), g, SIX ? a->b256 + at * 16 : a->s256 + at * 8,
                              a->d256[at], SIX);
    }
}

// A group's 8 rows against activation rows m0 .. m0 + 2 chunks + REST (at most PASS_ROWS): out[i][r]. One pass over the
// weights: one row unpacks each group-block as it multiplies; more rows unpack it once into W and multiply every chunk
// of rows from there, so the unpacking is paid once and fetching the next blocks overlaps the products (a pass a
// chunk would fetch the weights in the first alone).
static inline __attribute__((always_inline)) void packed_dot(const uint8_t *g, int KB, const Acts *a, int64_t m0,
                                                             int chunks, const int REST, const int FIVE, const int SIX,
                                                             float *out) {
    __m256 acc[PASS_ROWS];
    for (int i = 0; i < PACKED_MB * chunks + REST; i++) acc[i] = _mm256_setzero_ps();
    const int size = k_size(FIVE, SIX);
    for (int b = 0; b < KB; b++, g += size) {
        for (int l = 0; l < size; l += 64) _mm_prefetch((const char *)g + AHEAD * size + l, _MM_HINT_T1);
        if (!chunks) {                                 // one row (REST = 1): each scale made where it is used
            group_block(g, KB, b, a, m0, FIVE, SIX, acc);
            continue;
        }
        __m256i sc[32];                                // [h][sub-block]: the scales, once for every chunk
        for (int h = 0; h < 2; h++)
            for (int s = 0; s < (SIX ? 16 : 8); s++) sc[16 * h + s] = sub_scales(g, s, h, SIX);
        __m256i W[UNPACKED];
        for (int h = 0; h < 2; h++)                    // (constant bounds: unrolled, every shift and index known)
            if (SIX) _Pragma("GCC unroll 8") for (int k = 0; k < 8; k++) unpack_vector(g, k, h, 0, SIX, W);
            else _Pragma("GCC unroll 16") for (int k = 0; k < 16; k++) unpack_vector(g, k, h, FIVE, 0, W);
        for (int c = 0; c < chunks; c++)
            unpacked_block(W, g, sc, KB, b, a, m0 + PACKED_MB * c, PACKED_MB, SIX, acc + PACKED_MB * c);
        if (REST) unpacked_block(W, g, sc, KB, b, a, m0 + PACKED_MB * chunks, REST, SIX, acc + PACKED_MB * chunks);
    }
    for (int i = 0; i < PACKED_MB * chunks + REST; i++) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// -- 32-blocks packed by 8 rows (blocks.h) ---------------------------------------------------------------------

// byte l = 0xFF where bit l of x is set
static inline __m256i bit_bytes(uint32_t x) {
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
    return _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
}

// a nibble type's (Q4_0 .. Q5_1) weights 8 t .. (lo) and 16 + 8 t .. (hi) of rows 4h .. 4h + 3 as bytes q <= 31
static inline __attribute__((always_inline)) void nibbles32(const uint8_t *g, int t, int h, const int TYPE, __m256i *lo,
                                                             __m256i *hi) {
    const __m256i nib = _mm256_set1_epi8(0x0F), fifth = _mm256_set1_epi8(0x10);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(g + qs32(TYPE) + 64 * t + 32 * h));
    *lo = _mm256_and_si256(v, nib), *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
    if (five32(TYPE)) {
        uint32_t l, u;
        memcpy(&l, g + qh32(TYPE) + 8 * t + 4 * h, 4), memcpy(&u, g + qh32(TYPE) + 8 * (2 + t) + 4 * h, 4);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(bit_bytes(l), fifth));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(bit_bytes(u), fifth));
    }
}

// a leveled type's group-block g as its levels (IQ4's signed bytes, the grid kinds' + q32_offset): L[4 h + t] the
// weights 8 t .. of rows 4h .. 4h + 3
static inline __attribute__((always_inline)) void levels32(const uint8_t *g, const int TYPE, __m256i *L) {
    const __m256i table = _mm256_add_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)levels_of(TYPE))),
                                          _mm256_set1_epi8((char)q32_offset(TYPE)));
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 2; t++) {
            nibbles32(g, t, h, TYPE, &L[4 * h + t], &L[4 * h + 2 + t]);
            L[4 * h + t] = _mm256_shuffle_epi8(table, L[4 * h + t]);
            L[4 * h + 2 + t] = _mm256_shuffle_epi8(table, L[4 * h + 2 + t]);
        }
}

// group-block b (at g) of 8 rows of a 32-block TYPE against activation rows m0 .. m0 + MB: acc[i] += its part. Vectors
// as the K-quants' (4 rows' 8 bytes, h: rows 4h .. 4h + 3). Q8_0 and IQ4 (its levels L, levels32's): |q| maddubs x
// with q's sign (a pair <= 2 128 127: none saturates), a madd to int32 a vector; the grid kinds (L unsigned <= 126):
// q maddubs x (a pair <= 2 126 127), a madd a vector; Q4_0 .. Q5_1: q unsigned <= 31, a block's 4 maddubs add in
// int16 (|sum| <= 4 2 31 127 = 31496), then one madd.
static inline __attribute__((always_inline)) void group_block32(const uint8_t *g, const __m256i *L, int QB, int b,
                                                                 const Acts *a, int64_t m0, const int MB,
                                                                 const int TYPE, __m256 *acc) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *x = a->q32 + (m0 * QB + b) * 32;
    __m256i T[2][PACKED_MB], U[2][PACKED_MB];      // U: HALVES_IQ2_IQ1's sums of the weights 16 .., T's of 0 ..
    for (int h = 0; h < 2; h++) {
        if (leveled(TYPE) && TYPE != IQ4_NL) {
            for (int i = 0; i < MB; i++) T[h][i] = U[h][i] = _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++)        // the weights 8 t ..
                for (int i = 0; i < MB; i++) {
                    int64_t v;
                    memcpy(&v, x + i * QB * 32 + 8 * t, 8);
                    const __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(L[4 * h + t], _mm256_set1_epi64x(v)), ones);
                    if (halves32(TYPE) && t >= 2) U[h][i] = _mm256_add_epi32(U[h][i], p);
                    else T[h][i] = _mm256_add_epi32(T[h][i], p);
                }
            continue;
        }
        if (TYPE == Q8_0 || TYPE == IQ4_NL) {
            for (int i = 0; i < MB; i++) T[h][i] = _mm256_setzero_si256();
            _Pragma("GCC unroll 4") for (int t = 0; t < 4; t++) {      // the weights 8 t ..
                const __m256i q = TYPE == IQ4_NL ? L[4 * h + t]
                                                 : _mm256_loadu_si256((const __m256i *)(g + qs32(TYPE) + 64 * t + 32 * h));
                const __m256i mag = _mm256_sign_epi8(q, q);
                for (int i = 0; i < MB; i++) {
                    int64_t v;
                    memcpy(&v, x + i * QB * 32 + 8 * t, 8);
                    const __m256i p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(_mm256_set1_epi64x(v), q));
                    T[h][i] = _mm256_add_epi32(T[h][i], _mm256_madd_epi16(p, ones));
                }
            }
            continue;
        }
        __m256i S[PACKED_MB];
        for (int i = 0; i < MB; i++) S[i] = _mm256_setzero_si256();
        _Pragma("GCC unroll 2") for (int t = 0; t < 2; t++) {          // the weights 8 t .. (lo) and 16 + 8 t .. (hi)
            __m256i lo, hi;
            nibbles32(g, t, h, TYPE, &lo, &hi);
            for (int i = 0; i < MB; i++) {
                S[i] = _mm256_add_epi16(S[i], pairs8(lo, x + i * QB * 32 + 8 * t));
                S[i] = _mm256_add_epi16(S[i], pairs8(hi, x + i * QB * 32 + 16 + 8 * t));
            }
        }
        for (int i = 0; i < MB; i++) T[h][i] = _mm256_madd_epi16(S[i], ones);
    }
    for (int i = 0; i < MB; i++) {
        const int64_t at = (m0 + i) * QB + b;
        if (halves32(TYPE))
            acc[i] = halves_float32(acc[i], row_totals(T[0][i], T[1][i]), row_totals(U[0][i], U[1][i]), g, a->d32[at],
                                    a->s32[at], a->h32[at]);
        else acc[i] = packed_float32(acc[i], row_totals(T[0][i], T[1][i]), g, a->d32[at], a->s32[at], a->ds32[at], TYPE);
    }
}

// A nibble type's group-block b unpacked (W[2 u + h]: the weights 8 u .. of rows 4h .. 4h + 3, so that step u meets
// x's bytes 8 u ..) against activation rows m0 .. m0 + MB (1 or 2): acc[i] += its part, as group_block32's
static inline __attribute__((always_inline)) void unpacked_block32(const __m256i *W, const uint8_t *g, int QB, int b,
                                                                    const Acts *a, int64_t m0, const int MB,
                                                                    const int TYPE, __m256 *acc) {
    static const __m256i ones = {0x0001000100010001, 0x0001000100010001, 0x0001000100010001, 0x0001000100010001};
    const int8_t *x = a->q32 + (m0 * QB + b) * 32;
    __m256i T[2][PACKED_MB];
    for (int i = 0; i < PACKED_MB; i++) T[0][i] = T[1][i] = _mm256_setzero_si256();
    if (MB == 2) sub_block2(W, x, x + QB * 32, &ones, &ones, 4, T);
    else sub_block1(W, x, &ones, &ones, 4, T);
    for (int i = 0; i < MB; i++) {
        const int64_t at = (m0 + i) * QB + b;
        acc[i] = packed_float32(acc[i], row_totals(T[0][i], T[1][i]), g, a->d32[at], a->s32[at], a->ds32[at], TYPE);
    }
}

// packed_dot for the 32-blocks: a group's 8 rows against activation rows m0 .. m0 + 2 chunks + REST, one pass over
// the weights (a loop of its own, as in blocks512.c, where one loop for both kinds slowed the K-quants' products)
static inline __attribute__((always_inline)) void packed_dot32(const uint8_t *g, int QB, const Acts *a, int64_t m0,
                                                               int chunks, const int REST, const int TYPE, float *out) {
    __m256 acc[PASS_ROWS];
    for (int i = 0; i < PACKED_MB * chunks + REST; i++) acc[i] = _mm256_setzero_ps();
    const int size = packed_block(TYPE);
    for (int b = 0; b < QB; b++, g += size) {
        for (int l = 0; l < size; l += 64) _mm_prefetch((const char *)g + AHEAD_BYTES + l, _MM_HINT_T1);
        if (TYPE != Q8_0 && !leveled(TYPE) && chunks) {  // several rows: a nibble type unpacked once
            __m256i W[8];
            for (int t = 0; t < 2; t++)
                for (int h = 0; h < 2; h++) nibbles32(g, t, h, TYPE, &W[2 * t + h], &W[2 * (2 + t) + h]);
            for (int c = 0; c < chunks; c++)
                unpacked_block32(W, g, QB, b, a, m0 + PACKED_MB * c, PACKED_MB, TYPE, acc + PACKED_MB * c);
            if (REST) unpacked_block32(W, g, QB, b, a, m0 + PACKED_MB * chunks, REST, TYPE, acc + PACKED_MB * chunks);
            continue;
        }
        __m256i L[8];                                  // a leveled type's levels, once for every chunk
        if (leveled(TYPE)) levels32(g, TYPE, L);
        for (int c = 0; c < chunks; c++)
            group_block32(g, L, QB, b, a, m0 + PACKED_MB * c, PACKED_MB, TYPE, acc + PACKED_MB * c);
        if (REST) group_block32(g, L, QB, b, a, m0 + PACKED_MB * chunks, REST, TYPE, acc + PACKED_MB * chunks);
    }
    for (int i = 0; i < PACKED_MB * chunks + REST; i++) _mm256_storeu_ps(out + 8 * i, acc[i]);
}

// group g0 (its first byte) of `type` against rows m0 .. m0 + mb (mb <= PASS_ROWS): out [mb][8]
static void packed_rows(int type, const uint8_t *g0, int K, const Acts *a, int64_t m0, int mb, float *out) {
    if (wide()) {
        packed_rows512(type, g0, K, a, m0, mb, out);
        return;
    }
    const int c = mb / PACKED_MB;
#define ROWS(C, R) PACKED_TYPES(packed_dot, packed_dot32, C, R)
    if (mb == 1) ROWS(0, 1)         // decoding's row: code of its own, where no several-row path takes registers
    else if (mb % PACKED_MB) ROWS(c, 1)
    else ROWS(c, 0)
#undef ROWS
}

// the packed bytes of one group of 8 rows of `type` and K columns
static int64_t group_bytes(int type, int K) { return (int64_t)(K / packed_size(type)) * packed_block(runs_as(type)); }

// the bytes of a part's rows of `type` packed (gguf_pack), or 0 where the type has no packed kernel
int64_t gguf_packed_bytes(int type, int rows, int K) {
    return K % block_size(type) ? 0 : (rows + PACK_ROWS - 1) / PACK_ROWS * group_bytes(type, K);
}

// the first byte of group g's blocks in a part packed from K columns
static const uint8_t *packed_group(const Part *p, int K, int64_t g) { return p->packed + g * group_bytes(p->type, K); }

// where row r's scale (or min) of sub-block s goes in a [8 p][8 rows][2] table of a group-block (blocks.h)
static inline int pair_at(int s, int r) { return 16 * (s / 2) + 2 * r + s % 2; }

// row r's block w (of the file) into its group-block o (blocks.h's layouts)
static void pack_block(int type, const uint8_t *w, int r, uint8_t *o) {
    if (leveled(type)) {                                // w: its scale and 16 bytes of qs (recoded: grid_levels)
        if (halves32(type)) memcpy(o + 2 * r, w, 2), o[16 + r] = w[2], o[24 + r] = w[3];
        else memcpy(o + 4 * r, w, 4);
        for (int t = 0; t < 2; t++) memcpy(o + qs32(type) + 64 * t + 8 * r, w + 4 + 8 * t, 8);
        return;
    }
    if (block_size(type) == 32) {
        const uint8_t *qh = w + 2 + 2 * mins32(type), *qs = qh + 4 * five32(type);
        memcpy(o + 2 * r, w, 2);
        if (mins32(type)) memcpy(o + 16 + 2 * r, w + 2, 2);
        for (int c = 0; five32(type) && c < 4; c++) o[qh32(type) + 8 * c + r] = qh[c];
        for (int t = 0; t < (type == Q8_0 ? 4 : 2); t++) memcpy(o + qs32(type) + 64 * t + 8 * r, qs + 8 * t, 8);
        return;
    }
    if (type == Q4_K || type == Q5_K) {
        const int five = type == Q5_K;
        uint8_t sc[8], mn[8];
        scale_min(w + 4, sc, mn);
        memcpy(o + 2 * r, w, 2), memcpy(o + 16 + 2 * r, w + 2, 2);
        for (int s = 0; s < 8; s++) o[Q4K_SC + 8 * s + r] = sc[s], o[Q4K_MN + pair_at(s, r)] = mn[s];
        for (int v = 0; v < 16; v++) memcpy(o + (five ? Q5K_QS : Q4K_QS) + 64 * v + 8 * r, w + 16 + 32 * five + 8 * v, 8);
        for (int v = 0; five && v < 4; v++) memcpy(o + Q5K_QH + 64 * v + 8 * r, w + 16 + 8 * v, 8);
        return;
    }
    if (type == Q3_K) {                                 // d, scales less 32, qs, hmask
        memcpy(o + 2 * r, w + 108, 2);
        int8_t sc[16];
        q3k_scales(w + 96, sc);
        for (int s = 0; s < 16; s++) o[Q6K_SC + pair_at(s, r)] = (uint8_t)sc[s];
        for (int v = 0; v < 8; v++) memcpy(o + Q2K_QS + 64 * v + 8 * r, w + 32 + 8 * v, 8);
        for (int t = 0; t < 4; t++) memcpy(o + Q3K_HM + 64 * t + 8 * r, w + 8 * t, 8);
        return;
    }
    if (type == Q2_K) {                                 // scales (low nibbles) and mins per 16, qs, d, dmin
        memcpy(o + 2 * r, w + 80, 2), memcpy(o + Q2K_DMIN + 2 * r, w + 82, 2);
        for (int s = 0; s < 16; s++) {
            o[Q6K_SC + pair_at(s, r)] = w[s] & 0x0F;
            o[Q2K_MN + pair_at(s, r)] = w[s] >> 4;
        }
        for (int v = 0; v < 8; v++) memcpy(o + Q2K_QS + 64 * v + 8 * r, w + 16 + 8 * v, 8);
        return;
    }
    memcpy(o + 2 * r, w + 208, 2);
    for (int s = 0; s < 16; s++) o[Q6K_SC + pair_at(s, r)] = w[192 + s];
    for (int h = 0; h < 2; h++)
        for (int t = 0; t < 4; t++) {
            uint8_t *q3 = o + Q6K_QS + (4 * h + t) * 192 + 8 * r;
            memcpy(q3, w + 64 * h + 8 * t, 8), memcpy(q3 + 64, w + 64 * h + 32 + 8 * t, 8), memcpy(q3 + 128, w + 128 + 32 * h + 8 * t, 8);
        }
}

typedef struct {
    const Part *p;
    int K;
    uint8_t *out;           // group `first`'s bytes
    int64_t first;
} Packing;

static void pack_groups(void *ctx, int64_t g0, int64_t g1) {
    const Packing *k = ctx;
    const Part *p = k->p;
    const int as = runs_as(p->type), KB = k->K / block_size(as), size = packed_block(as), bytes = block_bytes(p->type);
    const int per = block_size(p->type) / block_size(as);              // packed blocks a block of the file
    uint8_t recoded[LEVELED_BYTES];                                    // a block of the file as one of `as`
    for (int64_t g = k->first + g0; g < k->first + g1; g++)
        for (int b = 0; b < KB; b++) {
            uint8_t *o = k->out + ((g - k->first) * KB + b) * size;
            memset(o, 0, size);                        // rows past the part's last: zeros, d = 0
            for (int r = 0; r < PACK_ROWS && g * PACK_ROWS + r < p->rows; r++) {
                const int64_t row = g * PACK_ROWS + r;
                const uint8_t *w = p->data + (int64_t)(p->map ? p->map[row] : row) * p->stride + b / per * bytes;
                if (as == IQ4_NL) iq4_block(p->type, w, b % per, recoded), w = recoded;
                else if (leveled(as)) grid_levels(p->type, w, b % per, recoded), w = recoded;
                pack_block(as, w, r, o);
            }
        }
}

// groups g0 .. g1 of 8 rows of part `part`, in output order (its map applied), into out (gguf_packed_bytes of the
// part's rows: out is the whole part's)
void gguf_pack(const Matrix *w, int part, int K, int64_t g0, int64_t g1, uint8_t *out) {
    Packing k = {&w->part[part], K, out + g0 * group_bytes(w->part[part].type, K)};
    k.first = g0;
    parallel_for(g1 - g0, 64, pack_groups, &k);
}

typedef struct {            // gguf_linear's arguments, for its parallel tasks
    const Matrix *w;
    const Acts *a;
    int M, K, N;
    const float *bias;
    float *y;
} BlockProduct;

// whether block_rows multiplies two groups of a packed type at once (csrc/blocks512.c's packed_pair512: 16 rows)
static int in_pairs(int type) { return wide() && packed_pair512 && block_size(type) == 32; }

// output columns n0 .. n1 for every row of x: PASS_ROWS rows at a time against each group of 8 weight rows, or two
// (in_pairs) where the task holds both (a task's weights stream once for every PASS_ROWS rows; a group's rows
// outside the task computed and let go)
static void block_rows(void *ctx, int64_t n0, int64_t n1) {
    const BlockProduct *p = ctx;
    for (int m0 = 0; m0 < p->M; m0 += PASS_ROWS) {
        const int mb = p->M - m0 < PASS_ROWS ? p->M - m0 : PASS_ROWS;
        for (int64_t n = n0; n < n1;) {
            int part = 0, r = (int)n;
            while (r >= p->w->part[part].rows) r -= p->w->part[part++].rows;
            const Part *pt = &p->w->part[part];
            const int as = runs_as(pt->type), first = r / PACK_ROWS * PACK_ROWS;
            const int pair = in_pairs(as) && first + PACK_ROWS < pt->rows && n1 - n > first + PACK_ROWS - r;
            const int span = pair ? 2 * PACK_ROWS : PACK_ROWS, last = first + span < pt->rows ? first + span : pt->rows;
            float group[PASS_ROWS * 2 * PACK_ROWS];
            if (pair) packed_pair512(as, packed_group(pt, p->K, first / PACK_ROWS), p->K, p->a, m0, mb, group);
            else packed_rows(as, packed_group(pt, p->K, first / PACK_ROWS), p->K, p->a, m0, mb, group);
            const int count = (int)(last - r < n1 - n ? last - r : n1 - n);
            for (int i = 0; i < mb; i++)
                for (int c = 0; c < count; c++)
                    p->y[(int64_t)(m0 + i) * p->N + n + c] = group[span * i + r - first + c] + (p->bias ? p->bias[n + c] : 0.0f);
            n += count;
        }
    }
}

// output columns n0 .. n1 for every row of x: the packed parts' rows on the tiles (from a multiple of 16), the rest as
// block_rows computes them
static void tile_rows(void *ctx, int64_t n0, int64_t n1) {
    const BlockProduct *p = ctx;
    for (int64_t n = n0; n < n1;) {
        int part = 0, r = (int)n;
        while (r >= p->w->part[part].rows) r -= p->w->part[part++].rows;
        const Part *pt = &p->w->part[part];
        const int64_t end = n + (pt->rows - r) < n1 ? n + (pt->rows - r) : n1;
        if (r % 16 || p->M < least_tile_rows(pt->type))
            block_rows(ctx, n, end);
        else
            packed_tiles(runs_as(pt->type), packed_group(pt, p->K, r / PACK_ROWS), (int)(end - n), p->K, p->a, p->M, p->bias,
                         p->y, p->N, (int)n);
        n = end;
    }
}

// y[M, N] = x[M, K] . w^T (+ bias[N]): w's parts of rows add up to N, each a kind of block of K columns
void gguf_linear(const float *x, int M, int K, const Matrix *w, int N, const float *bias, float *y) {
    Acts a;
    quantize_acts(w, x, M, K, &a);
    BlockProduct p = {w, &a, M, K, N, bias, y};
    if (tiles && M >= least_matrix_tile_rows(w)) parallel_for(N, 64, tile_rows, &p);
    else parallel_for(N, 16, block_rows, &p);
    free_acts(&a);
}

// whether gguf_linear multiplies a matrix of this type with K columns
int gguf_kernel(int type, int K) {
    if (grid_kind(type)) return runs_as(type) != type && K % 256 == 0 && grid_ready(type);
    return (type == Q4_0 || type == Q4_1 || type == Q5_0 || type == Q5_1 || type == Q8_0) ? K % 32 == 0
           : (type >= Q2_K && type <= Q6_K) || type == IQ4_XS ? K % 256 == 0 : type == IQ4_NL ? K % 32 == 0 : 0;
}

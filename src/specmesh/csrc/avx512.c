// Kernels for x86 CPUs with AVX-512 (see kernels.py): attention and int8 products as in avx2.c with
// twice the width, and where the CPU also has AMX a bf16 tile product.
// amx_linear: y[M,N] = bf16(x)[M,K] . w[N,K]^T (+ bias[N]) with the tile unit: one tile product
//   multiplies 16 rows of x by 16 weight columns over 32 of K, so 1 to 16 rows cost one pass
//   over the weights (the product is memory-bound) and a verification or a batch of 16 costs
//   about what one token costs. x is rounded to bf16 (nearest even) and products accumulate in
//   float32 in a fixed order, so a row's result never depends on the other rows (M).
// The weights are pre-packed (kernels.AMXLinear) as w[G][KB][4][16][16][2]: group g of 64 output
//   columns, K block kb of 32, column block c of 16, then the tile's 16 rows of K pairs
//   (row r holds w[n][32 kb + 2 r + e] for the 16 columns n, e = 0, 1: the "VNNI" layout).
// amx_attention: a prefill's causal attention on the tile unit (head dim 64, bf16 cache).
#pragma GCC target("amx-tile,amx-bf16,avx512f,avx512bw,avx512dq,avx512vl,avx512bf16,avx512vnni")
#include "api.h"
#include "pool.h"
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

void store_tile(const float *out, int ld, int mb, int cols, const float *bias, float *y, int N, int m0,
                int n0);                           // csrc/avx2.c: a pass's tile of outputs written back

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE 512                                   // bf16 elements in a 16 x 64-byte weight tile

// Asks Linux for the tile registers (once per process); 0 on success.
int amx_init(void) { return (int)syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); }

typedef struct { uint8_t palette, start_row, reserved[14]; uint16_t colsb[16]; uint8_t rows[16]; } TileConfig;

static void configure_tiles(void) {                // every tile 16 rows x 64 bytes
    TileConfig c;
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 8; t++) { c.rows[t] = 16; c.colsb[t] = 64; }
    _tile_loadconfig(&c);
}

// x [M <= 16, K] float32 -> a [16, KP] bf16 (nearest even), zeros past row M and column K (the tile product's
// blocks of 16 rows; dp_linear's rows of K pairs)
static void to_bf16(const float *x, int M, int K, int KP, uint16_t *a) {
    memset(a, 0, sizeof(uint16_t) * 16 * KP);
    for (int m = 0; m < M; m++) {
        const float *xr = x + (int64_t)m * K;
        uint16_t *ar = a + (int64_t)m * KP;
        int k = 0;
        for (; k + 16 <= K; k += 16)
            _mm256_storeu_si256((__m256i *)(ar + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(xr + k)));
        if (k < K) {
            __mmask16 tail = (__mmask16)((1u << (K - k)) - 1);
            __m256i h = (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(tail, xr + k));
            _mm256_mask_storeu_epi16(ar + k, tail, h);
        }
    }
}

// One 16-row block of x (a, row stride KP) times weight group g: 64 output columns into y.
static void group_product(const uint16_t *a, int KP, const uint16_t *wg, int KB, int rows, int cols,
                          const float *bias, int N, float *y) {
    float c[16][64] __attribute__((aligned(64)));
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (int kb = 0; kb < KB; kb++) {
        const uint16_t *t = wg + (int64_t)kb * 4 * TILE;
        _tile_loadd(4, a + kb * 32, KP * 2);
        _tile_loadd(5, t, 64);            _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, t + TILE, 64);     _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, t + 2 * TILE, 64); _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, t + 3 * TILE, 64); _tile_dpbf16ps(3, 4, 6);
    }
    if (rows == 16 && cols == 64) {                            // straight into y
        _tile_stored(0, y, N * 4); _tile_stored(1, y + 16, N * 4);
        _tile_stored(2, y + 32, N * 4); _tile_stored(3, y + 48, N * 4);
        if (bias)
            for (int m = 0; m < 16; m++)
                for (int n = 0; n < 64; n += 16)
                    _mm512_storeu_ps(y + (int64_t)m * N + n, _mm512_add_ps(_mm512_loadu_ps(y + (int64_t)m * N + n),
                                                                            _mm512_loadu_ps(bias + n)));
        return;
    }
    _tile_stored(0, &c[0][0], 256); _tile_stored(1, &c[0][16], 256);
    _tile_stored(2, &c[0][32], 256); _tile_stored(3, &c[0][48], 256);
    for (int m = 0; m < rows; m++)
        for (int n = 0; n < cols; n++) y[(int64_t)m * N + n] = c[m][n] + (bias ? bias[n] : 0.0f);
}

// e^x lane by lane: avx2.c's exp8 on 16 lanes (Cephes' polynomial); e^x < 1e-37 becomes 0
static inline __m512 exp16(__m512 x) {
    __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-85.0f), _CMP_LT_OQ);
    x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.3762626647949f)), _mm512_set1_ps(-85.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    x = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), x);
    __m512 y = _mm512_set1_ps(1.9875691500E-4f);
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.3981999507E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(8.3334519073E-3f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(4.1665795894E-2f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(1.6666665459E-1f));
    y = _mm512_fmadd_ps(y, x, _mm512_set1_ps(5.0000001201E-1f));
    y = _mm512_add_ps(_mm512_fmadd_ps(y, _mm512_mul_ps(x, x), x), _mm512_set1_ps(1.0f));
    __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_maskz_mov_ps((__mmask16)~tiny, _mm512_mul_ps(y, _mm512_castsi512_ps(e)));
}

// act rows of a GLU product (amx_glu): silu(gate) * up for the rows of one group's 64 products c, as
// avx2.c's swiglu computes it (exp16 is exp8 on 16 lanes): the same values
static void glu_rows(float c[16][64], int rows, float *act, int I) {
    for (int m = 0; m < rows; m++)
        for (int j = 0; j < 32; j += 16) {
            __m512 gv = _mm512_load_ps(&c[m][j]);
            __m512 sig = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.0f),
                                                         exp16(_mm512_sub_ps(_mm512_setzero_ps(), gv))));
            _mm512_storeu_ps(act + (int64_t)m * I + j, _mm512_mul_ps(sig, _mm512_load_ps(&c[m][32 + j])));
        }
}

// amx_linear's and amx_glu's product: y = x . w^T (+ bias), or where act is given (N = 2I, w packed
// for amx_glu) act = silu(gate) * up of each group's 64 products while they are in L1.
static void tile_product(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y,
                         float *act) {
    const int KB = (K + 31) / 32, KP = KB * 32, MB = (M + 15) / 16, G = (N + 63) / 64, I = N / 2;
    uint16_t *a = aligned_alloc(64, sizeof(uint16_t) * MB * 16 * KP);
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int mb = 0; mb < MB; mb++)
            to_bf16(x + (int64_t)mb * 16 * K, M - mb * 16 < 16 ? M - mb * 16 : 16, K, KP, a + (int64_t)mb * 16 * KP);
        configure_tiles();                         // tile state is per thread
        float c[16][64] __attribute__((aligned(64)));
        #pragma omp for schedule(static)
        for (int g = 0; g < G; g++) {
            int cols = N - g * 64 < 64 ? N - g * 64 : 64;
            for (int mb = 0; mb < MB; mb++) {
                int rows = M - mb * 16 < 16 ? M - mb * 16 : 16;
                const uint16_t *am = a + (int64_t)mb * 16 * KP, *wg = w + (int64_t)g * KB * 4 * TILE;
                const float *bg = bias ? bias + g * 64 : NULL;
                if (act) {
                    group_product(am, KP, wg, KB, rows, 64, bg, 64, &c[0][0]);
                    glu_rows(c, rows, act + (int64_t)mb * 16 * I + 32 * g, I);
                } else
                    group_product(am, KP, wg, KB, rows, cols, bg, N, y + (int64_t)mb * 16 * N + g * 64);
            }
        }
        _tile_release();
    }
    free(a);
}

void amx_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y) {
    tile_product(x, M, K, w, N, bias, y, NULL);
}

// act[M, I] = silu(gate) * up, where gate and up are the two halves of x . w^T (+ bias) and w is
// packed with the columns interleaved (kernels.glu_order: group g holds gate columns 32 g .. 32 g + 31,
// then the matching up columns), so SwiGLU runs on each 16-row block's 64 products while they are in
// L1 and only act is written: half the bytes of [gate | up]. Products, bias and SwiGLU are computed
// as amx_linear and avx2.c's swiglu compute them: the same values.
void amx_glu(const float *x, int M, int K, const uint16_t *w, int I, const float *bias, float *act) {
    tile_product(x, M, K, w, 2 * I, bias, NULL, act);
}

// [sum(a[0]), ..., sum(a[7])] of 16 lanes each: the same addition tree for every key
static inline __m256 hsum8x16(const __m512 *a) {
    __m256 h[8];
    for (int i = 0; i < 8; i++) h[i] = _mm256_add_ps(_mm512_castps512_ps256(a[i]), _mm512_extractf32x8_ps(a[i], 1));
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(h[0], h[1]), _mm256_hadd_ps(h[2], h[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(h[4], h[5]), _mm256_hadd_ps(h[6], h[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

#define MAX_HV 8                                   // head dims up to 128, in vectors of 16
#define KB 64                                      // keys per block: a block's keys and values stay in L1
#define TRANSPOSED_ROWS 16                         // rows of a task from which its blocks of keys are transposed

// Softmax numerators of one row of scores pr[0, P) in place; returns 1 / their sum. The sum runs
// over the nonzero numerators compacted in key order (the i-th in lane i % 16), so it does not
// depend on where masked keys sit (a tree's other nodes between a node's ancestors).
static inline float softmax_row(float *pr, int P, float *packed) {
    __m512 top = _mm512_set1_ps(-INFINITY), sum = _mm512_setzero_ps();
    for (int j0 = 0; j0 < P; j0 += 16) top = _mm512_max_ps(top, _mm512_load_ps(pr + j0));
    __m512 mx = _mm512_set1_ps(_mm512_reduce_max_ps(top));
    int n = 0;
    for (int j0 = 0; j0 < P; j0 += 16) {
        __m512 w = exp16(_mm512_sub_ps(_mm512_load_ps(pr + j0), mx));
        _mm512_store_ps(pr + j0, w);
        __mmask16 live = _mm512_cmp_ps_mask(w, _mm512_setzero_ps(), _CMP_NEQ_UQ);
        // compressed in a register, then stored whole (the lanes past the live ones are 0, and the next store or
        // the tail below covers them): a compressing store to memory is microcoded on some cores
        _mm512_storeu_ps(packed + n, _mm512_maskz_compress_ps(live, w));
        n += __builtin_popcount(live);
    }
    for (int j = n; j < (n + 15) / 16 * 16; j++) packed[j] = 0.0f;
    for (int j0 = 0; j0 < n; j0 += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(packed + j0));
    return 1.0f / _mm512_reduce_add_ps(sum);
}

// 16 cached keys or values from element i on: float32, or bf16 where KV16 (exact)
static inline __m512 load_kv16(const void *c, int64_t i, const int KV16) {
    if (KV16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
            _mm256_loadu_si256((const __m256i *)((const uint16_t *)c + i))), 16));
    return _mm512_loadu_ps((const float *)c + i);
}

// Keys or values [j0, j1) of one kv head (from element kv0 on) as float32 at f [(j - j0) * hd]: a bf16
// cache is widened once per block for every query row that reads it (exact), rather than once per row;
// a float32 cache is read where it is (f unused).
static inline const float *block_f32(const void *c, int64_t kv0, int j0, int j1, int hd, float *f, const int KV16) {
    if (!KV16)
        return (const float *)c + kv0 + (int64_t)j0 * hd;
    for (int j = j0; j < j1; j++) {
        const char *ahead = (const char *)c + (kv0 + (int64_t)(j + 32) * hd) * 2;   // 32 keys ahead, from L3
        for (int line = 0; line < hd * 2; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
        for (int d = 0; d < hd; d += 16) _mm512_store_ps(f + (int64_t)(j - j0) * hd + d, load_kv16(c, kv0 + (int64_t)j * hd + d, 1));
    }
    return f;
}

// 16 elements from element i of a block of keys or values: float32 where it is (a float32 cache, or a bf16 one
// widened into a buffer), or bf16 widened in registers where BF (the same floats)
static inline __m512 load_at(const void *base, int64_t i, const int BF) {
    return BF ? load_kv16(base, i, 1) : _mm512_loadu_ps((const float *)base + i);
}

// -inf at pr[0, 8) for the keys j0 .. j0 + 7 that token t does not see: where its mask row mrow is 0, or
// without a mask past key `last`; keys from kv_len on are never seen
static inline void hide8(float *pr, const uint8_t *mrow, int j0, int kv_len, int last) {
    if (j0 + 8 <= kv_len) {
        if (!mrow) {
            if (j0 + 7 <= last) return;
        } else {
            __mmask8 hidden = _mm_cmpeq_epi16_mask(_mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)(mrow + j0))),
                                                   _mm_setzero_si128());
            _mm256_mask_storeu_ps(pr, hidden, _mm256_set1_ps(-INFINITY));
            return;
        }
    }
    for (int j = j0; j < j0 + 8; j++)
        if (!(j < kv_len && (mrow ? mrow[j] : j <= last))) pr[j - j0] = -INFINITY;
}

// Scores of N query rows (1 or 2; their q at qv[n * HV + c]) against the 8 keys from element `at` of kb (only the
// first `live` are read, the others give 0): 8 floats per row at pr[n]. Each key's vectors are loaded once for the
// N rows; a row's dot product per key runs over c in order, then hsum8x16's tree, as it would alone. (With c inside
// the keys each key's chain of HV dependent products ran alone: latency-bound, 3x slower.)
static inline __attribute__((always_inline)) void score_rows(const __m512 *qv, const void *kb, int64_t at, int hd,
                                                             int live, float scale, float *const *pr, const int N,
                                                             const int HV, const int BF) {
    __m512 acc[2][8];
    for (int n = 0; n < N; n++)
        for (int jj = 0; jj < 8; jj++) acc[n][jj] = _mm512_setzero_ps();
    if (live >= 8)                       // c outside the keys: the 8 keys' chains interleave, in registers
        for (int c = 0; c < HV; c++) {
            #pragma GCC unroll 8
            for (int jj = 0; jj < 8; jj++) {
                const __m512 k = load_at(kb, at + (int64_t)jj * hd + 16 * c, BF);
                for (int n = 0; n < N; n++) acc[n][jj] = _mm512_fmadd_ps(qv[n * HV + c], k, acc[n][jj]);
            }
        }
    else
        for (int jj = 0; jj < live; jj++)
            for (int c = 0; c < HV; c++) {
                const __m512 k = load_at(kb, at + (int64_t)jj * hd + 16 * c, BF);
                for (int n = 0; n < N; n++) acc[n][jj] = _mm512_fmadd_ps(qv[n * HV + c], k, acc[n][jj]);
            }
    for (int n = 0; n < N; n++) _mm256_store_ps(pr[n], _mm256_mul_ps(hsum8x16(acc[n]), _mm256_set1_ps(scale)));
}

// Keys [j0, j1) of one kv head transposed to float32: kt[d * KB + (j - j0)] for the KB keys of a block, zero from j1
// on. 16 keys by 16 dims at a time through transpose16 (declared below): widened (exact), transposed, stored.
static inline void transpose16(__m512i r[16]);
static inline void block_t32(const void *c, int64_t kv0, int j0, int j1, int hd, float *kt, const int KV16) {
    for (int g = 0; g < KB; g += 16)
        for (int d = 0; d < hd; d += 16) {
            __m512i r[16];
            for (int i = 0; i < 16; i++)
                r[i] = j0 + g + i < j1 ? _mm512_castps_si512(load_kv16(c, kv0 + (int64_t)(j0 + g + i) * hd + d, KV16))
                                       : _mm512_setzero_si512();
            transpose16(r);
            for (int i = 0; i < 16; i++) _mm512_store_si512(kt + (int64_t)(d + i) * KB + g, r[i]);
        }
}

// Scores of one query row q against the first NG groups of 16 keys of a transposed block kt: 16 floats a group at
// pr. Key j's lane partials a_l = sum over c of q[16c + l] k_j[16c + l] (l < 16) are score_rows' chained
// multiply-adds, and hsum8x16's tree over them, h_l = a_l + a_(l+8), p_m = h_2m + h_2m+1, (p_0 + p_1) + (p_2 + p_3),
// is here adds of whole vectors, 16 keys a lane each: the same bits, without a horizontal sum. One broadcast of a q
// element serves the NG groups (its loads would bind otherwise).
static inline __attribute__((always_inline)) void score_row_t(const float *q, const float *kt, float scale,
                                                              float *pr, const int NG, const int HV) {
    __m512 p[4][4];
    for (int m = 0; m < 4; m++) {
        __m512 h[2][4];
        for (int e = 0; e < 2; e++) {
            const int l = 2 * m + e;
            __m512 a[4], b[4];
            for (int g = 0; g < NG; g++) a[g] = b[g] = _mm512_setzero_ps();
            for (int c = 0; c < HV; c++) {
                const __m512 qa = _mm512_set1_ps(q[16 * c + l]), qb = _mm512_set1_ps(q[16 * c + l + 8]);
                const float *ka = kt + (int64_t)(16 * c + l) * KB, *kb = ka + 8 * KB;
                for (int g = 0; g < NG; g++) {
                    a[g] = _mm512_fmadd_ps(qa, _mm512_load_ps(ka + 16 * g), a[g]);
                    b[g] = _mm512_fmadd_ps(qb, _mm512_load_ps(kb + 16 * g), b[g]);
                }
            }
            for (int g = 0; g < NG; g++) h[e][g] = _mm512_add_ps(a[g], b[g]);
        }
        for (int g = 0; g < NG; g++) p[m][g] = _mm512_add_ps(h[0][g], h[1][g]);
    }
    for (int g = 0; g < NG; g++)
        _mm512_store_ps(pr + 16 * g, _mm512_mul_ps(_mm512_add_ps(_mm512_add_ps(p[0][g], p[1][g]),
                                                                 _mm512_add_ps(p[2][g], p[3][g])), _mm512_set1_ps(scale)));
}

// o[n] += pr[n][j] * value j for the keys j in [b, stop[n]) of nonzero weight, in key order, for N rows (1 or 2):
// each value's vectors are loaded once for the rows that weigh it (values of the block from b on at vb)
static inline __attribute__((always_inline)) void weigh_rows(float *const *o, const float *const *pr, const int *stop,
                                                             const void *vb, int b, int hd, const int N, const int HV,
                                                             const int BF) {
    __m512 acc[2][MAX_HV];
    for (int n = 0; n < N; n++)
        for (int c = 0; c < HV; c++) acc[n][c] = _mm512_loadu_ps(o[n] + 16 * c);
    const int end = N == 2 && stop[1] > stop[0] ? stop[1] : stop[0];
    for (int j = b; j < end; j++) {
        float w[2] = {0.0f, 0.0f};
        for (int n = 0; n < N; n++) w[n] = j < stop[n] ? pr[n][j] : 0.0f;
        if (w[0] == 0.0f && w[1] == 0.0f) continue;
        __m512 v[MAX_HV];
        for (int c = 0; c < HV; c++) v[c] = load_at(vb, (int64_t)(j - b) * hd + 16 * c, BF);
        for (int n = 0; n < N; n++)
            if (w[n] != 0.0f) {
                const __m512 wn = _mm512_set1_ps(w[n]);
                for (int c = 0; c < HV; c++) acc[n][c] = _mm512_fmadd_ps(wn, v[c], acc[n][c]);
            }
    }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < HV; c++) _mm512_storeu_ps(o[n] + 16 * c, acc[n][c]);
}

// The same for N buffered rows (1 or 2) of float32 values over the keys [b, end), their weights zero past their
// spans: a weight of 0 leaves a row's sums as they are (a masked multiply-add, as if the key were skipped), so no
// branch per key and row (with those, two or four rows at a time ran slower than one).
static inline __attribute__((always_inline)) void weigh_group(float *const *o, const float *const *pr, int b, int end,
                                                              const float *vb, int hd, const int N, const int HV) {
    __m512 acc[2][MAX_HV];
    for (int n = 0; n < N; n++)
        for (int c = 0; c < HV; c++) acc[n][c] = _mm512_loadu_ps(o[n] + 16 * c);
    for (int j = b; j < end; j++) {
        __m512 v[MAX_HV];
        for (int c = 0; c < HV; c++) v[c] = _mm512_loadu_ps(vb + (int64_t)(j - b) * hd + 16 * c);
        for (int n = 0; n < N; n++) {
            const __m512 w = _mm512_set1_ps(pr[n][j]);
            const __mmask16 live = _mm512_cmpneq_ps_mask(w, _mm512_setzero_ps());
            for (int c = 0; c < HV; c++) acc[n][c] = _mm512_mask3_fmadd_ps(w, v[c], acc[n][c], live);
        }
    }
    for (int n = 0; n < N; n++)
        for (int c = 0; c < HV; c++) _mm512_storeu_ps(o[n] + 16 * c, acc[n][c]);
}

// One kv head g of attend512 (below); HV = hd / 16 and KV16 (bf16 keys and values) are constants at
// each call site, so the query rows and the accumulators stay in registers. Query rows r0 .. r1 of the
// kv head (row r = t * H/Hkv + i: token t, query head g * H/Hkv + i). A block of KB keys (then values) is
// widened to float32 once (block_f32; keys transposed, block_t32, for TRANSPOSED_ROWS rows or more), then each of
// the rows goes through it: a row costs its products, not a conversion of every key it reads. These buffered rows
// score one by one (in pairs they ran slower) and weigh values in pairs (weigh_group). A task of DIRECT_ROWS
// rows or fewer (BF) widens each key in registers instead, two rows at a time where HV is 4 (each key widened once
// for both; both rows' registers fit). Without a mask a row scores only the keys up to its own (a prefill's rows
// skip the keys after them): those past it would weigh exactly 0, so the result is the same.
static inline __attribute__((always_inline)) void attend_head(
        const float *q, int qs, const void *kc, const void *vc, int max_len, int start, int kv_len,
        const uint8_t *mask, int ms, int H, int Hkv, int hd, float *out, int g, int r0, int r1, const int HV,
        const int KV16, const int BF) {
    const int G = H / Hkv, R = r1 - r0, P = (kv_len + 15) / 16 * 16;
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t kv0 = (int64_t)g * max_len * hd;               // this head's keys and values
    float *p = aligned_alloc(64, sizeof(float) * (R + 1) * P);    // scores of row r0 + r at p + r * P
    float *f = BF ? NULL : aligned_alloc(64, sizeof(float) * KB * hd);   // a block of keys (transposed) or values
    float *inv = malloc(sizeof(float) * R);
    int *span = malloc(sizeof(int) * (R + 1)), most = 0;   // row r sees keys [0, span[r]) (a multiple of 16); most: any row
    #define Q_ROW(r) (q + (int64_t)((r0 + (r)) / G) * qs + (g * G + (r0 + (r)) % G) * hd)
    #define OUT_ROW(r) (out + (int64_t)((r0 + (r)) / G) * H * hd + (g * G + (r0 + (r)) % G) * hd)
    #define TWO(r) (HV == 4 && (r) + 1 < R)                    // rows r and r + 1 together: weighing buffered
    #define PAIR(r) (BF && TWO(r))                               // rows, and every phase of direct ones
    for (int r = 0; r < R; r++) {
        const int last = start + (r0 + r) / G, seen = mask || last + 1 > kv_len ? kv_len : last + 1;
        span[r] = (seen + 15) / 16 * 16;
        if (span[r] > most) most = span[r];
    }
    span[R] = 0;
    for (int b = 0; b < most; b += KB) {                         // scores, -inf where not seen
        if (!BF && R >= TRANSPOSED_ROWS) {                       // the block's keys transposed once for every row
            block_t32(kc, kv0, b, b + KB < kv_len ? b + KB : kv_len, hd, f, KV16);
            for (int r = 0; r < R; r++) {
                const int t = (r0 + r) / G, groups = ((span[r] < b + KB ? span[r] : b + KB) - b) / 16;
                float *pr = p + (int64_t)r * P + b;
                switch (groups) {
                    case 1: score_row_t(Q_ROW(r), f, scale, pr, 1, HV); break;
                    case 2: score_row_t(Q_ROW(r), f, scale, pr, 2, HV); break;
                    case 3: score_row_t(Q_ROW(r), f, scale, pr, 3, HV); break;
                    case 4: score_row_t(Q_ROW(r), f, scale, pr, 4, HV); break;
                }
                for (int j0 = b; j0 < b + 16 * groups; j0 += 8)
                    hide8(p + (int64_t)r * P + j0, mask ? mask + (int64_t)t * ms : NULL, j0, kv_len, start + t);
            }
            continue;
        }
        const void *kb = BF ? (const void *)((const uint16_t *)kc + kv0 + (int64_t)b * hd)   // key j at (j - b) * hd
                            : block_f32(kc, kv0, b, b + KB < kv_len ? b + KB : kv_len, hd, f, KV16);
        for (int r = 0; r < R; r += 1 + PAIR(r)) {
            const int N = 1 + PAIR(r), t[2] = {(r0 + r) / G, (r0 + r + N - 1) / G};
            const int stop = span[r + N - 1] > span[r] ? span[r + N - 1] : span[r];
            __m512 qv[2 * MAX_HV];
            for (int n = 0; n < N; n++)
                for (int c = 0; c < HV; c++) qv[n * HV + c] = _mm512_loadu_ps(Q_ROW(r + n) + 16 * c);
            for (int j0 = b; j0 < b + KB && j0 < stop; j0 += 8) {
                float *pr[2] = {p + (int64_t)r * P + j0, p + (int64_t)(r + N - 1) * P + j0};
                if (N == 2) score_rows(qv, kb, (int64_t)(j0 - b) * hd, hd, kv_len - j0, scale, pr, 2, HV, BF);
                else score_rows(qv, kb, (int64_t)(j0 - b) * hd, hd, kv_len - j0, scale, pr, 1, HV, BF);
                for (int n = 0; n < N; n++) hide8(pr[n], mask ? mask + (int64_t)t[n] * ms : NULL, j0, kv_len, start + t[n]);
            }
        }
    }
    for (int r = 0; r < R; r++) {
        inv[r] = softmax_row(p + (int64_t)r * P, span[r], p + (int64_t)R * P);
        if (!BF) memset(p + (int64_t)r * P + span[r], 0, sizeof(float) * (P - span[r]));   // weigh_group's pair reads
        for (int c = 0; c < HV; c++) _mm512_storeu_ps(OUT_ROW(r) + 16 * c, _mm512_setzero_ps());
    }
    for (int b = 0; b < kv_len && b < most; b += KB) {           // out += weights . values, in key order,
        int end = b + KB < kv_len ? b + KB : kv_len;             // skipping masked keys (weight exactly 0)
        const void *vb = BF ? (const void *)((const uint16_t *)vc + kv0 + (int64_t)b * hd)
                            : block_f32(vc, kv0, b, end, hd, f, KV16);     // vb: float32 where !BF
        for (int r = 0; r < R; r += 1 + TWO(r)) {
            const int N = 1 + TWO(r);
            float *o[2] = {OUT_ROW(r), OUT_ROW(r + N - 1)};
            const float *pr[2] = {p + (int64_t)r * P, p + (int64_t)(r + N - 1) * P};
            int stop[2];                                         // each row's unseen keys weigh 0: skipped
            for (int n = 0; n < 2; n++) stop[n] = end < span[r + n] ? end : span[r + n];
            if (!BF) {
                const int seen = stop[N - 1] > stop[0] ? stop[N - 1] : stop[0];
                if (N == 2) weigh_group(o, pr, b, seen, (const float *)vb, hd, 2, HV);
                else weigh_group(o, pr, b, seen, (const float *)vb, hd, 1, HV);
            } else if (N == 2) weigh_rows(o, pr, stop, vb, b, hd, 2, HV, BF);
            else weigh_rows(o, pr, stop, vb, b, hd, 1, HV, BF);
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < HV; c++)
            _mm512_storeu_ps(OUT_ROW(r) + 16 * c, _mm512_mul_ps(_mm512_loadu_ps(OUT_ROW(r) + 16 * c), _mm512_set1_ps(inv[r])));
    free(span);
    free(inv);
    free(f);
    free(p);
    #undef PAIR
    #undef TWO
    #undef Q_ROW
    #undef OUT_ROW
}

// avx2.c's attend with AVX-512, for head dims 64 and 128 (the caller checks). Same contract: M new tokens' rotated q [M, H*hd] (row stride qs) over kc/vc
// [Hkv, max_len, hd] (float32, or bf16 where kv16), positions [0, kv_len); token t sees key j where mask[t * ms + j] or, without
// a mask, j <= start + t; out [M, H*hd]. Per kv head, blocks of KB keys (and values) stay in L1
// while all M x H/Hkv query rows that use them go through, each row's q in registers. A query's
// result does not depend on M or kv_len: key j's score is summed by the same tree wherever it sits,
// masked keys weigh exactly 0 (and are skipped), and weighted values are summed in key order.
// attend512_head computes kv head g's query rows r0 .. r1; attend512 all of them. A task of at most DIRECT_ROWS rows
// (decoding: one or two) reads a bf16 cache where it is, widening each key and value in registers: widening every
// block into a buffer first cost more than so few rows' products. More rows share one widening. The same floats
// in the same order either way: the same results.
#define DIRECT_ROWS 2
void attend512_head(const float *q, int qs, const void *kc, const void *vc, int kv16, int max_len, int start,
                    int kv_len, const uint8_t *mask, int ms, int H, int Hkv, int hd, float *out, int g, int r0, int r1) {
    #define HEAD(HV, KV16, BF) attend_head(q, qs, kc, vc, max_len, start, kv_len, mask, ms, H, Hkv, hd, out, g, r0, r1, \
                                         HV, KV16, BF)
    const int direct = kv16 && r1 - r0 <= DIRECT_ROWS;
    if (hd == 64) { if (direct) HEAD(4, 1, 1); else if (kv16) HEAD(4, 1, 0); else HEAD(4, 0, 0); }
    else { if (direct) HEAD(8, 1, 1); else if (kv16) HEAD(8, 1, 0); else HEAD(8, 0, 0); }
    #undef HEAD
}

typedef struct {            // attend512's arguments, for its parallel tasks
    const float *q;
    int qs;
    const void *kc, *vc;
    int kv16, max_len, start, kv_len;
    const uint8_t *mask;
    int ms, M, H, Hkv, hd;
    float *out;
} Attention512;

static void attend512_heads(void *ctx, int64_t g0, int64_t g1) {
    const Attention512 *a = ctx;
    for (int g = g0; g < g1; g++)
        attend512_head(a->q, a->qs, a->kc, a->vc, a->kv16, a->max_len, a->start, a->kv_len, a->mask, a->ms, a->H,
                       a->Hkv, a->hd, a->out, g, 0, a->M * (a->H / a->Hkv));
}

void attend512(const float *q, int qs, const void *kc, const void *vc, int kv16, int max_len, int start, int kv_len,
               const uint8_t *mask, int ms, int M, int H, int Hkv, int hd, float *out) {
    Attention512 a = {q, qs, kc, vc, kv16, max_len, start, kv_len, mask, ms, M, H, Hkv, hd, out};
    parallel_for(Hkv, 1, attend512_heads, &a);
}

static inline __m512 load16_i8(const int8_t *p) {      // 16 int8 -> 16 float32 (exact)
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
}

// Rows m0 .. m0 + MB of i8_linear512 for the 8 weight rows wr (MB is 1 or 2, a constant at each call
// site): each 16-wide slice of the weights is converted once for both rows.
static inline __attribute__((always_inline)) void i8_rows(const float *x, int K, int K16, const int8_t *const *wr,
                                                          float *s, int m0, const int MB) {
    __m512 acc[2][8];
    for (int i = 0; i < MB; i++)
        for (int c = 0; c < 8; c++) acc[i][c] = _mm512_setzero_ps();
    for (int k = 0; k < K16; k += 16) {
        __m512 xv[2];
        for (int i = 0; i < MB; i++) xv[i] = _mm512_loadu_ps(x + (int64_t)(m0 + i) * K + k);
        for (int c = 0; c < 8; c++) {
            __m512 wv = load16_i8(wr[c] + k);
            for (int i = 0; i < MB; i++) acc[i][c] = _mm512_fmadd_ps(wv, xv[i], acc[i][c]);
        }
    }
    for (int i = 0; i < MB; i++) _mm256_storeu_ps(s + 8 * i, hsum8x16(acc[i]));
}

// avx2.c's i8_linear with AVX-512: y[M,N] = x[M,K] . (scale * w)[N,K]^T (+ bias[N]) for int8 weights
// with a float32 scale per output row (draft models). 8 output columns at a time share each 16-wide
// slice of x (two rows of x share each converted slice of weights), and one transposing sum finishes
// all 8; every output is summed the same way whatever M is (and wherever its column sits in a block).
typedef struct {            // a product's arguments, for its parallel tasks
    const float *x;
    int M, K;
    const void *w;
    const float *scale;
    int N;
    const float *bias;
    float *y;
    const uint32_t *xp;     // dp_linear: x as bf16 pairs
} Product512;

static void i8_columns(void *ctx, int64_t t0, int64_t t1) {       // tasks t0..t1 of 8 output columns
    const Product512 *p = ctx;
    const float *x = p->x, *scale = p->scale, *bias = p->bias;
    const int8_t *w = p->w;
    const int M = p->M, K = p->K, N = p->N, K16 = K / 16 * 16;
    float *y = p->y;
    for (int n0 = 8 * t0; n0 < 8 * t1 && n0 < N; n0 += 8) {
        const int8_t *wr[8];                               // past N: row N - 1 again, its result dropped
        for (int c = 0; c < 8; c++) wr[c] = w + (int64_t)(n0 + c < N ? n0 + c : N - 1) * K;
        for (int m0 = 0; m0 < M; m0 += 2) {
            float s[16];
            if (M - m0 >= 2) i8_rows(x, K, K16, wr, s, m0, 2);
            else i8_rows(x, K, K16, wr, s, m0, 1);
            for (int i = 0; i < 2 && m0 + i < M; i++) {
                const float *xr = x + (int64_t)(m0 + i) * K;
                for (int c = 0; c < 8 && n0 + c < N; c++) {
                    float v = s[8 * i + c];
                    for (int k = K16; k < K; k++) v += (float)wr[c][k] * xr[k];
                    y[(int64_t)(m0 + i) * N + n0 + c] = v * scale[n0 + c] + (bias ? bias[n0 + c] : 0.0f);
                }
            }
        }
    }
}

void i8_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                  float *y) {
    Product512 p = {x, M, K, w, scale, N, bias, y, NULL};
    parallel_for((N + 7) / 8, 1, i8_columns, &p);
}

// dp_linear: y[M,N] = bf16(x)[M,K] . w[N,K]^T (+ bias[N]) with AVX512-BF16's dot product (vdpbf16ps: 16
//   float32 lanes, each += two bf16 products), for CPUs with AVX512-BF16 but no AMX.
//   A step loads the packed weights of 64 output columns (4 x 64 bytes: 16 columns x 2 of K each) and
//   serves up to 6 rows of x with them, each row's pair of x broadcast once for all four (a broadcast
//   takes a vector slot as a product does: 6 of them feed 24 products, where 2 columns blocks and 12 rows
//   had 12 feed 24); 1 to 16 rows cost one pass over the weights from memory (the rest of a block's rows
//   read it again from L2), and a verification of 16 tokens is bound by compute, not by 16 passes. x is rounded to
//   bf16 (nearest even) once; each output accumulates in float32 over the pairs of K in order, one chain,
//   the same way whatever M is: a row's result never depends on the other rows.
// The weights are pre-packed (kernels.DPLinear) as w[NB][KP][16][2]: block nb of 16 output columns, K pair
//   kp, then w[16 nb + j][2 kp + e] at [j][e] (zeros past N and K).
#define DP_ROWS 6
#define DP_COLS 4                       // blocks of 16 columns a step loads: 4 loads and 6 broadcasts feed 24 products

static inline __attribute__((always_inline)) void dp_rows(const uint32_t *xp, int KP, const uint16_t *wb,
                                                          int64_t next, float *out, const int MB, const int NC) {
    __m512 acc[DP_ROWS][DP_COLS];
    for (int i = 0; i < MB; i++)
        for (int c = 0; c < NC; c++) acc[i][c] = _mm512_setzero_ps();
    for (int kp = 0; kp < KP; kp++) {
        __m512bh w[DP_COLS];
        for (int c = 0; c < NC; c++) w[c] = (__m512bh)_mm512_loadu_si512(wb + c * next + (int64_t)kp * 32);
        for (int i = 0; i < MB; i++) {
            __m512bh xv = (__m512bh)_mm512_set1_epi32((int)xp[(int64_t)i * KP + kp]);
            for (int c = 0; c < NC; c++) acc[i][c] = _mm512_dpbf16_ps(acc[i][c], xv, w[c]);
        }
    }
    for (int i = 0; i < MB; i++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + 16 * DP_COLS * i + 16 * c, acc[i][c]);
}

#define DP_NC(n, nc) case nc: dp_rows(xm, KP, wb, next, out, n, nc); break;
#define DP_CASE(n) case n: switch (nc) { DP_NC(n, 1) DP_NC(n, 2) DP_NC(n, 3) default: DP_NC(n, 4) } break;

static void dp_columns(void *ctx, int64_t t0, int64_t t1) {       // tasks t0..t1 of DP_COLS blocks of 16 columns
    const Product512 *p = ctx;
    const uint16_t *w = p->w;
    const uint32_t *xp = p->xp;
    const float *bias = p->bias;
    const int M = p->M, N = p->N, KP = (p->K + 1) / 2, NB = (N + 15) / 16;
    const int64_t next = (int64_t)KP * 32;                            // bf16 elements per block of 16 columns
    float *y = p->y;
    for (int nb = DP_COLS * t0; nb < DP_COLS * t1 && nb < NB; nb += DP_COLS) {
        const uint16_t *wb = w + nb * next;
        const int nc = NB - nb < DP_COLS ? NB - nb : DP_COLS;
        const int cols = N - 16 * nb < 16 * DP_COLS ? N - 16 * nb : 16 * DP_COLS;
        float out[DP_ROWS * 16 * DP_COLS] __attribute__((aligned(64)));
        for (int m0 = 0; m0 < M; m0 += DP_ROWS) {
            const int mb = M - m0 < DP_ROWS ? M - m0 : DP_ROWS;
            const uint32_t *xm = xp + (int64_t)m0 * KP;
            switch (mb) {
                DP_CASE(1) DP_CASE(2) DP_CASE(3) DP_CASE(4) DP_CASE(5) default: DP_CASE(6)
            }
            store_tile(out, 16 * DP_COLS, mb, cols, bias, y, N, m0, 16 * nb);
        }
    }
}

void dp_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y) {
    const int KP = (K + 1) / 2, NB = (N + 15) / 16, MB = (M + 15) / 16;
    uint32_t *xp = malloc(sizeof(uint32_t) * (int64_t)MB * 16 * KP);  // x as bf16 pairs, row by row (a zero pads odd K)
    for (int mb = 0; mb < MB; mb++)
        to_bf16(x + (int64_t)mb * 16 * K, M - mb * 16 < 16 ? M - mb * 16 : 16, K, 2 * KP,
                (uint16_t *)(xp + (int64_t)mb * 16 * KP));
    Product512 p = {x, M, K, w, NULL, N, bias, y, xp};
    parallel_for((NB + DP_COLS - 1) / DP_COLS, 1, dp_columns, &p);
    free(xp);
}

// fma512_linear: fma_linear (csrc/avx2.c) on 512-bit FMA, for CPUs with AVX-512 whose dot product does not pay
//   (kernels.dp_lib): an Intel core without AMX runs vdpbf16ps (32 products) at a quarter of the rate of its two
//   512-bit FMA units (16 each), so FMA on the widened weights multiplies twice as fast (docs/kernels.md). Same
//   layout (dp_pack's) and the same arithmetic as fma_linear: a 64-byte load holds 16 columns' pairs (k, k + 1),
//   shifted left by 16 their weights at k as float32, masked their weights at k + 1; each row's x[k] (float32,
//   not rounded) is broadcast and FMA'd into 16 columns at once, one chain per output over k in order, so its
//   results are fma_linear's bit for bit, whatever M is. A pass serves up to 6 rows from 4 blocks of 16 columns,
//   or 7 to 12 rows from 2 blocks (24 accumulators, the converted weights and a broadcast in the 32 registers);
//   the weights at k + 1 are loaded again (from L1). Tried: 16 rows from 1 block (load-bound: 4.6 ms against
//   3.9 for the model's linears), passes of equal rows (16 = 8 + 8: 4.2 ms), x copied as [k][row] so that the
//   broadcasts read from one pointer (10% slower).
#define FMA512_ROWS 12

static inline __attribute__((always_inline)) void fma512_half(__m512 acc[][DP_COLS], const float *x, int K, int k,
                                                             const uint16_t *wb, int64_t next, int kp, const int odd,
                                                             const int MB, const int NC) {
    __m512 w[DP_COLS];
    for (int c = 0; c < NC; c++) {
        __m512i p = _mm512_loadu_si512(wb + c * next + (int64_t)kp * 32);
        w[c] = _mm512_castsi512_ps(odd ? _mm512_and_si512(p, _mm512_set1_epi32((int)0xFFFF0000u))
                                       : _mm512_slli_epi32(p, 16));
    }
    for (int i = 0; i < MB; i++) {
        __m512 xv = _mm512_set1_ps(x[(int64_t)i * K + k]);
        for (int c = 0; c < NC; c++) acc[i][c] = _mm512_fmadd_ps(w[c], xv, acc[i][c]);
    }
}

// out[i][16 c + j] for MB rows and NC blocks of 16 columns (MB x NC <= 24 accumulators)
static inline __attribute__((always_inline)) void fma512_rows(const float *x, int K, const uint16_t *wb, int64_t next,
                                                             float *out, const int MB, const int NC) {
    __m512 acc[FMA512_ROWS][DP_COLS];
    for (int i = 0; i < MB; i++)
        for (int c = 0; c < NC; c++) acc[i][c] = _mm512_setzero_ps();
    int kp = 0;
    for (; 2 * kp + 1 < K; kp++) {
        fma512_half(acc, x, K, 2 * kp, wb, next, kp, 0, MB, NC);
        fma512_half(acc, x, K, 2 * kp + 1, wb, next, kp, 1, MB, NC);
    }
    if (K % 2) fma512_half(acc, x, K, K - 1, wb, next, kp, 0, MB, NC);
    for (int i = 0; i < MB; i++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + 16 * DP_COLS * i + 16 * c, acc[i][c]);
}

// up to 6 rows: the 4 blocks of 16 columns in one pass; 7 to 12 rows: 2 blocks at a time
#define FMA512_NC(n, nc) case nc: fma512_rows(xm, K, wb, next, out, n, nc); break;
#define FMA512_CASE(n) case n: switch (nc) { FMA512_NC(n, 1) FMA512_NC(n, 2) FMA512_NC(n, 3) default: FMA512_NC(n, 4) } break;
#define FMA512_WIDE(n) case n: for (int h = 0; h < nc; h += 2) { \
        const uint16_t *wb = w + (nb + h) * next; float *out = o + 16 * h; \
        if (nc - h == 1) fma512_rows(xm, K, wb, next, out, n, 1); else fma512_rows(xm, K, wb, next, out, n, 2); \
    } break;

static void fma512_columns(void *ctx, int64_t t0, int64_t t1) {   // tasks t0..t1 of DP_COLS blocks of 16 columns
    const Product512 *p = ctx;
    const uint16_t *w = p->w;
    const float *bias = p->bias;
    const int M = p->M, K = p->K, N = p->N, NB = (N + 15) / 16;
    const int64_t next = (int64_t)(K + 1) / 2 * 32;                   // bf16 elements per block of 16 columns
    float *y = p->y;
    for (int nb = DP_COLS * t0; nb < DP_COLS * t1 && nb < NB; nb += DP_COLS) {
        const uint16_t *wb = w + nb * next;
        const int nc = NB - nb < DP_COLS ? NB - nb : DP_COLS;
        const int cols = N - 16 * nb < 16 * DP_COLS ? N - 16 * nb : 16 * DP_COLS;
        float o[FMA512_ROWS * 16 * DP_COLS] __attribute__((aligned(64))), *out = o;
        for (int m0 = 0; m0 < M; m0 += FMA512_ROWS) {
            const int mb = M - m0 < FMA512_ROWS ? M - m0 : FMA512_ROWS;
            const float *xm = p->x + (int64_t)m0 * K;
            switch (mb) {
                FMA512_CASE(1) FMA512_CASE(2) FMA512_CASE(3) FMA512_CASE(4) FMA512_CASE(5) FMA512_CASE(6)
                FMA512_WIDE(7) FMA512_WIDE(8) FMA512_WIDE(9) FMA512_WIDE(10) FMA512_WIDE(11) default: FMA512_WIDE(12)
            }
            store_tile(o, 16 * DP_COLS, mb, cols, bias, y, N, m0, 16 * nb);
        }
    }
}

void fma512_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y) {
    Product512 p = {x, M, K, w, NULL, N, bias, y, NULL};
    parallel_for((N + 16 * DP_COLS - 1) / (16 * DP_COLS), 1, fma512_columns, &p);
}

// mac_rate: multiply-adds a nanosecond that one core does in a register loop of vdpbf16ps (dot = 1: 32 a
//   instruction) or of 512-bit FMA (dot = 0: 16), 24 independent chains, ~0.1-0.4 ms: which of dp_linear and
//   fma512_linear multiplies faster on this core (kernels.dp_lib): a core with two 512-bit FMA units runs FMA at
//   twice the rate of vdpbf16ps, one with a single unit (or split 256-bit ones) at the same.
double mac_rate(int dot) {
    __m512 acc[24];
    for (int i = 0; i < 24; i++) acc[i] = _mm512_setzero_ps();
    __m512 a = _mm512_castsi512_ps(_mm512_set1_epi32(0x3F803F80));    // bf16 1.0 twice; as float32 1.0019: no
                                                                        // infinities or denormals in either loop
    struct timespec t0, t1;
    const int n = 10000;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int r = 0; r < n; r++) {
        __asm__ volatile("" : "+v"(a));             // keeps the loop from being folded
        if (dot) {
#pragma GCC unroll 24
            for (int i = 0; i < 24; i++) acc[i] = _mm512_dpbf16_ps(acc[i], (__m512bh)a, (__m512bh)a);
        } else {
#pragma GCC unroll 24
            for (int i = 0; i < 24; i++) acc[i] = _mm512_fmadd_ps(acc[i], a, a);
        }
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    for (int i = 1; i < 24; i++) acc[0] = _mm512_add_ps(acc[0], acc[i]);
    volatile float sink = _mm512_reduce_add_ps(acc[0]);
    (void)sink;
    const double ns = (t1.tv_sec - t0.tv_sec) * 1e9 + (t1.tv_nsec - t0.tv_nsec);
    return (dot ? 32.0 : 16.0) * 24 * n / ns;
}

// q8_linear: y[M,N] = x[M,K] . w[N,K]^T (+ bias) for `--quant int8` (GGUF's Q8_0 x Q8_0, as llama.cpp
//   computes it on CPU): w is int8 with a float32 scale per output column and block of 32 of K; each row
//   of x is quantized the same way (per block of 32: d = max|x| / 127, q = round(x / d), nearest even),
//   and a block's 32 products run in int32 on AVX512-VNNI's vpdpbusd (unsigned x bytes: q + 128, the
//   128 taken out again through each column's block sum), then y += d_w d_x . dot in float32, block by
//   block in order. One pass over the weights (half the bytes of bf16) serves up to Q8_ROWS rows; a row's
//   result never depends on the others.
// Packed (kernels.Q8Linear): w[NB][QB * 8][16][4] (block nb of 16 columns, K quad, column j, 4 of K;
//   QB blocks of 32 of K) and sw[NB][QB][32] of 32 bits: the block's 16 column scales, then their -128 * sum(w) as int32.
#define Q8_ROWS 6

// xs[m * QB + b] (where xs is given): the block's d_x * sum(q_x), what a Q4_1 block's minimum multiplies
static void quantize_rows(const float *x, int M, int K, int QB, uint8_t *xq, float *xd, float *xs) {
    for (int m = 0; m < M; m++)
        for (int b = 0; b < QB; b++) {
            float v[32] __attribute__((aligned(64))) = {0};
            int n = K - 32 * b < 32 ? K - 32 * b : 32;
            memcpy(v, x + (int64_t)m * K + 32 * b, sizeof(float) * n);
            __m512 lo = _mm512_load_ps(v), hi = _mm512_load_ps(v + 16);
            float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(lo), _mm512_abs_ps(hi)));
            float inv = amax > 0 ? 127.0f / amax : 0.0f;
            xd[(int64_t)m * QB + b] = amax / 127.0f;
            int sum = 0;
            for (int h = 0; h < 2; h++) {
                __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(h ? hi : lo, _mm512_set1_ps(inv)));   // nearest even
                q = _mm512_max_epi32(_mm512_min_epi32(q, _mm512_set1_epi32(127)), _mm512_set1_epi32(-127));
                sum += _mm512_reduce_add_epi32(q);
                q = _mm512_add_epi32(q, _mm512_set1_epi32(128));
                _mm_storeu_si128((__m128i *)(xq + (int64_t)m * QB * 32 + 32 * b + 16 * h), _mm512_cvtepi32_epi8(q));
            }
            if (xs) xs[(int64_t)m * QB + b] = (float)sum * (amax / 127.0f);
        }
}

// The weights of 16 columns for two K quads (s and s + 1 of a block: 2 x 16 x 4) as signed bytes: for
// Q8_0 two loads; for Q4 one load of 64 bytes, quad s in the low nibbles and s + 1 in the high ones, each
// stored as q + 8 (0..15).
static inline __attribute__((always_inline)) void quad_pair(const int8_t *w, int64_t at, const int BITS,
                                                             __m512i *lo, __m512i *hi) {
    if (BITS == 8) {
        *lo = _mm512_loadu_si512(w + 2 * at);
        *hi = _mm512_loadu_si512(w + 2 * at + 64);
        return;
    }
    const __m512i v = _mm512_loadu_si512(w + at), nib = _mm512_set1_epi8(0x0F), eight = _mm512_set1_epi8(8);
    *lo = _mm512_sub_epi8(_mm512_and_si512(v, nib), eight);
    *hi = _mm512_sub_epi8(_mm512_and_si512(_mm512_srli_epi16(v, 4), nib), eight);
}

static inline __attribute__((always_inline)) void q8_rows(const uint8_t *xq, const float *xd, const float *xs, int QB,
                                                          const int8_t *wb, const float *sb, int64_t next, float *out,
                                                          const int MB, const int NC, const int BITS, const int MINS) {
    const int SW = 32 + 16 * MINS;                             // scale words per block of 16 columns and 32 of K
    __m512 acc[Q8_ROWS][2];
    for (int i = 0; i < MB; i++)
        for (int c = 0; c < NC; c++) acc[i][c] = _mm512_setzero_ps();
    for (int b = 0; b < QB; b++) {
        __m512i dot[Q8_ROWS][2];
        __m512 sw[2];
        for (int c = 0; c < NC; c++) {
            const float *s = sb + c * (int64_t)QB * SW + SW * b;
            sw[c] = _mm512_loadu_ps(s);
            __m512i neg = _mm512_loadu_si512(s + 16);          // -128 * the block's column sums
            for (int i = 0; i < MB; i++) dot[i][c] = neg;
        }
        for (int s = 0; s < 8; s += 2) {
            __m512i w[2][2];
            for (int c = 0; c < NC; c++) quad_pair(wb + c * next, ((int64_t)b * 8 + s) * 32, BITS, &w[c][0], &w[c][1]);
            for (int i = 0; i < MB; i++) {
                const uint8_t *xs = xq + (int64_t)i * QB * 32 + 32 * b + 4 * s;
                __m512i x0 = _mm512_set1_epi32(*(const int32_t *)xs), x1 = _mm512_set1_epi32(*(const int32_t *)(xs + 4));
                for (int c = 0; c < NC; c++)
                    dot[i][c] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(dot[i][c], x0, w[c][0]), x1, w[c][1]);
            }
        }
        for (int i = 0; i < MB; i++) {
            __m512 dx = _mm512_set1_ps(xd[(int64_t)i * QB + b]);
            for (int c = 0; c < NC; c++)
                acc[i][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot[i][c]), _mm512_mul_ps(sw[c], dx), acc[i][c]);
            if (MINS) {                                            // + m_w * d_x * sum(q_x), the block's offset
                __m512 sx = _mm512_set1_ps(xs[(int64_t)i * QB + b]);
                for (int c = 0; c < NC; c++)
                    acc[i][c] = _mm512_fmadd_ps(_mm512_loadu_ps(sb + c * (int64_t)QB * SW + SW * b + 32), sx, acc[i][c]);
            }
        }
    }
    for (int i = 0; i < MB; i++)
        for (int c = 0; c < NC; c++) _mm512_storeu_ps(out + 32 * i + 16 * c, acc[i][c]);
}

#define Q8_CASE(n) case n: if (nc == 2) q8_rows(xm, dm, sm, QB, wb, sb, next, out, n, 2, BITS, MINS); \
                           else q8_rows(xm, dm, sm, QB, wb, sb, next, out, n, 1, BITS, MINS); break;

// output columns 16 nb .. 16 nb + 31 for every row, Q8_ROWS rows per pass over their weights
static inline __attribute__((always_inline)) void q8_columns(const uint8_t *xq, const float *xd, const float *xs,
                                                             int M, int QB, const int8_t *w, const float *scale,
                                                             int nb, int N, const float *bias, float *y,
                                                             const int BITS, const int MINS) {
    const int NB = (N + 15) / 16, SW = 32 + 16 * MINS;
    const int64_t next = (int64_t)QB * 32 * 16 * BITS / 8;            // weight bytes per block of 16 columns
    const int8_t *wb = w + nb * next;
    const float *sb = scale + (int64_t)nb * QB * SW;
    const int nc = NB - nb < 2 ? 1 : 2, cols = N - 16 * nb < 32 ? N - 16 * nb : 32;
    float out[Q8_ROWS * 32] __attribute__((aligned(64)));
    for (int m0 = 0; m0 < M; m0 += Q8_ROWS) {
        const int mb = M - m0 < Q8_ROWS ? M - m0 : Q8_ROWS;
        const uint8_t *xm = xq + (int64_t)m0 * QB * 32;
        const float *dm = xd + (int64_t)m0 * QB, *sm = MINS ? xs + (int64_t)m0 * QB : NULL;
        switch (mb) {
            Q8_CASE(1) Q8_CASE(2) Q8_CASE(3) Q8_CASE(4) Q8_CASE(5) default: Q8_CASE(6)
        }
        store_tile(out, 32, mb, cols, bias, y, N, m0, 16 * nb);
    }
}

typedef struct {            // quant_linear's arguments, for its parallel tasks
    const uint8_t *xq;
    const float *xd, *xs;
    int M, QB;
    const int8_t *w;
    const float *scale;
    int N;
    const float *bias;
    float *y;
} QuantProduct512;

// One task function per kind, so that each has BITS and MINS as constants (as csrc/avx2.c's quant_linear).
#define COLUMN_PAIRS(NAME, BITS, MINS)                                                                         \
    static void NAME(void *ctx, int64_t t0, int64_t t1) {                                                      \
        const QuantProduct512 *a = ctx;                                                                        \
        for (int nb = 2 * t0; nb < 2 * t1 && nb < (a->N + 15) / 16; nb += 2)                                   \
            q8_columns(a->xq, a->xd, a->xs, a->M, a->QB, a->w, a->scale, nb, a->N, a->bias, a->y, BITS, MINS);  \
    }
COLUMN_PAIRS(q8_pairs, 8, 0)
COLUMN_PAIRS(q4_pairs, 4, 0)
COLUMN_PAIRS(q41_pairs, 4, 1)

static void quant_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                         float *y, int bits, int mins) {
    const int QB = (K + 31) / 32;
    uint8_t *xq = malloc((int64_t)M * QB * 32);
    float *xd = malloc(sizeof(float) * (int64_t)M * QB), *xs = mins ? malloc(sizeof(float) * (int64_t)M * QB) : NULL;
    quantize_rows(x, M, K, QB, xq, xd, xs);
    QuantProduct512 a = {xq, xd, xs, M, QB, w, scale, N, bias, y};
    parallel_for((N + 31) / 32, 1, bits == 8 ? q8_pairs : !mins ? q4_pairs : q41_pairs, &a);
    free(xq);
    free(xd);
    free(xs);
}

void q8_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                  float *y) {
    quant_linear(x, M, K, w, scale, N, bias, y, 8, 0);
}

// q4_linear: q8_linear for 4-bit weights (`--quant int4`, GGUF's Q4_0 values: q in -8..7 per block of 32 with a
//   float32 scale), packed (kernels.Q4Linear) as w[NB][QB * 4][16][4] bytes: block nb of 16 columns, pair p of K
//   quads, column j, e: q[16 nb + j][8 p + e] + 8 in the low nibble and q[16 nb + j][8 p + 4 + e] + 8 in the high
//   one; sw as q8_linear's. Each 64-byte load yields two quads' signed bytes (mask, shift, subtract 8),
//   then the same int32 dot products: half q8_linear's bytes, and a row's result never depends on the others.
void q4_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                  float *y) {
    quant_linear(x, M, K, w, scale, N, bias, y, 4, 0);
}

// q41_linear: q4_linear for GGUF's Q4_1 blocks as they are (w = d q + m, q in 0..15): the nibbles hold q itself,
//   which the kernel reads as q - 8, so each block's offset is m' = m + 8 d; sw[NB][QB][48]: the 16 column scales,
//   -128 * their sums of (q - 8), then the 16 m'. y += d_w d_x dot + m' (d_x sum(q_x)) block by block, as
//   llama.cpp computes Q4_1 x Q8_1.
void q41_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                   float *y) {
    quant_linear(x, M, K, w, scale, N, bias, y, 4, 1);
}

// Causal attention of a long forward (a prefill) on the tile unit, for head dim 64 and a bf16 cache:
// T new tokens' rotated q [T, H*64] (row stride qs, float32) over keys/values kc/vc [Hkv, max_len, 64]
// (bf16, positions [0, start + T)); token t sees key j where j <= start + t. out [T, H*64].
// Flash-style: per query head and block of 16 tokens, blocks of 64 keys: scores on tiles (q rounded to
// bf16), an online softmax in float32, then the value sum on tiles (probabilities rounded to bf16), as
// PyTorch's bf16 flash attention computes it. Transposed, so that the softmax needs no horizontal
// reduction: S^T = K Q^T puts one key's scores for the 16 queries in one vector, and O^T = V^T P^T.
// Per kv head, the keys are copied (zero past n) and the values transposed, once.
#define QB 16                                      // query tokens per block
#define KB2 64                                     // keys per block

// vt[d][j] = v[j][d] for the 64 dims and keys j < npad (zero past n): rows of V^T, A operands of O^T
static void transpose_values(const uint16_t *v, int n, int npad, uint16_t *vt) {
    uint16_t idx[2][32];                           // the low (dim d) or high (dim d + 1) halves of 32 words
    for (int i = 0; i < 32; i++) idx[0][i] = (uint16_t)(2 * i), idx[1][i] = (uint16_t)(2 * i + 1);
    const __m512i lo = _mm512_loadu_si512(idx[0]), hi = _mm512_loadu_si512(idx[1]);
    const __m512i rows = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32(32));          // key j's first dim pair, in pairs
    for (int j0 = 0; j0 < npad; j0 += 32) {
        __mmask16 live[2];
        for (int g = 0; g < 2; g++) {
            int left = n - j0 - 16 * g;
            live[g] = left >= 16 ? 0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
        }
        for (int p = 0; p < 32; p++) {             // dims 2p, 2p + 1 of keys j0 .. j0 + 31
            __m512i w[2];
            for (int g = 0; g < 2; g++)
                w[g] = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live[g],
                                                   _mm512_add_epi32(rows, _mm512_set1_epi32(p)),
                                                   (const int *)(v + (int64_t)(j0 + 16 * g) * 64), 4);
            _mm512_storeu_si512(vt + (int64_t)(2 * p) * npad + j0, _mm512_permutex2var_epi16(w[0], lo, w[1]));
            _mm512_storeu_si512(vt + (int64_t)(2 * p + 1) * npad + j0, _mm512_permutex2var_epi16(w[0], hi, w[1]));
        }
    }
}

// r[i][j] <-> r[j][i] for 16 rows of 16 32-bit words: per stage b = 8, 4, 2, 1, the off-diagonal b x b
// blocks of each 2b x 2b block trade places
static inline void transpose16(__m512i r[16]) {
    static const int32_t index[4][2][16] __attribute__((aligned(64))) = {   // [stage b = 8, 4, 2, 1][row i, i + b]
        {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}, {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31}},
        {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}, {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
        {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29}, {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
        {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30}, {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
    };
    for (int s = 0, b = 8; b >= 1; s++, b /= 2) {
        const __m512i ilo = _mm512_load_si512(index[s][0]), ihi = _mm512_load_si512(index[s][1]);
        for (int i = 0; i < 16; i++)
            if (!(i & b)) {
                __m512i a = r[i], c = r[i + b];
                r[i] = _mm512_permutex2var_epi32(a, ilo, c);
                r[i + b] = _mm512_permutex2var_epi32(a, ihi, c);
            }
    }
}

// Query head h's tokens t0 .. t0 + QB - 1 (those below T) over its kv head's keys k [npad, 64] and V^T vt.
static void attend_block(const float *q, int qs, const uint16_t *k, const uint16_t *vt, int npad, int start, int T,
                         int t0, int h, float *out, int H) {
    uint16_t qt[32][QB][2] __attribute__((aligned(64)));          // Q^T, dim pairs: B operands of S^T
    uint16_t pt[KB2 / 2][QB][2] __attribute__((aligned(64)));     // P^T, key pairs: B operands of O^T
    float st[KB2][QB] __attribute__((aligned(64))), pv[64][QB] __attribute__((aligned(64)));
    __m512 o[64];                                                  // O^T: per dim, the 16 queries
    const int rows = T - t0 < QB ? T - t0 : QB, n = start + T;
    for (int half = 0; half < 2; half++) {                         // qt[p][i] = query i's dims 2p, 2p + 1
        __m512i w[16];
        for (int i = 0; i < QB; i++) {
            const float *x = q + (int64_t)(t0 + i) * qs + h * 64 + 32 * half;
            w[i] = i < rows ? (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(x + 16), _mm512_loadu_ps(x))
                            : _mm512_setzero_si512();
        }
        transpose16(w);
        for (int p = 0; p < 16; p++) _mm512_store_si512(qt[16 * half + p], w[p]);
    }
    static const uint16_t pairs[32] __attribute__((aligned(64))) = {      // two keys' probabilities, interleaved
        0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30,
        15, 31};
    const __m512i interleave = _mm512_load_si512(pairs);
    // query i sees keys <= start + t0 + i (the rows past T: as the last token, and dropped)
    const __m512i iota = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
    const __m512i limit = _mm512_min_epi32(_mm512_add_epi32(iota, _mm512_set1_epi32(start + t0)),
                                           _mm512_set1_epi32(n - 1));
    const int first_limit = start + t0, last = start + t0 + rows - 1;
    const __m512 scale = _mm512_set1_ps(0.125f), neg_inf = _mm512_set1_ps(-INFINITY);   // 1 / sqrt(64)
    __m512 m = neg_inf, l = _mm512_setzero_ps();
    for (int d = 0; d < 64; d++) o[d] = _mm512_setzero_ps();
    _tile_loadd(4, &qt[0][0][0], 64);
    _tile_loadd(5, &qt[16][0][0], 64);
    for (int j0 = 0; j0 <= last; j0 += KB2) {
        const uint16_t *k0 = k + (int64_t)j0 * 64;              // A operands: 16 keys x 32 dims, rows 128 bytes apart
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_loadd(6, k0, 128);                _tile_dpbf16ps(0, 6, 4);
        _tile_loadd(7, k0 + 16 * 64, 128);      _tile_dpbf16ps(1, 7, 4);
        _tile_loadd(6, k0 + 32 * 64, 128);      _tile_dpbf16ps(2, 6, 4);
        _tile_loadd(7, k0 + 48 * 64, 128);      _tile_dpbf16ps(3, 7, 4);
        _tile_loadd(6, k0 + 32, 128);           _tile_dpbf16ps(0, 6, 5);
        _tile_loadd(7, k0 + 16 * 64 + 32, 128); _tile_dpbf16ps(1, 7, 5);
        _tile_loadd(6, k0 + 32 * 64 + 32, 128); _tile_dpbf16ps(2, 6, 5);
        _tile_loadd(7, k0 + 48 * 64 + 32, 128); _tile_dpbf16ps(3, 7, 5);
        _tile_stored(0, &st[0][0], 64); _tile_stored(1, &st[16][0], 64);
        _tile_stored(2, &st[32][0], 64); _tile_stored(3, &st[48][0], 64);
        const int masked = j0 + KB2 - 1 > first_limit;            // some query does not see every key here
        __m512 x[KB2], top[4] = {neg_inf, neg_inf, neg_inf, neg_inf};
        for (int j = 0; j < KB2; j++) {
            x[j] = _mm512_mul_ps(_mm512_load_ps(st[j]), scale);
            if (masked)
                x[j] = _mm512_mask_mov_ps(neg_inf, _mm512_cmp_epi32_mask(_mm512_set1_epi32(j0 + j), limit, _MM_CMPINT_LE),
                                          x[j]);
            top[j & 3] = _mm512_max_ps(top[j & 3], x[j]);
        }
        __m512 mnew = _mm512_max_ps(m, _mm512_max_ps(_mm512_max_ps(top[0], top[1]), _mm512_max_ps(top[2], top[3])));
        __m512 alpha = exp16(_mm512_sub_ps(m, mnew));              // 0 while m is -inf
        m = mnew;
        __m512 sum[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
        for (int j = 0; j < KB2; j += 2) {
            __m512 p0 = exp16(_mm512_sub_ps(x[j], m)), p1 = exp16(_mm512_sub_ps(x[j + 1], m));
            sum[0] = _mm512_add_ps(sum[0], p0);
            sum[1] = _mm512_add_ps(sum[1], p1);
            _mm512_store_si512(pt[j / 2], _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(p1, p0)));
        }
        l = _mm512_fmadd_ps(l, alpha, _mm512_add_ps(sum[0], sum[1]));
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        for (int half = 0; half < 2; half++) {                    // keys j0 + 32 half .. j0 + 32 half + 31
            _tile_loadd(4, &pt[16 * half][0][0], 64);
            const uint16_t *v0 = vt + j0 + 32 * half;
            _tile_loadd(5, v0, npad * 2);                 _tile_dpbf16ps(0, 5, 4);
            _tile_loadd(6, v0 + 16 * npad, npad * 2);     _tile_dpbf16ps(1, 6, 4);
            _tile_loadd(7, v0 + 32 * npad, npad * 2);     _tile_dpbf16ps(2, 7, 4);
            _tile_loadd(5, v0 + 48 * npad, npad * 2);     _tile_dpbf16ps(3, 5, 4);
        }
        _tile_stored(0, &pv[0][0], 64); _tile_stored(1, &pv[16][0], 64);
        _tile_stored(2, &pv[32][0], 64); _tile_stored(3, &pv[48][0], 64);
        for (int d = 0; d < 64; d++) o[d] = _mm512_fmadd_ps(o[d], alpha, _mm512_load_ps(pv[d]));
        _tile_loadd(4, &qt[0][0][0], 64);                          // Q^T again (tiles 4, 5 held P^T, V^T)
        _tile_loadd(5, &qt[16][0][0], 64);
    }
    const __m512 inv = _mm512_div_ps(_mm512_set1_ps(1.0f), l);
    for (int c = 0; c < 4; c++) {                                  // O = (O^T)^T, 16 dims at a time
        __m512i w[16];
        for (int d = 0; d < 16; d++) w[d] = _mm512_castps_si512(_mm512_mul_ps(o[16 * c + d], inv));
        transpose16(w);
        for (int i = 0; i < rows; i++)
            _mm512_storeu_si512(out + (int64_t)(t0 + i) * H * 64 + h * 64 + 16 * c, w[i]);
    }
}

void amx_attention(const float *q, int qs, const uint16_t *kc, const uint16_t *vc, int max_len, int start, int T,
                   int H, int Hkv, float *out) {
    const int n = start + T, npad = (n + KB2 - 1) / KB2 * KB2, G = H / Hkv, QN = (T + QB - 1) / QB;
    uint16_t *k = aligned_alloc(64, sizeof(uint16_t) * Hkv * npad * 64);
    uint16_t *vt = aligned_alloc(64, sizeof(uint16_t) * Hkv * npad * 64);
    #pragma omp parallel
    {
        #pragma omp for schedule(static)
        for (int g = 0; g < 2 * Hkv; g++)
            if (g < Hkv) {
                memcpy(k + (int64_t)g * npad * 64, kc + (int64_t)g * max_len * 64, sizeof(uint16_t) * n * 64);
                memset(k + ((int64_t)g * npad + n) * 64, 0, sizeof(uint16_t) * (npad - n) * 64);
            } else
                transpose_values(vc + (int64_t)(g - Hkv) * max_len * 64, n, npad, vt + (int64_t)(g - Hkv) * npad * 64);
        configure_tiles();
        #pragma omp for schedule(dynamic)
        for (int w = 0; w < H * QN; w++) {                        // the last query blocks first: the most keys
            int h = w % H, qb = QN - 1 - w / H;
            attend_block(q, qs, k + (int64_t)(h / G) * npad * 64, vt + (int64_t)(h / G) * npad * 64, npad, start, T,
                         qb * QB, h, out, H);
        }
        _tile_release();
    }
    free(k);
    free(vt);
}

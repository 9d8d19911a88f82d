// Kernels for bf16-weight models on x86 CPUs with AVX2 (see kernels.py).
// bf16_linear: y[M,N] = x[M,K] . w[N,K]^T (+ bias[N]), bf16 weights, float32 activations and
//   accumulation; one pass over the weights serves up to 6 input rows, so a few rows cost
//   about what one row costs (the product is memory-bound).
// i8_linear: the same with int8 weights and a scale per output row (draft models).
// fma_linear: bf16 weights in dp_pack's layout, 8 columns per FMA (FMALinear: CPUs without AVX512-BF16).
// q8_linear, q4_linear, q41_linear: Q8_0 / Q4_0 / Q4_1 blocks (Q8Linear), on AVX512-VNNI or on AVX2, the same values.
// rms_norm: one call instead of six PyTorch ops per norm.
// block_forward: a whole decoder layer for a few new tokens of one sequence, one call instead
//   of ~30 PyTorch ops (the small models' decode steps are dominated by per-op overhead);
//   block_qkv and block_out are its halves around the attention, for prefills (kernels.py).
// KV caches hold float32, or bf16 (kv16): rounded to nearest even when written, widened exactly when read.
// All compute each row the same way whatever M is, so results do not depend on batching.
#include "api.h"
#include "pool.h"
#include "vec.h"
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline __m256 load_bf16(const uint16_t *p) {    // 8 bf16 -> 8 float32 (exact)
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

static inline uint16_t float_to_bf16(float f) {        // nearest even, NaN as 0x7fc0: as torch rounds
    union { float f; uint32_t u; } v = { f };
    if ((v.u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

// 8 float32 -> 8 bf16 at p, rounded as float_to_bf16 does
static inline void store_bf16(uint16_t *p, __m256 x) {
    __m256i u = _mm256_castps_si256(x);
    __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
    __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
    r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q)));
    _mm_storeu_si128((__m128i *)p, _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1)));
}

enum { BF16 = 0, INT8 = 1, F32 = 2, AMX = 3, DP = 4, Q8 = 5, Q4 = 6, Q41 = 7, FMA = 8, GGUF = 9 };  // weight kinds; int8
static const int WBYTES[] = {2, 1, 4, 2, 2, 1, 1, 1, 2, 1};   // rows carry a float32 scale; AMX, DP, FMA and the Q
// kinds are packed; GGUF: a file's blocks as they are (csrc/blocks.c: the weights are a Matrix)

// csrc/avx512.c, where it builds: kernels.py sets kind AMX only where it did and the CPU has AMX, and
// switches the AVX-512 attention and int8 products on (use_avx512) only where the CPU has AVX-512
static int avx512 = 0;
int vnni = 0;                                  // read by csrc/blocks.c too
void use_avx512(int on) { avx512 = on; }
void use_vnni(int on) { vnni = on; }         // the quantized products on AVX512-VNNI (else AVX2's, the same values)
void amx_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y)
    __attribute__((weak));
void amx_glu(const float *x, int M, int K, const uint16_t *w, int I, const float *bias, float *act)
    __attribute__((weak));
void i8_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                  float *y) __attribute__((weak));
void dp_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y)
    __attribute__((weak));
void fma512_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y)
    __attribute__((weak));
void q8_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                  float *y) __attribute__((weak));
void q4_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                  float *y) __attribute__((weak));
void q41_linear512(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias,
                   float *y) __attribute__((weak));
void attend512_head(const float *q, int qs, const void *kc, const void *vc, int kv16, int max_len, int start,
                    int kv_len, const uint8_t *mask, int ms, int H, int Hkv, int hd, float *out, int g, int r0, int r1)
    __attribute__((weak));

// 8 weights from k on of a row of this kind, as float32 (exact)
static inline __m256 load8(const void *row, int k, int kind) {
    if (kind == INT8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)row + k))));
    if (kind == F32)
        return _mm256_loadu_ps((const float *)row + k);
    return load_bf16((const uint16_t *)row + k);
}

static inline float load1(const void *row, int k, int kind) {
    if (kind == INT8) return (float)((const int8_t *)row)[k];
    if (kind == F32) return ((const float *)row)[k];
    return bf16_to_float(((const uint16_t *)row)[k]);
}

// rows [m0, m0 + MB) of y at column n: scale * (x . row) + bias. Each row's product runs in two
// FMA chains (even and odd blocks of 8 weights): one chain would wait 4 cycles per FMA, which
// bounds a one-row product below the memory's speed. MB is a constant at every call site, so
// the accumulators stay in registers; every row is summed the same way whatever MB is.
static inline __attribute__((always_inline)) void dot_rows(const float *x, int K, const void *row, int kind,
                                                           float scale, const float *bias, float *y, int N, int n,
                                                           int m0, const int MB) {
    __m256 a0[6], a1[6];
    for (int i = 0; i < MB; i++) a0[i] = a1[i] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        __m256 w0 = load8(row, k, kind), w1 = load8(row, k + 8, kind);
        for (int i = 0; i < MB; i++) {
            const float *xr = x + (int64_t)(m0 + i) * K + k;
            a0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xr), a0[i]);
            a1[i] = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xr + 8), a1[i]);
        }
    }
    if (k + 8 <= K) {
        __m256 w0 = load8(row, k, kind);
        for (int i = 0; i < MB; i++) a0[i] = _mm256_fmadd_ps(w0, _mm256_loadu_ps(x + (int64_t)(m0 + i) * K + k), a0[i]);
        k += 8;
    }
    for (int i = 0; i < MB; i++) {
        float s = hsum(_mm256_add_ps(a0[i], a1[i]));
        for (int kk = k; kk < K; kk++) s += load1(row, kk, kind) * x[(int64_t)(m0 + i) * K + kk];
        y[(int64_t)(m0 + i) * N + n] = s * scale + (bias ? bias[n] : 0.0f);   // scale 1 unless int8: exact
    }
}

// y[m0 + i, n0 + j] = out[i * ld + j] + bias[n0 + j] for i < mb, j < cols: a pass's tile of outputs written back
// (csrc/avx512.c's products too)
void store_tile(const float *out, int ld, int mb, int cols, const float *bias, float *y, int N, int m0, int n0) {
    for (int i = 0; i < mb; i++)
        for (int j = 0; j < cols; j++)
            y[(int64_t)(m0 + i) * N + n0 + j] = out[ld * i + j] + (bias ? bias[n0 + j] : 0.0f);
}

// fma_linear: y[M,N] = x[M,K] . w[N,K]^T (+ bias) for bf16 weights packed as kernels.dp_pack packs them for
//   csrc/avx512.c's dp_linear ([NB][KP][16 columns][2 of K], zeros past N and K), on AVX2's FMA: a 32-byte
//   load holds 8 columns' pairs (k, k + 1); shifted left by 16 it is their weights at k as float32, masked its
//   weights at k + 1 (exact). Each row's x[k] is broadcast and multiplied into 8 columns at once, so one
//   output is one chain of FMAs over k in order, whatever the number of rows (no horizontal sums), and
//   one pass over a block's weights serves up to FMA_ROWS rows (4 blocks of 8 columns for 1 or 2 rows,
//   2 for more: 12 or fewer accumulators, beside the weights and a broadcast, in the 16 registers).
#define FMA_ROWS 6

// acc[i][v] += w[v] * x[i][k] for the 8-column blocks v: weights at k (odd: the pair's second) from the pairs at kp
static inline __attribute__((always_inline)) void fma_step(__m256 acc[][4], const float *x, int K, int k,
                                                           const uint16_t *wb, int64_t next, int kp, const int odd,
                                                           const int MB, const int NV) {
    __m256 w[4];
    for (int v = 0; v < NV; v++) {              // block of 8 columns v: 16-column block v / 2, its half v % 2
        __m256i p = _mm256_loadu_si256((const __m256i *)(wb + (v / 2) * next + (int64_t)kp * 32 + 16 * (v % 2)));
        w[v] = _mm256_castsi256_ps(odd ? _mm256_and_si256(p, _mm256_set1_epi32((int)0xFFFF0000u))
                                       : _mm256_slli_epi32(p, 16));
    }
    for (int i = 0; i < MB; i++) {
        __m256 xv = _mm256_broadcast_ss(x + (int64_t)i * K + k);
        for (int v = 0; v < NV; v++) acc[i][v] = _mm256_fmadd_ps(w[v], xv, acc[i][v]);
    }
}

static inline __attribute__((always_inline)) void fma_rows(const float *x, int K, const uint16_t *wb, int64_t next,
                                                           float *out, const int MB, const int NV) {
    __m256 acc[FMA_ROWS][4];
    for (int i = 0; i < MB; i++)
        for (int v = 0; v < NV; v++) acc[i][v] = _mm256_setzero_ps();
    int kp = 0;
    for (; 2 * kp + 1 < K; kp++) {
        fma_step(acc, x, K, 2 * kp, wb, next, kp, 0, MB, NV);
        fma_step(acc, x, K, 2 * kp + 1, wb, next, kp, 1, MB, NV);
    }
    if (K % 2) fma_step(acc, x, K, K - 1, wb, next, kp, 0, MB, NV);
    for (int i = 0; i < MB; i++)
        for (int v = 0; v < NV; v++) _mm256_storeu_ps(out + 32 * i + 8 * v, acc[i][v]);
}

#define FMA_NV(n, nv) case nv: fma_rows(xm, K, wb, next, o, n, nv); break;
#define FMA_CASE(n) case n: switch (nv) { FMA_NV(n, 2) default: FMA_NV(n, 4) } break;

typedef struct {            // a product's arguments, for its parallel tasks
    const float *x;
    int M, K;
    const void *w;
    int kind;
    const float *scale;
    int N;
    const float *bias;
    float *y;
} Product;

static void fma_columns(void *ctx, int64_t t0, int64_t t1) {         // tasks t0..t1 of 32 columns
    const Product *p = ctx;
    const float *x = p->x, *bias = p->bias;
    const uint16_t *w = p->w;
    const int M = p->M, K = p->K, N = p->N, NB = (N + 15) / 16;
    float *y = p->y;
    const int64_t next = (int64_t)(K + 1) / 2 * 32;                   // bf16 elements per block of 16 columns
    for (int nb = 2 * t0; nb < 2 * t1 && nb < NB; nb += 2) {
        const int cols = N - 16 * nb < 32 ? N - 16 * nb : 32;
        float out[FMA_ROWS * 32] __attribute__((aligned(32)));
        for (int m0 = 0; m0 < M; m0 += FMA_ROWS) {
            const int mb = M - m0 < FMA_ROWS ? M - m0 : FMA_ROWS;
            const float *xm = x + (int64_t)m0 * K;
            for (int half = 0; half < (cols > 16 && mb > 2 ? 2 : 1); half++) {   // 3+ rows: 16 columns at a time
                const uint16_t *wb = w + (nb + half) * next;
                const int nv = cols > 16 && mb <= 2 ? 4 : 2;
                float *o = out + 16 * half;
                switch (mb) {
                    FMA_CASE(1) FMA_CASE(2) FMA_CASE(3) FMA_CASE(4) FMA_CASE(5) default: FMA_CASE(6)
                }
            }
            store_tile(out, 32, mb, cols, bias, y, N, m0, 16 * nb);
        }
    }
}

void fma_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y) {
    if (avx512 && fma512_linear) return fma512_linear(x, M, K, w, N, bias, y);     // the same values
    Product p = {x, M, K, w, FMA, NULL, N, bias, y};
    parallel_for((N + 31) / 32, 1, fma_columns, &p);
}

// Quantized products without VNNI (--quant int8 / int4, GGUF's Q8_0 / Q4_0 / Q4_1 blocks): the packing, the
// activations' quantization and the float32 accumulation of csrc/avx512.c's q8_linear (read its comment), so
// results are bit for bit the same; only the integer dots differ in how they are computed. x is quantized to
// signed bytes here (-127..127) and each block's dot product of 32 runs on vpmaddubsw (unsigned x signed bytes,
// pairs summed in int16) and vpmaddwd (pairs of int16 summed in int32), as llama.cpp does on AVX2:
// - 8 bits: |w| times x with w's sign (vpsignb), so a pair is at most 2 x 128 x 127 < 2^15: no saturation;
// - 4 bits: the nibble u = q + 8 (0..15) times x, the block's eight quads summed in int16 (at most
//   8 x 2 x 15 x 127 < 2^15) and widened once, then 8 sum(x) taken off: sum((u - 8) x), no sign trick.
#define QROWS 4                                    // rows per pass over a block of 16 columns

// x [M, K] -> xq [M][QB * 32] signed bytes (nearest even, zeros past K), d_x [M][QB] and sum(q_x) [M][QB]
void q8_quantize_rows(const float *x, int M, int K, int QB, int8_t *xq, float *xd, int32_t *xsum) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int m = 0; m < M; m++)
        for (int b = 0; b < QB; b++) {
            float v[32] __attribute__((aligned(32))) = {0};
            int n = K - 32 * b < 32 ? K - 32 * b : 32;
            memcpy(v, x + (int64_t)m * K + 32 * b, sizeof(float) * n);
            __m256 a = _mm256_setzero_ps();
            for (int h = 0; h < 4; h++) a = _mm256_max_ps(a, _mm256_andnot_ps(sign, _mm256_load_ps(v + 8 * h)));
            __m128 r = _mm_max_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
            r = _mm_max_ps(r, _mm_movehl_ps(r, r));
            float amax = _mm_cvtss_f32(_mm_max_ss(r, _mm_movehdup_ps(r)));
            const __m256 inv = _mm256_set1_ps(amax > 0 ? 127.0f / amax : 0.0f);
            __m256i q[4], total = _mm256_setzero_si256();
            for (int h = 0; h < 4; h++) {
                q[h] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_load_ps(v + 8 * h), inv));     // nearest even
                q[h] = _mm256_max_epi32(_mm256_min_epi32(q[h], _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
                total = _mm256_add_epi32(total, q[h]);
            }
            __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
            bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));  // in order
            _mm256_storeu_si256((__m256i *)(xq + (int64_t)m * QB * 32 + 32 * b), bytes);
            __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
            t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
            xsum[(int64_t)m * QB + b] = _mm_cvtsi128_si32(_mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1)));
            xd[(int64_t)m * QB + b] = amax / 127.0f;
        }
}

// quads s and s + 1 of block b ([8 columns][4 of K] each) of the H halves from h0 into the MB rows' int32 dots
// (8 bits) or int16 pairs (4 bits), dot[h][i]
static inline __attribute__((always_inline)) void q_quads(const int8_t *xq, int QB, const int8_t *wb, int h0, int b,
                                                          int s, __m256i dot[][QROWS], const int MB, const int H,
                                                          const int BITS) {
    const __m256i ones = _mm256_set1_epi16(1), nib = _mm256_set1_epi8(0x0F);
    __m256i w[2][2], a[2][2];
    for (int h = 0; h < H; h++)
        if (BITS == 8) {
            for (int u = 0; u < 2; u++) {
                w[h][u] = _mm256_loadu_si256((const __m256i *)(wb + ((int64_t)b * 8 + s + u) * 64 + 32 * (h0 + h)));
                a[h][u] = _mm256_abs_epi8(w[h][u]);
            }
        } else {
            __m256i v = _mm256_loadu_si256((const __m256i *)(wb + ((int64_t)b * 8 + s) * 32 + 32 * (h0 + h)));
            a[h][0] = _mm256_and_si256(v, nib);
            a[h][1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
        }
    for (int i = 0; i < MB; i++) {
        const int8_t *xs = xq + (int64_t)i * QB * 32 + 32 * b + 4 * s;
        __m256i x0 = _mm256_set1_epi32(*(const int32_t *)xs), x1 = _mm256_set1_epi32(*(const int32_t *)(xs + 4));
        for (int h = 0; h < H; h++)
            if (BITS == 8)
                dot[h][i] = _mm256_add_epi32(dot[h][i], _mm256_add_epi32(
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a[h][0], _mm256_sign_epi8(x0, w[h][0])), ones),
                    _mm256_madd_epi16(_mm256_maddubs_epi16(a[h][1], _mm256_sign_epi8(x1, w[h][1])), ones)));
            else
                dot[h][i] = _mm256_add_epi16(dot[h][i], _mm256_add_epi16(_mm256_maddubs_epi16(a[h][0], x0),
                                                                         _mm256_maddubs_epi16(a[h][1], x1)));
    }
}

// rows [0, MB) of out [QROWS][16], columns 8 h0 .. 8 (h0 + H) - 1 of a block of 16, block by block of K (H halves
// of 8 columns per pass: MB x H int32 dots and float32 sums stay in the 16 registers beside the weights)
static inline __attribute__((always_inline)) void q_rows(const int8_t *xq, const float *xd, const int32_t *xsum,
                                                         int QB, const int8_t *wb, const float *sb, int h0, float *out,
                                                         const int MB, const int H, const int BITS, const int MINS) {
    const int SW = 32 + 16 * MINS;                 // scale words per block of 16 columns and 32 of K
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[2][QROWS];
    for (int h = 0; h < H; h++)
        for (int i = 0; i < MB; i++) acc[h][i] = _mm256_setzero_ps();
    for (int b = 0; b < QB; b++) {
        __m256i dot[2][QROWS];                     // per column: int32 (8 bits) or int16 pairs (4 bits)
        for (int h = 0; h < H; h++)
            for (int i = 0; i < MB; i++) dot[h][i] = _mm256_setzero_si256();
        if (MB >= 3) {       // not unrolled: GCC would issue all 8 MB products first and spill them to the stack
#pragma GCC unroll 1
            for (int s = 0; s < 8; s += 2) q_quads(xq, QB, wb, h0, b, s, dot, MB, H, BITS);
        } else {             // 1 or 2 rows fit unrolled (faster so)
            for (int s = 0; s < 8; s += 2) q_quads(xq, QB, wb, h0, b, s, dot, MB, H, BITS);
        }
        for (int h = 0; h < H; h++) {
            const float *sc = sb + (int64_t)SW * b + 8 * (h0 + h);
            for (int i = 0; i < MB; i++) {
                const float dx = xd[(int64_t)i * QB + b];
                const int32_t sum = xsum[(int64_t)i * QB + b];
                __m256i d = BITS == 8 ? dot[h][i]
                                      : _mm256_sub_epi32(_mm256_madd_epi16(dot[h][i], ones), _mm256_set1_epi32(8 * sum));
                acc[h][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_mul_ps(_mm256_loadu_ps(sc), _mm256_set1_ps(dx)),
                                            acc[h][i]);
                if (MINS)                          // + m' d_x sum(q_x), the block's offset
                    acc[h][i] = _mm256_fmadd_ps(_mm256_loadu_ps(sc + 32), _mm256_set1_ps((float)sum * dx), acc[h][i]);
            }
        }
    }
    for (int h = 0; h < H; h++)
        for (int i = 0; i < MB; i++) _mm256_storeu_ps(out + 16 * i + 8 * (h0 + h), acc[h][i]);
}

#define Q_CASE(n, H) case n: q_rows(xm, dm, sm, QB, wb, sb, h, out, n, H, BITS, MINS); break;

// output columns 16 nb .. 16 nb + 15 for every row, QROWS rows per pass over their weights
static inline __attribute__((always_inline)) void q_columns(const int8_t *xq, const float *xd, const int32_t *xsum,
                                                            int M, int QB, const int8_t *w, const float *scale, int nb,
                                                            int N, const float *bias, float *y, const int BITS,
                                                            const int MINS) {
    const int SW = 32 + 16 * MINS, cols = N - 16 * nb < 16 ? N - 16 * nb : 16;
    const int8_t *wb = w + (int64_t)nb * QB * 32 * 16 * BITS / 8;
    const float *sb = scale + (int64_t)nb * QB * SW;
    float out[QROWS * 16] __attribute__((aligned(32)));
    for (int m0 = 0; m0 < M; m0 += QROWS) {
        const int mb = M - m0 < QROWS ? M - m0 : QROWS;
        const int8_t *xm = xq + (int64_t)m0 * QB * 32;
        const float *dm = xd + (int64_t)m0 * QB;
        const int32_t *sm = xsum + (int64_t)m0 * QB;
        if (mb <= 2 && cols > 8) {                 // 1 or 2 rows: both halves in one pass (faster)
            const int h = 0;
            switch (mb) {
                Q_CASE(1, 2) default: Q_CASE(2, 2)
            }
        } else
            for (int h = 0; h < (cols > 8 ? 2 : 1); h++)
                switch (mb) {
                    Q_CASE(1, 1) Q_CASE(2, 1) Q_CASE(3, 1) default: Q_CASE(4, 1)
                }
        store_tile(out, 16, mb, cols, bias, y, N, m0, 16 * nb);
    }
}

typedef struct {            // quant_linear's arguments, for its parallel tasks
    const int8_t *xq;
    const float *xd;
    const int32_t *xsum;
    int M, QB;
    const int8_t *w;
    const float *scale;
    int N;
    const float *bias;
    float *y;
} QuantProduct;

// One task function per kind, so that each has BITS and MINS as constants (a loop taking them as arguments
// tested them at run time in its innermost loop).
#define COLUMN_BLOCKS(NAME, BITS, MINS)                                                                        \
    static void NAME(void *ctx, int64_t nb0, int64_t nb1) {                                                    \
        const QuantProduct *a = ctx;                                                                           \
        for (int nb = nb0; nb < nb1; nb++)                                                                     \
            q_columns(a->xq, a->xd, a->xsum, a->M, a->QB, a->w, a->scale, nb, a->N, a->bias, a->y, BITS, MINS); \
    }
COLUMN_BLOCKS(q8_blocks, 8, 0)
COLUMN_BLOCKS(q4_blocks, 4, 0)
COLUMN_BLOCKS(q41_blocks, 4, 1)

static void quant_linear(const float *x, int M, int K, const int8_t *w, int kind, const float *scale, int N,
                         const float *bias, float *y) {
    const int QB = (K + 31) / 32;
    int8_t *xq = malloc((int64_t)M * QB * 32);
    float *xd = malloc(sizeof(float) * (int64_t)M * QB);
    int32_t *xsum = malloc(sizeof(int32_t) * (int64_t)M * QB);
    q8_quantize_rows(x, M, K, QB, xq, xd, xsum);
    QuantProduct a = {xq, xd, xsum, M, QB, w, scale, N, bias, y};
    parallel_for((N + 15) / 16, 1, kind == Q8 ? q8_blocks : kind == Q4 ? q4_blocks : q41_blocks, &a);
    free(xq);
    free(xd);
    free(xsum);
}

// a product of kind Q8, Q4 or Q41 (kernels.Q8Linear's packing): on VNNI where use_vnni switched it on
static void quantized_linear(const float *x, int M, int K, const void *w, int kind, const float *scale, int N,
                             const float *bias, float *y) {
    if (vnni)
        (kind == Q8 ? q8_linear512 : kind == Q4 ? q4_linear512 : q41_linear512)(x, M, K, w, scale, N, bias, y);
    else
        quant_linear(x, M, K, w, kind, scale, N, bias, y);
}

void q8_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y) {
    quantized_linear(x, M, K, w, Q8, scale, N, bias, y);
}

void q4_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y) {
    quantized_linear(x, M, K, w, Q4, scale, N, bias, y);
}

void q41_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y) {
    quantized_linear(x, M, K, w, Q41, scale, N, bias, y);
}

static void dot_columns(void *ctx, int64_t n0, int64_t n1) {          // output columns n0..n1, row by row
    const Product *p = ctx;
    const float *x = p->x, *bias = p->bias, *scale = p->scale;
    const void *w = p->w;
    const int M = p->M, K = p->K, N = p->N, kind = p->kind;
    float *y = p->y;
    for (int n = n0; n < n1; n++) {
        const void *row = (const char *)w + (int64_t)n * K * WBYTES[kind];
        float sc = kind == INT8 ? scale[n] : 1.0f;
        for (int m0 = 0; m0 < M; m0 += 6)
            switch (M - m0 < 6 ? M - m0 : 6) {
                case 1: dot_rows(x, K, row, kind, sc, bias, y, N, n, m0, 1); break;
                case 2: dot_rows(x, K, row, kind, sc, bias, y, N, n, m0, 2); break;
                case 3: dot_rows(x, K, row, kind, sc, bias, y, N, n, m0, 3); break;
                case 4: dot_rows(x, K, row, kind, sc, bias, y, N, n, m0, 4); break;
                case 5: dot_rows(x, K, row, kind, sc, bias, y, N, n, m0, 5); break;
                default: dot_rows(x, K, row, kind, sc, bias, y, N, n, m0, 6); break;
            }
    }
}

// y[M,N] = x[M,K] . w[N,K]^T (+ bias): w in bf16, float32, or int8 with a float32 scale per row.
// Weight rows are read once, in order (one sequential stream: DRAM serves it fastest), for
// up to 6 input rows at a time; further rows re-read the row from L1.
static void linear(const float *x, int M, int K, const void *w, int kind, const float *scale, int N, const float *bias,
                   float *y) {
    if (kind == AMX) {
        amx_linear(x, M, K, w, N, bias, y);
        return;
    }
    if (kind == DP || kind == FMA) {
        (kind == DP ? dp_linear : fma_linear)(x, M, K, w, N, bias, y);
        return;
    }
    if (kind == Q8 || kind == Q4 || kind == Q41) {
        quantized_linear(x, M, K, w, kind, scale, N, bias, y);
        return;
    }
    if (kind == GGUF) {
        gguf_linear(x, M, K, w, N, bias, y);
        return;
    }
    if (kind == INT8 && avx512) {
        i8_linear512(x, M, K, w, scale, N, bias, y);
        return;
    }
    Product p = {x, M, K, w, kind, scale, N, bias, y};
    parallel_for(N, 1, dot_columns, &p);
}


void bf16_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y) {
    linear(x, M, K, w, BF16, NULL, N, bias, y);
}

// float32 weights: a product whose rows do not depend on M (unlike BLAS), for batch-invariant serving
void f32_linear(const float *x, int M, int K, const float *w, int N, const float *bias, float *y) {
    linear(x, M, K, w, F32, NULL, N, bias, y);
}

// int8 weights w[N,K] with a float32 scale per output row (draft models: half the bytes
// of bf16, and a draft need not be exact)
void i8_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y) {
    linear(x, M, K, w, INT8, scale, N, bias, y);
}

// y[M,D] = w * (x * rsqrt(mean(x^2) + eps)), row by row (RMSNorm in float32)
typedef struct {
    const float *x;
    int D;
    const float *w;
    float eps;
    float *y;
} Norm;

static void norm_rows(void *ctx, int64_t m0, int64_t m1) {
    const Norm *a = ctx;
    const float *x = a->x, *w = a->w;
    const int D = a->D;
    const float eps = a->eps;
    float *y = a->y;
    for (int m = m0; m < m1; m++) {
        const float *xr = x + (int64_t)m * D;
        float *yr = y + (int64_t)m * D;
        __m256 acc = _mm256_setzero_ps();
        int k = 0;
        for (; k + 8 <= D; k += 8) {
            __m256 v = _mm256_loadu_ps(xr + k);
            acc = _mm256_fmadd_ps(v, v, acc);
        }
        float s = hsum(acc);
        for (int kk = k; kk < D; kk++) s += xr[kk] * xr[kk];
        float r = 1.0f / sqrtf(s / D + eps);
        __m256 rv = _mm256_set1_ps(r);
        for (k = 0; k + 8 <= D; k += 8)
            _mm256_storeu_ps(yr + k, _mm256_mul_ps(_mm256_loadu_ps(w + k), _mm256_mul_ps(_mm256_loadu_ps(xr + k), rv)));
        for (int kk = k; kk < D; kk++) yr[kk] = w[kk] * (xr[kk] * r);
    }
}

static void rms_norm_rows(const float *x, int M, int D, const float *w, float eps, float *y) {   // on this thread
    Norm a = {x, D, w, eps, y};
    norm_rows(&a, 0, M);
}

void rms_norm(const float *x, int M, int D, const float *w, float eps, float *y) {
    Norm a = {x, D, w, eps, y};
    parallel_for(M, M >= 64 ? 1 : M, norm_rows, &a);
}

// x[hd] <- x * cos + rotate_half(x) * sin (HF's rotate-half convention)
static void rotate(float *x, const float *cos, const float *sin, int hd) {
    int half = hd / 2;
    for (int i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cos[i] - b * sin[i];
        x[i + half] = b * cos[i + half] + a * sin[i + half];
    }
}

typedef struct Layer {          // one decoder layer's weights (kernels.CBlock fills it)
    int D, H, Hkv, hd, I;   // hidden size, query heads, kv heads, head dim, MLP width
    int kind[4];            // weight kinds of qkv, o, gate_up, down (BF16, INT8, F32, AMX, ... GGUF)
    int glu;                // AMX: gate_up packed for amx_glu (gate and up columns interleaved by 32)
    float eps;
    const float *attn_norm, *mlp_norm;
    const void *qkv, *o, *gate_up, *down;          // [N, K] of that kind
    const float *qkv_s, *o_s, *gate_up_s, *down_s; // the int8 scales, or NULL
    const float *qkv_b, *o_b, *gate_up_b, *down_b; // float32 or NULL
    void (*reduce)(float *x, int n);                // a tensor-parallel shard: sums x[n] over the ranks, or NULL
    const float *q_norm, *k_norm;                   // an RMSNorm of each q and k head [hd] before rotary, or NULL
    const float *attn_post, *mlp_post;              // RMSNorms of the attention's and the MLP's outputs, or NULL
    int act;                                        // the MLP's gate: SILU or GELU_TANH
    int local;                                      // a sliding layer: the local rotary tables and window mask
} Layer;

enum { SILU = 0, GELU_TANH = 1 };

// [sum(a[0]), ..., sum(a[7])]: the same addition tree for every lane
static inline __m256 hsum8(const __m256 *a) {
    __m256 u0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
    __m256 u1 = _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
}

// e^x lane by lane (Cephes' expf polynomial, ~1 ulp); e^x < 1e-37 becomes 0, so -inf gives 0
static inline __m256 exp8(__m256 x) {
    __m256 tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-85.0f), _CMP_LT_OQ);
    x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(88.3762626647949f)), _mm256_set1_ps(-85.0f));
    __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), _mm256_set1_ps(0.5f)));
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    x = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), x);
    __m256 y = _mm256_set1_ps(1.9875691500E-4f);
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.3981999507E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(8.3334519073E-3f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(4.1665795894E-2f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(1.6666665459E-1f));
    y = _mm256_fmadd_ps(y, x, _mm256_set1_ps(5.0000001201E-1f));
    y = _mm256_add_ps(_mm256_fmadd_ps(y, _mm256_mul_ps(x, x), x), _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(y, _mm256_castsi256_ps(e)));
}

// 8 keys' or values' elements from i on as float32: from a float32 block (BF 0), or a bf16 cache widened in
// registers (BF 1; exact, so both give the same floats)
static inline __m256 load8f(const void *p, int64_t i, const int BF) {
    return BF ? load_bf16((const uint16_t *)p + i) : _mm256_loadu_ps((const float *)p + i);
}

static inline float load1f(const void *p, int64_t i, const int BF) {
    return BF ? bf16_to_float(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

// Scores of query row qr against the 8 keys from element `at` of k ([8, hd], float32 or bf16 as BF; only the first
// `live` are read, the others give 0): 8 floats at pr. Key jj's dot product: lane i sums d = i, i + 8, ... in
// order, then hsum8's tree; with all 8 keys live, d runs outside the keys so that the 8 chains stay in registers
// (the same operations in the same order per key: the same floats).
static inline __attribute__((always_inline)) void score8(const float *qr, const void *k, int64_t at, int hd, int live,
                                                         float scale, float *pr, const int BF) {
    __m256 acc[8];
    for (int jj = 0; jj < 8; jj++) acc[jj] = _mm256_setzero_ps();
    if (live >= 8)
        for (int d = 0; d + 8 <= hd; d += 8) {
            const __m256 qv = _mm256_loadu_ps(qr + d);
            #pragma GCC unroll 8
            for (int jj = 0; jj < 8; jj++)
                acc[jj] = _mm256_fmadd_ps(qv, load8f(k, at + (int64_t)jj * hd + d, BF), acc[jj]);
        }
    else
        for (int jj = 0; jj < live; jj++)
            for (int d = 0; d + 8 <= hd; d += 8)
                acc[jj] = _mm256_fmadd_ps(_mm256_loadu_ps(qr + d), load8f(k, at + (int64_t)jj * hd + d, BF), acc[jj]);
    _mm256_storeu_ps(pr, _mm256_mul_ps(hsum8(acc), _mm256_set1_ps(scale)));
    for (int jj = 0; jj < 8 && jj < live; jj++)                   // head dims past a multiple of 8
        for (int d = hd / 8 * 8; d < hd; d++)   // explicit fmaf: contracted alike wherever this is inlined
            pr[jj] = fmaf(qr[d] * load1f(k, at + (int64_t)jj * hd + d, BF), scale, pr[jj]);
}

// -inf at pr[0, 8) for the keys j0 .. j0 + 7 that a row does not see: where its mask row mrow is 0, or without a
// mask past key `last`; keys from kv_len on are never seen.
static inline void hide8(float *pr, const uint8_t *mrow, int j0, int kv_len, int last) {
    if (j0 + 8 <= kv_len) {
        if (!mrow) {
            if (j0 + 7 <= last) return;
        } else {
            __m256i m = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(mrow + j0)));
            __m256 hidden = _mm256_castsi256_ps(_mm256_cmpeq_epi32(m, _mm256_setzero_si256()));
            _mm256_storeu_ps(pr, _mm256_blendv_ps(_mm256_loadu_ps(pr), _mm256_set1_ps(-INFINITY), hidden));
            return;
        }
    }
    for (int j = j0; j < j0 + 8; j++)
        if (!(j < kv_len && (mrow ? mrow[j] : j <= last))) pr[j - j0] = -INFINITY;
}

// LEFT_PACK[m]: the lanes set in m, in order, then the others; permuting 8 floats by it moves the lanes of m to
// the front (AVX2 has no compress instruction)
static int32_t LEFT_PACK[256][8];

__attribute__((constructor)) static void left_pack_table(void) {
    for (int m = 0; m < 256; m++) {
        int n = 0;
        for (int i = 0; i < 8; i++) if (m >> i & 1) LEFT_PACK[m][n++] = i;
        for (int i = 0; i < 8; i++) if (!(m >> i & 1)) LEFT_PACK[m][n++] = i;
    }
}

// The nonzero floats of pr[0, P) (P a multiple of 8) in order at packed; returns how many
static inline int nonzeros(const float *pr, int P, float *packed) {
    int n = 0;
    for (int j0 = 0; j0 < P; j0 += 8) {
        __m256 v = _mm256_loadu_ps(pr + j0);
        int m = ~_mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_EQ_OQ)) & 0xff;
        __m256i order = _mm256_loadu_si256((const __m256i *)LEFT_PACK[m]);
        _mm256_storeu_ps(packed + n, _mm256_permutevar8x32_ps(v, order));   // packed has room for P + 8
        n += __builtin_popcount(m);
    }
    return n;
}

// Attention of M new tokens (rotated q [M, H*hd], row stride qs) over keys/values
// kc/vc [Hkv, max_len, hd] (float32, or bf16 where kv16; positions [0, kv_len)); token t sees key j where
// mask[t * ms + j] or, without a mask, j <= start + t. out [M, H*hd].
// attend_head computes kv head g's query rows r0 .. r1 (row r = t * H/Hkv + i: token t, query head
// g * H/Hkv + i). Per kv head, blocks of KB keys and values, widened to float32 once (block_f32), stay in L1
// while each of those rows goes through them. A query's result depends only on the keys it sees, not on M,
// kv_len or where masked keys sit (a key's score is summed the same way in any lane, masked
// keys weigh exactly 0 and are left out of the sums, which run in key order), so a token
// attends alike in decoding, in chain verification and as a node of a tree.
#define KB 64

// Keys or values [j0, j1) of one kv head (from element kv0 on) as float32 at f [(j - j0) * hd]: a bf16
// cache is widened once per block for all the query rows that read it (exact); a float32 cache is read
// where it is (f unused). Returns where key j0 starts, so that key j sits at (j - j0) * hd.
static inline const float *block_f32(const void *c, int64_t kv0, int j0, int j1, int hd, float *f, int kv16) {
    if (!kv16)
        return (const float *)c + kv0 + (int64_t)j0 * hd;
    const uint16_t *src = (const uint16_t *)c + kv0 + (int64_t)j0 * hd;
    const int64_t n = (int64_t)(j1 - j0) * hd;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(f + i, load_bf16(src + i));
    for (; i < n; i++) f[i] = bf16_to_float(src[i]);
    return f;
}

// o[d0, d0 + 8 NV) += pr[j] * value j's elements there, for the keys j in [b, end) of nonzero weight, in key order
// (values of the block from b on at vb, key j's at (j - b) * hd)
static inline __attribute__((always_inline)) void weigh_values(float *o, const float *pr, const void *vb, int b,
                                                               int end, int hd, int d0, const int NV, const int BF) {
    __m256 acc[8];
    for (int c = 0; c < NV; c++) acc[c] = _mm256_loadu_ps(o + d0 + 8 * c);
    for (int j = b; j < end; j++) {
        if (pr[j] == 0.0f) continue;
        __m256 w = _mm256_set1_ps(pr[j]);
        const int64_t vj = (int64_t)(j - b) * hd + d0;
        for (int c = 0; c < NV; c++) acc[c] = _mm256_fmadd_ps(w, load8f(vb, vj + 8 * c, BF), acc[c]);
    }
    for (int c = 0; c < NV; c++) _mm256_storeu_ps(o + d0 + 8 * c, acc[c]);
}

// (not inlined: GCC makes one copy per BF; inlined both into attend_head, the float32-block one ran slower)
static __attribute__((noinline)) void attend_rows(const float *q, int qs, const void *kc, const void *vc, int kv16,
                                                  int max_len, int start, int kv_len, const uint8_t *mask, int ms,
                                                  int H, int Hkv, int hd, float *out, int g, int r0, int r1,
                                                  const int BF) {
    const int G = H / Hkv, R = r1 - r0, P = (kv_len + 7) / 8 * 8;  // rows; padded key count
    const float scale = 1.0f / sqrtf((float)hd);
    const int64_t kv0 = (int64_t)g * max_len * hd;           // this head's keys and values
    float *p = malloc(sizeof(float) * ((R + 1) * P + 8));   // scores of row r0 + r at p + r * P
    float *packed = p + (int64_t)R * P;
    float *f = BF ? NULL : malloc(sizeof(float) * KB * hd);  // a block of keys or values in float32
    int *span = malloc(sizeof(int) * R);     // row r's keys [0, span[r]) (a multiple of 8): those past it unseen
    #define Q_ROW(r) (q + (int64_t)((r0 + (r)) / G) * qs + (g * G + (r0 + (r)) % G) * hd)
    #define OUT_ROW(r) (out + (int64_t)((r0 + (r)) / G) * H * hd + (g * G + (r0 + (r)) % G) * hd)
    for (int r = 0; r < R; r++) {            // causal without a mask: a prefill's rows skip the keys after them
        const int last = start + (r0 + r) / G, seen = mask || last + 1 > kv_len ? kv_len : last + 1;
        span[r] = (seen + 7) / 8 * 8;
    }
    for (int b = 0; b < P; b += KB) {                        // scores, -inf where not seen
        const void *kb = BF ? (const void *)((const uint16_t *)kc + kv0 + (int64_t)b * hd)
                            : block_f32(kc, kv0, b, b + KB < kv_len ? b + KB : kv_len, hd, f, kv16);
        for (int r = 0; r < R; r++) {
            float *pr = p + (int64_t)r * P;
            int t = (r0 + r) / G;
            for (int j0 = b; j0 < b + KB && j0 < span[r]; j0 += 8) {
                score8(Q_ROW(r), kb, (int64_t)(j0 - b) * hd, hd, kv_len - j0, scale, pr + j0, BF);
                hide8(pr + j0, mask ? mask + (int64_t)t * ms : NULL, j0, kv_len, start + t);
            }
        }
    }
    float *inv = malloc(sizeof(float) * R);
    for (int r = 0; r < R; r++) {                            // softmax numerators; out = 0
        float *pr = p + (int64_t)r * P;
        __m256 top = _mm256_set1_ps(-INFINITY), sum = _mm256_setzero_ps();
        for (int j0 = 0; j0 < span[r]; j0 += 8) top = _mm256_max_ps(top, _mm256_loadu_ps(pr + j0));
        top = _mm256_max_ps(top, _mm256_permute2f128_ps(top, top, 1));
        top = _mm256_max_ps(top, _mm256_permute_ps(top, 0x4e));
        top = _mm256_max_ps(top, _mm256_permute_ps(top, 0xb1));   // the row's max in every lane
        for (int j0 = 0; j0 < span[r]; j0 += 8)
            _mm256_storeu_ps(pr + j0, exp8(_mm256_sub_ps(_mm256_loadu_ps(pr + j0), top)));
        int n = nonzeros(pr, span[r], packed);               // the sum runs over the nonzero numerators
                                                             // compacted in key order (the i-th in lane
                                                             // i % 8): wherever masked keys sit
        for (int j = n; j < (n + 7) / 8 * 8; j++) packed[j] = 0.0f;
        for (int j0 = 0; j0 < n; j0 += 8) sum = _mm256_add_ps(sum, _mm256_loadu_ps(packed + j0));
        inv[r] = 1.0f / hsum(sum);
        memset(OUT_ROW(r), 0, sizeof(float) * hd);
    }
    const int HV = hd / 8 * 8;                               // head dims in whole vectors
    for (int b = 0; b < kv_len; b += KB) {                   // out += weights . values, in key order
        int end = b + KB < kv_len ? b + KB : kv_len;
        const void *vb = BF ? (const void *)((const uint16_t *)vc + kv0 + (int64_t)b * hd)   // value j at
                            : block_f32(vc, kv0, b, end, hd, f, kv16);                 // (j - b) * hd
        for (int r = 0; r < R; r++) {
            const float *pr = p + (int64_t)r * P;
            const int stop = end < span[r] ? end : span[r];  // the row's unseen keys weigh 0: skipped
            float *o = OUT_ROW(r);
            for (int d0 = 0; d0 < HV; d0 += 64)
                if (HV - d0 >= 64) weigh_values(o, pr, vb, b, stop, hd, d0, 8, BF);   // 8 accumulators in registers
                else weigh_values(o, pr, vb, b, stop, hd, d0, (HV - d0) / 8, BF);
            for (int j = b; j < stop; j++)
                for (int d = HV; d < hd; d++) o[d] = fmaf(pr[j], load1f(vb, (int64_t)(j - b) * hd + d, BF), o[d]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int d = 0; d < hd; d++) OUT_ROW(r)[d] *= inv[r];
    #undef Q_ROW
    #undef OUT_ROW
    free(span);
    free(inv);
    free(f);
    free(p);
}

// A task of at most DIRECT_ROWS query rows reads a bf16 cache where it is, widening each key and value in
// registers: converting a block into f first cost as much as its few rows' products (decoding: one or two rows
// per task). More rows share one conversion. Both read the same floats in the same order: the same results.
#define DIRECT_ROWS 2

static void attend_head(const float *q, int qs, const void *kc, const void *vc, int kv16, int max_len, int start,
                        int kv_len, const uint8_t *mask, int ms, int H, int Hkv, int hd, float *out, int g, int r0,
                        int r1) {
    if (kv16 && r1 - r0 <= DIRECT_ROWS)
        attend_rows(q, qs, kc, vc, kv16, max_len, start, kv_len, mask, ms, H, Hkv, hd, out, g, r0, r1, 1);
    else
        attend_rows(q, qs, kc, vc, kv16, max_len, start, kv_len, mask, ms, H, Hkv, hd, out, g, r0, r1, 0);
}

// The attention function's kv head g: attend512_head where the CPU has AVX-512 and hd is 64 or 128
typedef void (*AttendHead)(const float *, int, const void *, const void *, int, int, int, int, const uint8_t *, int,
                           int, int, int, float *, int, int, int);

static AttendHead attend_head_for(int hd) {
    return avx512 && (hd == 64 || hd == 128) ? attend512_head : attend_head;
}

// Each kv head's R query rows are split in S parts, a task each, so that the Hkv x S tasks give every thread two or
// more: a few kv heads (SmolLM2 has 3) then spread evenly over the threads (3 heads on 2 threads kept one idle a
// third of the time). No more parts than that: each part widens the keys and values it reads itself (4 parts of a
// 16-token verification's rows widened every key 4 times), and a part keeps two rows or more where there are
// (AVX-512's attention takes a direct task's rows in pairs). At most ATTN_SPLIT parts, unless a part would hold more
// than PART_ROWS rows: a task's scores take its rows x the keys in floats (a long pipeline prefill's rows and keys).
#define ATTN_SPLIT 4
#define PART_ROWS 512

static inline int attention_tasks(int R, int Hkv) {
    const int threads = team_size();
    int S = (2 * threads + Hkv - 1) / Hkv;
    if (S > (R + 1) / 2) S = (R + 1) / 2;
    if (S > ATTN_SPLIT) S = ATTN_SPLIT;
    if (S < 1) S = 1;
    return (R + S - 1) / S > PART_ROWS ? (R + PART_ROWS - 1) / PART_ROWS : S;
}

// The attention of M new tokens (the contract above) with this CPU's kernel (attend_head_for), as a decoding step's
// (attention_half): a prefill's tokens attend as they would one by one. Each kv head's rows in attention_tasks.
typedef struct {            // the attention of B rows' new tokens, for its parallel tasks (attention_half's layout)
    AttendHead head;
    const float *q;
    int qs;
    const char *kc, *vc;
    int kv16, max_len;
    const int *starts;      // row b's cached tokens before its new ones (its keys: those and its T new ones)
    int start, kv_len;      // where starts is NULL (one row): its cached tokens and keys
    const uint8_t *mask;
    int ms, T, H, Hkv, hd, S;
    int64_t rs;             // a row's cache elements
    float *out;
} Attention;

static void attention_parts(void *ctx, int64_t t0, int64_t t1) {   // task t: row b, kv head g, part of S
    const Attention *a = ctx;
    const int T = a->T, H = a->H, Hkv = a->Hkv, hd = a->hd, S = a->S, Q = a->qs, R = T * (H / Hkv);
    const int64_t bytes = a->rs * (a->kv16 ? 2 : 4);
    for (int64_t t = t0; t < t1; t++) {
        const int b = t / (Hkv * S), g = t / S % Hkv, part = t % S;
        const int start = a->starts ? a->starts[b] : a->start, kv_len = a->starts ? start + T : a->kv_len;
        a->head(a->q + (int64_t)b * T * Q, Q, a->kc + b * bytes, a->vc + b * bytes, a->kv16, a->max_len, start, kv_len, a->mask ? a->mask + (int64_t)b * T * a->ms : NULL, a->ms,
                H, Hkv, hd, a->out + (int64_t)b * T * H * hd, g, part * R / S, (part + 1) * R / S);
    }
}

void attend(const float *q, int qs, const void *kc, const void *vc, int kv16, int max_len, int start, int kv_len,
            const uint8_t *mask, int ms, int M, int H, int Hkv, int hd, float *out) {
    const int S = attention_tasks(M * (H / Hkv), Hkv);
    Attention a = {attend_head_for(hd), q, qs, kc, vc, kv16, max_len, NULL, start, kv_len, mask, ms, M, H, Hkv, hd, S, 0,
                   out};
    parallel_tasks((int64_t)Hkv * S, attention_parts, &a);
}

// act[M, I] = silu(gate) * up for gu[M, 2I] = [gate | up], with exp8 (the same for every row)
typedef struct {
    const float *gu;
    int I;
    float *act;
} Glu;

static void swiglu_rows(void *ctx, int64_t r0, int64_t r1) {
    const Glu *c = ctx;
    const int I = c->I;
    for (int r = r0; r < r1; r++) {
        const float *g = c->gu + (int64_t)r * 2 * I, *u = g + I;
        float *a = c->act + (int64_t)r * I;
        int i = 0;
        for (; i + 8 <= I; i += 8) {
            __m256 gv = _mm256_loadu_ps(g + i);
            __m256 sig = _mm256_div_ps(gv, _mm256_add_ps(_mm256_set1_ps(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), gv))));
            _mm256_storeu_ps(a + i, _mm256_mul_ps(sig, _mm256_loadu_ps(u + i)));
        }
        for (; i < I; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

// act[M, I] = gelu_tanh(gate) * up: 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))), tanh(y) = 1 - 2 / (e^2y + 1)
static void geglu_rows(void *ctx, int64_t r0, int64_t r1) {
    const Glu *c = ctx;
    const int I = c->I;
    const __m256 k0 = _mm256_set1_ps(0.7978845608028654f), k1 = _mm256_set1_ps(0.044715f), one = _mm256_set1_ps(1.0f),
                 two = _mm256_set1_ps(2.0f), half = _mm256_set1_ps(0.5f);
    for (int r = r0; r < r1; r++) {
        const float *g = c->gu + (int64_t)r * 2 * I, *u = g + I;
        float *a = c->act + (int64_t)r * I;
        int i = 0;
        for (; i + 8 <= I; i += 8) {
            const __m256 x = _mm256_loadu_ps(g + i);
            const __m256 y = _mm256_mul_ps(k0, _mm256_add_ps(x, _mm256_mul_ps(k1, _mm256_mul_ps(x, _mm256_mul_ps(x, x)))));
            const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(exp8(_mm256_mul_ps(two, y)), one)));
            _mm256_storeu_ps(a + i, _mm256_mul_ps(_mm256_mul_ps(half, _mm256_mul_ps(x, _mm256_add_ps(one, t))),
                                                  _mm256_loadu_ps(u + i)));
        }
        for (; i < I; i++) {
            const float x = g[i], y = 0.7978845608028654f * (x + 0.044715f * (x * (x * x)));
            a[i] = 0.5f * (x * (1.0f + (1.0f - 2.0f / (expf(2.0f * y) + 1.0f)))) * u[i];
        }
    }
}

static void gated(const Layer *L, const float *gu, int M, int I, float *act) {    // the MLP's gate times up
    Glu a = {gu, I, act};
    parallel_for(M, M * I >= 4096 ? 1 : M, L->act == GELU_TANH ? geglu_rows : swiglu_rows, &a);
}

typedef struct {            // block_qkv's rotation and cache writes, for its parallel tasks
    const Layer *L;
    int T;
    const float *cos, *sin;
    void *kc, *vc;
    int kv16;
    int64_t rs;
    int max_len;
    const int *starts;
    float *qkv;
} Rotation;

// rows r0..r1 of qkv: q and k rotated, k and v written to the cache
static void rotate_rows(void *ctx, int64_t r0, int64_t r1) {
    const Rotation *a = ctx;
    const int H = a->L->H, Hkv = a->L->Hkv, hd = a->L->hd, Q = (H + 2 * Hkv) * hd, T = a->T, kv16 = a->kv16;
    const float *cos = a->cos, *sin = a->sin;
    void *kc = a->kc, *vc = a->vc;
    const int64_t rs = a->rs;
    const int max_len = a->max_len, *starts = a->starts;
    for (int r = r0; r < r1; r++) {
        int b = r / T, t = r % T;
        float *row = a->qkv + (int64_t)r * Q;
        if (a->L->q_norm) {                         // per head, as rms_norm computes a row
            rms_norm_rows(row, H, hd, a->L->q_norm, a->L->eps, row);
            rms_norm_rows(row + H * hd, Hkv, hd, a->L->k_norm, a->L->eps, row + H * hd);
        }
        for (int j = 0; j < H + Hkv; j++) rotate(row + j * hd, cos + r * hd, sin + r * hd, hd);
        for (int g = 0; g < Hkv; g++) {
            int64_t at = b * rs + ((int64_t)g * max_len + starts[b] + t) * hd;
            const float *k = row + (H + g) * hd, *v = row + (H + Hkv + g) * hd;
            if (kv16) {
                uint16_t *kb = (uint16_t *)kc + at, *vb = (uint16_t *)vc + at;
                int d = 0;
                for (; d + 8 <= hd; d += 8) {
                    store_bf16(kb + d, _mm256_loadu_ps(k + d));
                    store_bf16(vb + d, _mm256_loadu_ps(v + d));
                }
                for (; d < hd; d++) {
                    kb[d] = float_to_bf16(k[d]);
                    vb[d] = float_to_bf16(v[d]);
                }
            } else {
                memcpy((float *)kc + at, k, sizeof(float) * hd);
                memcpy((float *)vc + at, v, sizeof(float) * hd);
            }
        }
    }
}

// Rows idx[0..n) of a [*, w] matrix to and from n packed rows: a padded batch's real tokens (model_forward's lens).
static void gather_rows(float *dst, const float *src, const int *idx, int n, int w) {
    for (int i = 0; i < n; i++) memcpy(dst + (int64_t)i * w, src + (int64_t)idx[i] * w, sizeof(float) * w);
}

static void scatter_rows(float *dst, const float *src, const int *idx, int n, int w) {
    for (int i = 0; i < n; i++) memcpy(dst + (int64_t)idx[i] * w, src + (int64_t)i * w, sizeof(float) * w);
}

// A layer's first half for T new tokens of each of B sequences: qkv[B*T, (H + 2 Hkv) * hd] <- the
// rotated q and k and the v of rms_norm(h), with cos/sin [B*T, hd] the rotary tables; the keys and
// values also go into the cache: row b's live at elements kc/vc + b * rs ([Hkv, max_len, hd] each,
// float32 or bf16 where kv16), its new tokens at offsets starts[b]... With idx, h holds only the Mv tokens
// idx[0..Mv) of the B*T (the others pad a batch of trees of several sizes): only they go through the products,
// and the pads' rows of qkv are zeros, which no real token's attention sees.
void block_qkv(const Layer *L, const float *h, const int *idx, int Mv, int B, int T, const float *cos,
               const float *sin, void *kc, void *vc, int kv16, int64_t rs, int max_len, const int *starts, float *qkv) {
    int D = L->D, H = L->H, Hkv = L->Hkv, hd = L->hd, Q = (H + 2 * Hkv) * hd, M = B * T;
    float *x = malloc(sizeof(float) * Mv * D);
    rms_norm(h, Mv, D, L->attn_norm, L->eps, x);
    if (idx) {
        float *part = malloc(sizeof(float) * Mv * Q);
        linear(x, Mv, D, L->qkv, L->kind[0], L->qkv_s, Q, L->qkv_b, part);
        memset(qkv, 0, sizeof(float) * M * Q);
        scatter_rows(qkv, part, idx, Mv, Q);
        free(part);
    } else
        linear(x, M, D, L->qkv, L->kind[0], L->qkv_s, Q, L->qkv_b, qkv);
    free(x);
    Rotation a = {L, T, cos, sin, kc, vc, kv16, rs, max_len, starts, qkv};
    parallel_for(M, M >= 64 ? 1 : M, rotate_rows, &a);
}

typedef struct {
    float *h;
    const float *x;
} Sum;

static void add_range(void *ctx, int64_t i0, int64_t i1) {
    const Sum *a = ctx;
    for (int64_t i = i0; i < i1; i++) a->h[i] += a->x[i];
}

static void add(float *h, const float *x, int n) {     // h += x (the residual stream)
    Sum a = {h, x};
    parallel_for(n, n >= 65536 ? 4096 : n, add_range, &a);
}

// A layer's second half for M tokens: h[M, D] += o(att[M, H*hd]), then h += mlp(rms_norm(h)); on a
// tensor-parallel shard each part is summed over the ranks (L->reduce) before it is added.
void block_out(const Layer *L, float *h, int M, const float *att) {
    int D = L->D, I = L->I;
    float *x = malloc(sizeof(float) * M * D), *act = malloc(sizeof(float) * M * I);
    linear(att, M, L->H * L->hd, L->o, L->kind[1], L->o_s, D, L->o_b, x);
    if (L->reduce) L->reduce(x, M * D);                          // this rank's heads' part -> the whole
    if (L->attn_post) rms_norm(x, M, D, L->attn_post, L->eps, x);
    add(h, x, M * D);
    rms_norm(h, M, D, L->mlp_norm, L->eps, x);
    if (L->glu)                                                  // SwiGLU in the tile product's epilogue
        amx_glu(x, M, D, L->gate_up, I, L->gate_up_b, act);
    else {
        float *gu = malloc(sizeof(float) * M * 2 * I);
        linear(x, M, D, L->gate_up, L->kind[2], L->gate_up_s, 2 * I, L->gate_up_b, gu);
        gated(L, gu, M, I, act);
        free(gu);
    }
    linear(act, M, I, L->down, L->kind[3], L->down_s, D, L->down_b, x);
    if (L->reduce) L->reduce(x, M * D);                          // this rank's MLP columns' part -> the whole
    if (L->mlp_post) rms_norm(x, M, D, L->mlp_post, L->eps, x);
    add(h, x, M * D);
    free(x); free(act);
}


// att[B*T, H*hd] <- a layer's attention over h[B*T, D]: block_qkv, then each row's attention (token t of
// row b sees key j where mask[(b * T + t) * ms + j] or, without a mask, j <= starts[b] + t). The products
// run over all B*T rows at once and the attention row by row, so a row's result does not depend on the
// others. With idx, h holds only the tokens idx[0..Mv) (block_qkv).
static void attention_half(const Layer *L, const float *h, const int *idx, int Mv, int B, int T, const float *cos,
                           const float *sin, void *kc, void *vc, int kv16, int64_t rs, int max_len, const int *starts,
                           const uint8_t *mask, int ms, float *att) {
    int H = L->H, Hkv = L->Hkv, hd = L->hd, Q = (H + 2 * Hkv) * hd, M = B * T;
    float *qkv = malloc(sizeof(float) * M * Q);
    block_qkv(L, h, idx, Mv, B, T, cos, sin, kc, vc, kv16, rs, max_len, starts, qkv);
    const int S = attention_tasks(T * (H / Hkv), Hkv);          // a kv head's query rows, in S parts
    Attention a = {attend_head_for(hd), qkv, Q, kc, vc, kv16, max_len, starts, 0, 0, mask, ms, T, H, Hkv, hd, S, rs, att};
    parallel_tasks((int64_t)B * Hkv * S, attention_parts, &a);     // one parallel loop for the batch
    free(qkv);
}

// h <- layer(h): attention_half, then block_out (with idx, over h's Mv tokens only).
static void block_forward(const Layer *L, float *h, const int *idx, int Mv, int B, int T, const float *cos,
                          const float *sin, void *kc, void *vc, int kv16, int64_t rs, int max_len, const int *starts,
                          const uint8_t *mask, int ms) {
    const int HD = L->H * L->hd;
    float *att = malloc(sizeof(float) * B * T * HD);
    attention_half(L, h, idx, Mv, B, T, cos, sin, kc, vc, kv16, rs, max_len, starts, mask, ms, att);
    if (idx) {
        float *part = malloc(sizeof(float) * Mv * HD);
        gather_rows(part, att, idx, Mv, HD);
        block_out(L, h, Mv, part);
        free(part);
    } else
        block_out(L, h, B * T, att);
    free(att);
}

typedef struct {            // group_forward's attention halves, for its parallel tasks
    const Layer *const *Ls;
    const float *h;
    int B, T;
    const float *cos, *sin;
    void *const *kc, *const *vc;
    int kv16;
    int64_t rs;
    int max_len;
    const int *starts;
    const uint8_t *mask;
    int ms;
    float **att;
} Group;

static void group_halves(void *ctx, int64_t j0, int64_t j1) {
    const Group *a = ctx;
    for (int64_t j = j0; j < j1; j++)
        attention_half(a->Ls[j], a->h, NULL, a->B * a->T, a->B, a->T, a->cos, a->sin, a->kc[j], a->vc[j], a->kv16,
                       a->rs, a->max_len, a->starts, a->mask, a->ms, a->att[j]);
}

// h <- EasySpec's hyper-layer of layers[0..n) (model.layer_parallel): every attention half reads the group's
// input h, each on a thread of its own (the products inside it then run on that one thread: one parallel
// region for the group instead of several per layer); then each layer's block_out, in order.
static void group_forward(const Layer *const *Ls, int n, float *h, int B, int T, const float *cos, const float *sin,
                          void *const *kc, void *const *vc, int kv16, int64_t rs, int max_len, const int *starts,
                          const uint8_t *mask, int ms) {
    float **att = malloc(sizeof(float *) * n);
    for (int j = 0; j < n; j++) att[j] = malloc(sizeof(float) * B * T * Ls[j]->H * Ls[j]->hd);
    Group a = {Ls, h, B, T, cos, sin, kc, vc, kv16, rs, max_len, starts, mask, ms, att};
    parallel_for(n, 1, group_halves, &a);
    for (int j = 0; j < n; j++) {
        block_out(Ls[j], h, B * T, att[j]);
        free(att[j]);
    }
    free(att);
}

// cos/sin [M, hd] for positions [M]: angle i = (float32) position * inv_freq[i], as the model computes it
void rotary_tables(const float *inv_freq, const int64_t *positions, int M, int hd, float *cos, float *sin) {
    const int half = hd / 2;
    for (int r = 0; r < M; r++)
        for (int i = 0; i < half; i++) {
            float angle = (float)positions[r] * inv_freq[i];
            cos[r * hd + i] = cos[r * hd + half + i] = cosf(angle);
            sin[r * hd + i] = sin[r * hd + half + i] = sinf(angle);
        }
}

typedef struct Ends {          // a model's ends around its layers (kernels.CForward fills it)
    int D, V, hd, kind;     // hidden size, vocabulary, head dim, the head's weight kind
    int embed_kind;         // F32, or GGUF: the embedding is a file's Matrix, its rows dequantized when looked up
    float eps;              // the final norm's
    const void *embed;      // [V, D] of that kind
    const float *inv_freq;  // [hd / 2] rotary inverse frequencies
    const float *norm;      // [D]
    const void *head;       // [V, D] of that kind
    const float *head_s, *head_b;   // int8 scales, bias, or NULL
    const float *inv_freq_local;    // the sliding layers' rotary frequencies where they have their own, or NULL
    float embed_scale;              // embeddings times this (Gemma: sqrt(D)), or 0: as they are
} Ends;

// A small forward in one call: T new tokens of each of B sequences through layers[0..n), one after
// another (attention_half's contract for the caches, layer l's at kc[l], vc[l], starts and mask), or in
// groups of consecutive layers run as group_forward (groups: ngroups sizes adding up to n; NULL: every layer
// alone). In: token ids [B*T] (embedded here), or hidden states h [B*T, D] where ids is NULL; positions
// [B*T] give the rotary angles (float32 position * inv_freq, as the model computes them). Out: h, and where
// tail > 0 the logits [B, tail, V] of each sequence's last tail tokens after the final norm. lens (or NULL): row b's
// first lens[b] tokens are real and the rest pad it to T (a batch of trees of several sizes), for a forward
// without groups whose tail is 0 or T: only the real tokens go through the products, a CPU's cost per token, and
// each comes out as it would padded (a row's result does not depend on the others).
void model_forward(const Ends *E, const Layer *const *layers, int n, const int64_t *ids, float *h, int B, int T,
                   const int64_t *positions, void *const *kc, void *const *vc, int kv16, int64_t rs, int max_len,
                   const int *starts, const uint8_t *mask, int ms, int tail, float *logits, const int *groups,
                   int ngroups, const int *lens, const uint8_t *window_mask) {
    const int M = B * T, D = E->D, hd = E->hd;
    if (ids && E->embed_kind == GGUF)
        gguf_rows(E->embed, D, ids, M, h);
    else if (ids)
        for (int r = 0; r < M; r++) memcpy(h + (int64_t)r * D, (const float *)E->embed + ids[r] * D, sizeof(float) * D);
    if (ids && E->embed_scale)
        for (int64_t i = 0; i < (int64_t)M * D; i++) h[i] *= E->embed_scale;
    float *cos = malloc(sizeof(float) * M * hd * 2), *sin = malloc(sizeof(float) * M * hd * 2);
    rotary_tables(E->inv_freq, positions, M, hd, cos, sin);
    if (E->inv_freq_local) rotary_tables(E->inv_freq_local, positions, M, hd, cos + M * hd, sin + M * hd);
    // lens: row b's first lens[b] tokens are real, the rest pad it to T; the layers run on the real ones only
    int Mv = 0, *idx = NULL;
    float *hv = h;
    if (lens && !groups && (tail == 0 || tail == T)) {
        idx = malloc(sizeof(int) * M);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < lens[b] && t < T; t++) idx[Mv++] = b * T + t;
        if (Mv < M) {
            hv = malloc(sizeof(float) * Mv * D);
            gather_rows(hv, h, idx, Mv, D);
        } else {
            free(idx);
            idx = NULL;
        }
    }
    if (!idx) Mv = M;
    for (int l = 0, g = 0; l < n; l += groups ? groups[g++] : 1) {
        if (groups && groups[g] > 1)
            group_forward(layers + l, groups[g], h, B, T, cos, sin, kc + l, vc + l, kv16, rs, max_len, starts, mask, ms);
        else
        {   // a sliding layer: its own rotary tables where the model has them, and the window's mask where it hides keys
            const int local = layers[l]->local, own = local && E->inv_freq_local ? M * hd : 0;
            block_forward(layers[l], hv, idx, Mv, B, T, cos + own, sin + own, kc[l], vc[l], kv16, rs, max_len, starts,
                          local && window_mask ? window_mask : mask, ms);
        }
    }
    if (tail > 0 && idx) {                      // every token's logits (tail == T): the pads' are zeros
        float *x = malloc(sizeof(float) * Mv * D), *part = malloc(sizeof(float) * Mv * E->V);
        rms_norm(hv, Mv, D, E->norm, E->eps, x);
        linear(x, Mv, D, E->head, E->kind, E->head_s, E->V, E->head_b, part);
        memset(logits, 0, sizeof(float) * M * E->V);
        scatter_rows(logits, part, idx, Mv, E->V);
        free(x);
        free(part);
    } else if (tail > 0) {
        float *x = malloc(sizeof(float) * B * tail * D);
        for (int b = 0; b < B; b++)
            rms_norm(h + ((int64_t)b * T + T - tail) * D, tail, D, E->norm, E->eps, x + (int64_t)b * tail * D);
        linear(x, B * tail, D, E->head, E->kind, E->head_s, E->V, E->head_b, logits);
        free(x);
    } else if (idx)                             // hidden states out: the pads' rows keep their embeddings
        scatter_rows(h, hv, idx, Mv, D);
    if (idx) {
        free(hv);
        free(idx);
    }
    free(cos);
    free(sin);
}

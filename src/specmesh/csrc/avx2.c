// Kernels for bf16-weight models on CPUs without native bf16 (see kernels.py).
// bf16_linear: y[M,N] = x[M,K] . w[N,K]^T (+ bias[N]), bf16 weights, float32 activations and
//   accumulation; one pass over the weights serves up to 8 input rows, so a few rows cost
//   about what one row costs (the product is memory-bound).
// rms_norm: one call instead of six PyTorch ops per norm.
// Both compute each row the same way whatever M is, so results do not depend on batching.
#include <immintrin.h>
#include <math.h>
#include <stdint.h>

static inline __m256 load_bf16(const uint16_t *p) {    // 8 bf16 -> 8 float32 (exact)
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

static inline float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline float bf16_to_float(uint16_t h) {
    union { uint32_t u; float f; } v = { (uint32_t)h << 16 };
    return v.f;
}

// rows [m0, m0 + MB) of y at column n; MB is a constant at every call site, so the
// accumulators stay in registers
static inline void dot_rows(const float *x, int K, const uint16_t *row, const float *bias, float *y,
                            int N, int n, int m0, const int MB) {
    __m256 acc[8];
    for (int i = 0; i < MB; i++) acc[i] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv = load_bf16(row + k);
        for (int i = 0; i < MB; i++)
            acc[i] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + (int64_t)(m0 + i) * K + k), acc[i]);
    }
    for (int i = 0; i < MB; i++) {
        float s = hsum(acc[i]);
        for (int kk = k; kk < K; kk++) s += bf16_to_float(row[kk]) * x[(int64_t)(m0 + i) * K + kk];
        y[(int64_t)(m0 + i) * N + n] = s + (bias ? bias[n] : 0.0f);
    }
}

void bf16_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y) {
    #pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const uint16_t *row = w + (int64_t)n * K;
        for (int m0 = 0; m0 < M; m0 += 8) {
            switch (M - m0 < 8 ? M - m0 : 8) {
                case 1: dot_rows(x, K, row, bias, y, N, n, m0, 1); break;
                case 2: dot_rows(x, K, row, bias, y, N, n, m0, 2); break;
                case 3: dot_rows(x, K, row, bias, y, N, n, m0, 3); break;
                case 4: dot_rows(x, K, row, bias, y, N, n, m0, 4); break;
                case 5: dot_rows(x, K, row, bias, y, N, n, m0, 5); break;
                case 6: dot_rows(x, K, row, bias, y, N, n, m0, 6); break;
                case 7: dot_rows(x, K, row, bias, y, N, n, m0, 7); break;
                default: dot_rows(x, K, row, bias, y, N, n, m0, 8); break;
            }
        }
    }
}

// y[M,D] = w * (x * rsqrt(mean(x^2) + eps)), row by row (RMSNorm in float32)
void rms_norm(const float *x, int M, int D, const float *w, float eps, float *y) {
    for (int m = 0; m < M; m++) {
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

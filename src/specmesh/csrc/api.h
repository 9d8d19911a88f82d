// The functions specmesh calls from Python, each declared once: kernels/build.py reads their ctypes
// signatures from this file, and every C file defining one includes it, so the compiler checks the
// definitions against it. Types kernels/build.py knows: void, int, float, double, int64_t, uint32_t, int32_t,
// and pointers (Layer * and Matrix * as their ctypes structures, any other as an address).
#pragma once
#include <stdint.h>

typedef struct Layer Layer;     // one decoder layer's weights (csrc/avx2.c; kernels.LayerWeights)
typedef struct Ends Ends;       // a model's embedding, final norm and head (csrc/avx2.c; kernels.ModelEnds)
typedef struct Matrix Matrix;   // a GGUF file's matrix as it is (csrc/blocks.h; kernels.Matrix)

// y[M,N] = x[M,K] w[N,K]^T + bias, by the weights' kind (csrc/avx2.c)
void f32_linear(const float *x, int M, int K, const float *w, int N, const float *bias, float *y);
void bf16_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y);
void fma_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y);
void i8_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y);
void q8_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y);
void q4_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y);
void q41_linear(const float *x, int M, int K, const int8_t *w, const float *scale, int N, const float *bias, float *y);
void rms_norm(const float *x, int M, int D, const float *w, float eps, float *y);
void use_avx512(int on);
void use_vnni(int on);

// a model's forward, or a layer's halves around an attention (csrc/avx2.c)
void model_forward(const Ends *E, const Layer *const *layers, int n, const int64_t *ids, float *h, int B, int T,
                   const int64_t *positions, void *const *kc, void *const *vc, int kv16, int64_t rs, int max_len,
                   const int *starts, const uint8_t *mask, int ms, int tail, float *logits, const int *groups,
                   int ngroups, const int *lens, const uint8_t *window_mask);
void block_qkv(const Layer *L, const float *h, const int *idx, int Mv, int B, int T, const float *cos,
               const float *sin, void *kc, void *vc, int kv16, int64_t rs, int max_len, const int *starts, float *qkv);
void block_out(const Layer *L, float *h, int M, const float *att);
void rotary_tables(const float *inv_freq, const int64_t *positions, int M, int hd, float *cos, float *sin);
void attend(const float *q, int qs, const void *kc, const void *vc, int kv16, int max_len, int start, int kv_len,
            const uint8_t *mask, int ms, int M, int H, int Hkv, int hd, float *out);

// AVX-512, AMX and the bf16 dot product: where csrc/avx512.c builds (absent from the library elsewhere)
int amx_init(void);
void amx_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y);
void amx_glu(const float *x, int M, int K, const uint16_t *w, int I, const float *bias, float *act);
void amx_attention(const float *q, int qs, const uint16_t *kc, const uint16_t *vc, int max_len, int start, int T,
                   int H, int Hkv, float *out);
void attend512(const float *q, int qs, const void *kc, const void *vc, int kv16, int max_len, int start, int kv_len,
               const uint8_t *mask, int ms, int M, int H, int Hkv, int hd, float *out);
void dp_linear(const float *x, int M, int K, const uint16_t *w, int N, const float *bias, float *y);
double mac_rate(int dot);

// a GGUF file's blocks as they are (csrc/blocks.c)
void gguf_linear(const float *x, int M, int K, const Matrix *w, int N, const float *bias, float *y);
void gguf_rows(const Matrix *w, int K, const int64_t *ids, int n, float *out);
int gguf_dequantize(int type, const uint8_t *src, int64_t n, float *out);
void gguf_grid(int type, const float *grid, int64_t n, const uint8_t *ksigns);   // an IQ kind's grid (csrc/grids.c)
int gguf_kernel(int type, int K);
int64_t gguf_packed_bytes(int type, int rows, int K);
void gguf_pack(const Matrix *w, int part, int K, int64_t g0, int64_t g1, uint8_t *out);
void use_tiles(int on);

// the threads, and the words the ranks of a multi-process method share (csrc/pool.c)
void pool_use(int own);
void pool_lend(const int32_t *busy, int ranks, int cores);
void shared_wait(uint32_t *word, uint32_t seen, double timeout_s);
void shared_wake(uint32_t *word);

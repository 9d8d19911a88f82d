// Widening bf16 weights for 512-bit FMA three ways, in one 6-row x 4-block step (24 accumulators) over K of a
// block in L1/L2: 0 shift and mask on the FMA ports (fma512_linear), 1 and 2 masked word loads (load ports only).
// All three run at ~75 multiply-adds a ns a core on the Xeon of 2026-11-28 (mac_rate: 83): the widening is not
// what holds fma512_linear below the FMA peak. Every output equal (printed "same").
#include <immintrin.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <stdlib.h>
#include <string.h>
#include "steps.h"   // python3 widen-steps.py; gcc -O3 -march=native widen-ab.c; ./a.out [K]
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define Z(i) "vpxord %%zmm" #i ", %%zmm" #i ", %%zmm" #i "\n\t"
#define ST(i) "vmovups %%zmm" #i ", " #i "*64(%[o])\n\t"
#define CLOB "zmm0","zmm1","zmm2","zmm3","zmm4","zmm5","zmm6","zmm7","zmm8","zmm9","zmm10","zmm11","zmm12","zmm13","zmm14","zmm15","zmm16","zmm17","zmm18","zmm19","zmm20","zmm21","zmm22","zmm23","zmm24","zmm25","zmm26","zmm27","zmm28","zmm29","zmm30","zmm31","k1","eax","memory","cc"
#define RUN(mode) \
__attribute__((noinline)) void run##mode(const float *x, int K, const uint16_t *wb, int64_t next, float *out) { \
    int64_t s = (int64_t)K * 4, n = next * 2, cnt = K / 2; \
    const float *yp = x + 3 * K; const uint16_t *vp = wb + 3 * next; \
    __asm__ volatile( \
        "movl $0xFFFF0000, %%eax\n\tvpbroadcastd %%eax, %%zmm28\n\tmovl $0xAAAAAAAA, %%eax\n\tkmovd %%eax, %%k1\n\t" \
        Z(0) Z(1) Z(2) Z(3) Z(4) Z(5) Z(6) Z(7) Z(8) Z(9) Z(10) Z(11) Z(12) Z(13) Z(14) Z(15) Z(16) Z(17) Z(18) Z(19) Z(20) Z(21) Z(22) Z(23) \
        "1:\n\t" STEP##mode \
        "add $8, %[x]\n\tadd $8, %[y]\n\tadd $64, %[w]\n\tadd $64, %[v]\n\tdec %[c]\n\tjnz 1b\n\t" \
        ST(0) ST(1) ST(2) ST(3) ST(4) ST(5) ST(6) ST(7) ST(8) ST(9) ST(10) ST(11) ST(12) ST(13) ST(14) ST(15) ST(16) ST(17) ST(18) ST(19) ST(20) ST(21) ST(22) ST(23) \
        : [x]"+r"(x), [y]"+r"(yp), [w]"+r"(wb), [v]"+r"(vp), [c]"+r"(cnt) : [s]"r"(s), [n]"r"(n), [o]"r"(out) : CLOB); \
}
RUN(0) RUN(1) RUN(2)
int main(int argc, char **argv) {
    int K = argc > 1 ? atoi(argv[1]) : 512; int64_t next = K / 2 * 32;
    uint16_t *wbuf = aligned_alloc(64, (4 * next + 64) * 2);
    uint16_t *w = wbuf + 32;
    for (int64_t i = 0; i < 4 * next + 32; i++) wbuf[i] = 0x3F80 + (rand() & 0x7F);
    float *x = aligned_alloc(64, 6 * K * 4); for (int i = 0; i < 6 * K; i++) x[i] = (rand() % 100) / 100.0f;
    float out[3][64 * 6];
    for (int rep = 0; rep < 3; rep++)
    for (int mode = 0; mode < 3; mode++) {
        int n = 20000 * 512 / K; double t = now();
        for (int r = 0; r < n; r++) (mode==0?run0:mode==1?run1:run2)(x, K, w, next, out[mode]);
        t = now() - t;
        printf("mode %d: %.1f MAC/ns\n", mode, (double)n * 24 * 16 * K / t / 1e9);
    }
    printf("same: %d %d\n", memcmp(out[0], out[1], sizeof out[0]) == 0, memcmp(out[0], out[2], sizeof out[0]) == 0);
}

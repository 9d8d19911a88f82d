// Two processes taking turns through a futex in shared memory, 200 us of work a turn: gcc -O2 pingpong.c; ./a.out SPIN_US
// (poll this long before sleeping). Prints the cost of a hand-off beyond the work.
#define _GNU_SOURCE
#include <linux/futex.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>
#include <sys/wait.h>
#include <stdlib.h>
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void fwait(_Atomic uint32_t *w, uint32_t v){ syscall(SYS_futex, w, FUTEX_WAIT, v, NULL, NULL, 0); }
static void fwake(_Atomic uint32_t *w){ syscall(SYS_futex, w, FUTEX_WAKE, 1, NULL, NULL, 0); }
int main(int argc, char **argv) {
    int spin_us = atoi(argv[1]);   // poll this long before sleeping
    _Atomic uint32_t *m = mmap(NULL, 4096, PROT_READ|PROT_WRITE, MAP_SHARED|MAP_ANONYMOUS, -1, 0);
    int n = 5000;
    pid_t pid = fork();
    int me = pid == 0;
    double t0 = now();
    for (uint32_t i = 0; i < n; i++) {
        uint32_t want = 2 * i + me;      // parent waits for even turns? turn counter m[0]
        // wait for my turn
        double s = now();
        while (atomic_load(&m[0]) != want) {
            if ((now() - s) * 1e6 > spin_us) { uint32_t v = atomic_load(&m[0]); if (v != want) fwait(&m[0], v); }
        }
        // busy work ~ 200us
        double w = now(); while ((now() - w) < 200e-6) ;
        atomic_store(&m[0], want + 1); fwake(&m[0]);
    }
    if (me) return 0;
    wait(NULL);
    double t = now() - t0;
    printf("spin %d us: %.1f us per hand-off (work 200)\n", spin_us, t / (2 * n) * 1e6 - 200);
}

// The kernels' parallel loops: OpenMP's team by default, or the pool's own threads in the processes of a
// multi-process method (pool_lend), where a process may borrow the cores of ranks that are waiting.
//
// Why: the ranks of a method such as pp or pearl take turns (one waits while another computes), so a rank
// could use every core while the others wait. OpenMP's idle threads spin on their core for ~8 ms after a
// loop (libgomp reads its spin count once, at start), on the core that the next rank to compute needs. The
// pool's threads give a borrowed core back as soon as its owner is about to compute (the rank that sends it
// a message marks it busy first: runtime/link.py) and sleep on a futex.
//
// `busy` (shared memory, one int per rank) holds each rank's threads while it computes and 0 while it waits;
// a loop runs on this rank's own threads (omp_get_max_threads) plus the cores no busy rank holds. Only
// spinning threads are given work (a sleeping one is woken for the loops after), so a loop never waits for
// a thread to wake.
#define _GNU_SOURCE
#include "pool.h"
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_WORKERS 63
#define POKE 0x80000000u            // a worker's `go` with this bit: wake and spin, no loop to join
#define SPIN_NS 2000000             // a worker spins this long after its last loop, then sleeps

enum { SLEEPING, SPINNING };

static struct Worker {
    _Atomic uint32_t go;            // the loop it is given (or a poke): its futex word
    _Atomic uint32_t done;          // the last loop it finished
    _Atomic int state;
    pthread_t thread;
} workers[MAX_WORKERS];

static struct {
    int on, started, cores, ranks, base;
    const _Atomic int32_t *busy;    // ranks' threads while they compute (shared memory), or NULL
    uint32_t loop;
    Task task;
    void *ctx;
    int64_t n, grain, pieces;
    _Atomic int64_t next;           // the next piece to take
} pool;

static __thread int in_loop;        // a loop inside a loop's task runs on its thread alone

static void futex(_Atomic uint32_t *word, int op, uint32_t value) {
    syscall(SYS_futex, (uint32_t *)word, op | FUTEX_PRIVATE_FLAG, value, NULL, NULL, 0);
}

static int64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static int own_threads(void) {
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static int free_cores(void) {       // cores no busy rank holds
    int held = 0;
    for (int r = 0; r < pool.ranks; r++) held += atomic_load(&pool.busy[r]);
    return pool.cores - held;
}

int team_size(void) {
    int base = own_threads();
    if (!pool.on || !pool.busy) return base;
    int team = base + (free_cores() > 0 ? free_cores() : 0);
    return team > pool.cores ? pool.cores : team > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : team;
}

static void take_pieces(void) {
    int64_t p;
    in_loop = 1;
    while ((p = atomic_fetch_add(&pool.next, 1)) < pool.pieces) {
        int64_t end = (p + 1) * pool.grain;
        pool.task(pool.ctx, p * pool.grain, end < pool.n ? end : pool.n);
    }
    in_loop = 0;
}

// Worker i is the team's member i + 1; it may spin while its core is its rank's own or free.
static int may_spin(int i) {
    return i + 1 < pool.base || (pool.busy && free_cores() > i + 1 - pool.base);
}

static void *work(void *arg) {
    struct Worker *w = arg;
    int i = (int)(w - workers);
    uint32_t seen = 0;                  // go's first value: the caller may give it a loop before it runs
    int64_t until = now_ns() + SPIN_NS;
    for (int polls = 0;; polls++) {
        uint32_t go = atomic_load(&w->go);
        if (go != seen) {
            seen = go;
            if (!(go & POKE)) {
                take_pieces();
                atomic_store(&w->done, go);
            }
            until = now_ns() + SPIN_NS;
            continue;
        }
        if ((polls & 63) == 0 && (!may_spin(i) || now_ns() > until)) {
            atomic_store(&w->state, SLEEPING);
            if (atomic_load(&w->go) == seen) futex(&w->go, FUTEX_WAIT, seen);
            atomic_store(&w->state, SPINNING);
            until = now_ns() + SPIN_NS;
            continue;
        }
        _mm_pause();
    }
    return NULL;
}

static void start_workers(int n) {
    for (; pool.started < n && pool.started < MAX_WORKERS; pool.started++) {
        struct Worker *w = &workers[pool.started];
        atomic_store(&w->state, SPINNING);
        pthread_create(&w->thread, NULL, work, w);
    }
}

// The pool's loop: spinning workers take pieces with the caller; sleeping ones wanted are woken for later loops.
static void pool_for(int team) {
    start_workers(team - 1);
    uint32_t loop = pool.loop = (pool.loop + 1) & ~POKE ? (pool.loop + 1) & ~POKE : 1;
    atomic_store(&pool.next, 0);
    int given[MAX_WORKERS], n = 0;
    for (int i = 0; i < team - 1; i++) {
        struct Worker *w = &workers[i];
        if (atomic_load(&w->state) == SPINNING) {
            atomic_store(&w->go, loop);
            given[n++] = i;
            if (atomic_load(&w->state) == SLEEPING) futex(&w->go, FUTEX_WAKE, 1);   // it fell asleep meanwhile
        } else {
            atomic_store(&w->go, loop | POKE);
            futex(&w->go, FUTEX_WAKE, 1);
        }
    }
    take_pieces();
    for (int k = 0; k < n; k++)
        while (atomic_load(&workers[given[k]].done) != loop) _mm_pause();
}

static void run(int64_t n, int64_t grain, Task task, void *ctx, int dynamic) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    const int64_t pieces = (n + grain - 1) / grain;
    int nested = in_loop;
#ifdef _OPENMP
    nested |= omp_in_parallel();
#endif
    const int team = nested || pieces == 1 ? 1 : team_size();
    if (team == 1) {
        task(ctx, 0, n);
        return;
    }
    if (pool.on) {
        pool.base = own_threads();
        pool.task = task, pool.ctx = ctx, pool.n = n, pool.grain = grain, pool.pieces = pieces;
        pool_for(team);
        return;
    }
    if (dynamic) {                  // OpenMP's team (omp_in_parallel marks its loops' nested ones)
        #pragma omp parallel for schedule(dynamic)
        for (int64_t p = 0; p < pieces; p++) task(ctx, p * grain, (p + 1) * grain < n ? (p + 1) * grain : n);
    } else {
        #pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < pieces; p++) task(ctx, p * grain, (p + 1) * grain < n ? (p + 1) * grain : n);
    }
}

void parallel_for(int64_t n, int64_t grain, Task task, void *ctx) { run(n, grain, task, ctx, 0); }

void parallel_tasks(int64_t n, Task task, void *ctx) { run(n, 1, task, ctx, 1); }

// Python (kernels/select.py, runtime/link.py): switch the pool on for this process's multi-process method
// (busy: the ranks' words in shared memory, `ranks` of them, on a machine of `cores`), or off (busy NULL).
void pool_lend(const int32_t *busy, int ranks, int cores) {
    pool.busy = (const _Atomic int32_t *)busy, pool.ranks = ranks, pool.cores = cores;
    pool.on = busy != NULL;
}

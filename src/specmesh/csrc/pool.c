// The kernels' parallel loops, on the pool's own threads: every process's (a single-process method's too), where
// a multi-process method's rank may also borrow the cores of ranks that are waiting (pool_lend). On CPUs whose
// bf16 products run on AMX tiles the loops stay on OpenMP's team (pool_use(0)): the tile kernels' own OpenMP
// regions share its threads, and two teams would take turns on the cores.
//
// Why not OpenMP's team: a static share waits for the thread that owns it, and libgomp's idle threads spin
// on their core for ~8 ms after a loop (its spin count is read once, at start). Where another process wants the
// same cores (a second server, a benchmark beside a build, a rank of a multi-process method) a descheduled
// thread holds up every loop and a spinning one keeps the core from the thread it waits for: two processes of
// two threads on two cores each ran at ~1/25 of their speed alone. Here the caller waits only for pieces that
// were taken (not for threads that were given a loop and have not started), and a wait that lasts past a few
// microseconds yields its core as it polls (sched_yield): alone a yield returns at once, beside another process
// it lets that one run.
//
// Lending: `busy` (shared memory, one int per rank) holds each rank's threads while it computes and 0 while it
// waits; a loop runs on this rank's own threads (omp_get_max_threads) plus the cores no busy rank holds. The
// rank that sends a waiting rank a message marks it busy first (runtime/link.py), so borrowed cores are given
// back at once; idle workers then sleep on a futex.
#define _GNU_SOURCE
#include "api.h"
#include "pool.h"
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <immintrin.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define MAX_WORKERS 63
#define SPIN_NS 2000000             // a worker polls this long after its last loop, then sleeps
#define PAUSES 256                  // polls with a pause (~10 us) before polls yield the core
#define CLAIMS 16                   // a loop's pieces are taken in about this many claims at most

enum { SLEEPING, SPINNING };

static struct Worker {
    _Atomic uint32_t go;            // the newest loop it was given: its futex word
    _Atomic int state;
    pthread_t thread;
} workers[MAX_WORKERS];

static struct {
    int own, started, cores, ranks, base;     // own: the pool runs the loops (else OpenMP, unless lending)
    const _Atomic int32_t *_Atomic busy;    // ranks' threads while they compute (shared memory), or NULL
    uint32_t loop;
    Task task;
    void *ctx;
    int64_t n, grain;
    _Atomic uint64_t work;          // the pieces left, [low 32 bits, high 32 bits): one word, so a late thread
                                    // never takes a piece past a loop's end, whichever loop it finds
    _Atomic uint32_t finished;      // pieces done in this loop
    _Atomic uint32_t chunk;         // pieces one compare-and-swap takes (any value >= 1 is safe for any loop)
} pool = {.own = 1, .chunk = 1};

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

static _Atomic int readers;          // workers reading `busy` now: pool_lend waits for them (its memory may go)

static int free_cores(const _Atomic int32_t *busy) {       // cores no busy rank holds
    int held = 0;
    for (int r = 0; r < pool.ranks; r++) held += atomic_load(&busy[r]);
    return pool.cores - held;
}

int team_size(void) {
    int base = own_threads();
    const _Atomic int32_t *busy = atomic_load(&pool.busy);
    if (!busy) return base;
    int free = free_cores(busy);
    int team = base + (free > 0 ? free : 0);
    return team > pool.cores ? pool.cores : team > MAX_WORKERS + 1 ? MAX_WORKERS + 1 : team;
}

// Take pieces of the current loop until none is left: the caller from the front, the workers from the back, so
// that each thread works through contiguous columns (weights streamed in order) as OpenMP's static shares would,
// while a thread that is late takes less. Pieces are taken `chunk` at a time (a loop of thousands of one-column
// pieces would otherwise pass the word between the cores thousands of times) by one compare-and-swap on `work`;
// then the loop's fields (written before `work`) are read: they cannot change until every taken piece is finished.
static void take_pieces(int front) {
    uint64_t w = atomic_load(&pool.work);
    in_loop = 1;
    for (;;) {
        uint32_t next = (uint32_t)w, end = (uint32_t)(w >> 32);        // pieces [next, end) are left
        if (next >= end) break;
        uint32_t chunk = atomic_load_explicit(&pool.chunk, memory_order_relaxed);
        uint32_t k = end - next < chunk ? end - next : chunk;
        uint64_t taken = front ? w + k : w - ((uint64_t)k << 32);
        if (!atomic_compare_exchange_weak(&pool.work, &w, taken)) continue;
        for (int64_t p = front ? next : end - k, last = p + k; p < last; p++) {
            int64_t stop = (p + 1) * pool.grain;
            pool.task(pool.ctx, p * pool.grain, stop < pool.n ? stop : pool.n);
        }
        atomic_fetch_add(&pool.finished, k);
        w = atomic_load(&pool.work);
    }
    in_loop = 0;
}

// A poll's pause: the next loop or piece usually comes within microseconds; after PAUSES polls the thread
// yields its core as it polls (at once alone, to another process's thread where one waits for the core).
static void wait_a_little(int polls) {
    if (polls < PAUSES) _mm_pause();
    else sched_yield();
}

// Worker i is the team's member i + 1; it may spin while its core is its rank's own or free.
static int may_spin(int i) {
    if (i + 1 < pool.base) return 1;
    atomic_fetch_add(&readers, 1);                  // before reading `busy`: pool_lend waits while any reads it
    const _Atomic int32_t *busy = atomic_load(&pool.busy);
    int yes = busy && free_cores(busy) > i + 1 - pool.base;
    atomic_fetch_sub(&readers, 1);
    return yes;
}

static void *work(void *arg) {
    struct Worker *w = arg;
    int i = (int)(w - workers);
    uint32_t seen = 0;                  // go's first value: the caller may give it a loop before it runs
    int64_t until = now_ns() + SPIN_NS;
    for (int polls = 0;; polls++) {
        uint32_t go = atomic_load(&w->go);
        if (go != seen) {
            seen = go, polls = 0;
            take_pieces(0);
            until = now_ns() + SPIN_NS;
            continue;
        }
        if (!may_spin(i) || ((polls & 63) == 0 && now_ns() > until)) {
            atomic_store(&w->state, SLEEPING);
            if (atomic_load(&w->go) == seen) futex(&w->go, FUTEX_WAIT, seen);
            atomic_store(&w->state, SPINNING);
            until = now_ns() + SPIN_NS;
            continue;
        }
        wait_a_little(polls);
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

// The pool's loop: the workers are given it (sleeping ones woken: a late one finds fewer pieces, or none) and
// take pieces with the caller, who waits for the pieces taken to finish.
static void pool_for(int team, uint32_t pieces) {
    start_workers(team - 1);
    if (++pool.loop == 0) pool.loop = 1;                 // a worker's `go` starts at 0
    atomic_store(&pool.finished, 0);
    atomic_store(&pool.chunk, pieces / CLAIMS > 1 ? pieces / CLAIMS : 1);
    atomic_store(&pool.work, (uint64_t)pieces << 32);
    for (int i = 0; i < team - 1; i++) {
        atomic_store(&workers[i].go, pool.loop);
        if (atomic_load(&workers[i].state) == SLEEPING) futex(&workers[i].go, FUTEX_WAKE, 1);
    }
    take_pieces(1);
    for (int polls = 0; atomic_load(&pool.finished) != pieces; polls++) wait_a_little(polls);
}

static void run(int64_t n, int64_t grain, Task task, void *ctx, int dynamic) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if ((n + grain - 1) / grain > UINT32_MAX) grain = (n + UINT32_MAX - 1) / UINT32_MAX;   // pieces fit `work`
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
    if (pool.own || atomic_load(&pool.busy)) {
        pool.base = own_threads();
        pool.task = task, pool.ctx = ctx, pool.n = n, pool.grain = grain;
        pool_for(team, (uint32_t)pieces);
    } else if (dynamic) {           // OpenMP's team (omp_in_parallel marks its loops' nested ones)
        #pragma omp parallel for schedule(dynamic)
        for (int64_t p = 0; p < pieces; p++) task(ctx, p * grain, (p + 1) * grain < n ? (p + 1) * grain : n);
    } else {
        #pragma omp parallel for schedule(static)
        for (int64_t p = 0; p < pieces; p++) task(ctx, p * grain, (p + 1) * grain < n ? (p + 1) * grain : n);
    }
}

void parallel_for(int64_t n, int64_t grain, Task task, void *ctx) { run(n, grain, task, ctx, 0); }

void parallel_tasks(int64_t n, Task task, void *ctx) { run(n, 1, task, ctx, 1); }

// Python (kernels/build.py): the pool runs this process's loops (1, the default) or OpenMP's team does (0: where
// AMX tiles do the products).
void pool_use(int own) { pool.own = own; }

// Python (runtime/link.py): lend and borrow cores among the ranks of this process's multi-process method (busy:
// the ranks' words in shared memory, `ranks` of them, on a machine of `cores`), or no more (busy NULL). Returns
// once no worker reads the words it had: the caller may unmap them.
void pool_lend(const int32_t *busy, int ranks, int cores) {
    atomic_store(&pool.busy, NULL);
    while (atomic_load(&readers)) _mm_pause();
    pool.ranks = ranks, pool.cores = cores;
    atomic_store(&pool.busy, (const _Atomic int32_t *)busy);
}

// Python (runtime/link.py): futexes on 32-bit words that processes share (the mailboxes' counters; not PRIVATE):
// sleep while *word holds `seen`, at most `timeout_s`; wake every process sleeping on it.
void shared_wait(uint32_t *word, uint32_t seen, double timeout_s) {
    struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9)};
    syscall(SYS_futex, word, FUTEX_WAIT, seen, &ts, NULL, 0);
}

void shared_wake(uint32_t *word) { syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, NULL, NULL, 0); }

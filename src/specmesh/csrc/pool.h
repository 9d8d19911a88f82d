// The kernels' parallel loops (pool.c). parallel_for runs task(ctx, begin, end) over [0, n) in pieces of
// `grain` on the pool's threads (as many as omp_get_max_threads, i.e. torch.set_num_threads, plus cores borrowed
// from waiting ranks: pool_lend), or on OpenMP's team where AMX does the products (pool_use). Every element is computed by the same code whichever thread takes it, so
// results do not depend on the team.
#include <stdint.h>

typedef void (*Task)(void *ctx, int64_t begin, int64_t end);

void parallel_for(int64_t n, int64_t grain, Task task, void *ctx);   // pieces of `grain` (OpenMP: static shares)
void parallel_tasks(int64_t n, Task task, void *ctx);                // pieces of one (OpenMP: dynamic)
int team_size(void);       // threads the next parallel_for runs on

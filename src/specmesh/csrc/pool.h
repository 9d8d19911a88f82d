// The kernels' parallel loops (pool.c). parallel_for runs task(ctx, begin, end) over [0, n) in pieces of
// `grain`: on OpenMP's team by default, on the pool's own threads in a process of a multi-process method that
// lends and borrows cores (pool_lend). Every element is computed by the same code whichever thread takes it,
// so results do not depend on the team.
#include <stdint.h>

typedef void (*Task)(void *ctx, int64_t begin, int64_t end);

void parallel_for(int64_t n, int64_t grain, Task task, void *ctx);   // contiguous shares (OpenMP's static)
void parallel_tasks(int64_t n, Task task, void *ctx);                // one piece at a time (dynamic)
int team_size(void);       // threads the next parallel_for runs on

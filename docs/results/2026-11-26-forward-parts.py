"""Per-part time of a T-token forward after CTX cached tokens (run with SPECMESH_CACHE pointing at a build of
csrc/avx2.c with omp_get_wtime timers around block_forward's calls and a prof_dump(n) that prints and resets them:
2026-11-26-timers-patch.py writes that build's source)."""
import ctypes, os, sys, time
import torch
torch.set_num_threads(2)
from specmesh import embedded
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model
m = load_model(embedded.path("target"), torch.bfloat16)
lib = m.fast_forward.kernel
lib.prof_dump.argtypes = [ctypes.c_double]
T, ctx, n = int(sys.argv[1]), int(os.environ.get("CTX", 128)), 200
x = torch.randint(m.config.vocab_size, (1, ctx + T), generator=torch.Generator().manual_seed(0))
cache = KVCache.for_model(m, 1, ctx + T)
with torch.inference_mode():
    m(x[:, :ctx], cache)
    cache.commit_all()
    for r in range(2):
        lib.prof_dump(1.0)
        times = []
        for _ in range(n):
            cache.rollback(0, ctx)
            t = time.perf_counter()
            m(x[:, ctx:], cache)
            times.append(time.perf_counter() - t)
        print(f"--- round {r}: T={T} after {ctx}")
        lib.prof_dump(float(n))
        print(f"forward median {sorted(times)[n // 2] * 1e3:.3f} ms", flush=True)

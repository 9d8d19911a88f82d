"""The target's forward by width over CTX cached tokens, its weights and cache on 4 KiB pages (4k) and on 2 MiB pages
(huge), the two copies alternating forward by forward in one process, median of 60 rounds:
usage python THIS.py [CTX] [THREADS]."""
import statistics, sys, time
import torch
import specmesh.kernels.select as S
import specmesh.model.cache as C
import specmesh.model.pages as P
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model

ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 128
torch.set_num_threads(int(sys.argv[2]) if len(sys.argv) > 2 else 2)
models, caches = {}, {}
for name, on in (("4k", False), ("huge", True)):
    S.on_huge_pages = P.on_huge_pages if on else (lambda m: 0)
    C.huge_pages = lambda on=on: on             # (caches: a version of the change had them on huge pages too)
    models[name] = load_model("models/target", torch.bfloat16)
    caches[name] = KVCache.for_model(models[name], 1, 4096)          # 4096 slots: 2 MiB a layer's keys (on huge pages in the huge copy while caches were)
torch.manual_seed(0)
V = models["4k"].config.vocab_size
prompt = torch.randint(1, V, (1, ctx))
with torch.inference_mode():
    for name in models:
        models[name](prompt, caches[name]); caches[name].commit_all()
    widths, res = (1, 2, 5, 8, 16), {}
    for rnd in range(60):
        for w in widths:
            x = torch.randint(1, V, (1, w))
            for name in (("4k", "huge") if rnd % 2 else ("huge", "4k")):
                t0 = time.perf_counter(); models[name](x, caches[name]); dt = time.perf_counter() - t0
                caches[name].rollback(0, ctx)
                res.setdefault((name, w), []).append(dt * 1e3)
med = {k: statistics.median(v) for k, v in res.items()}
for name in models:
    print(f"{name:5s}", " ".join(f"{w}:{med[name, w]:.2f}ms({med[name, w] / med[name, 1]:.2f}x)" for w in widths))
print("4k/huge", " ".join(f"{w}:{med['4k', w] / med['huge', w]:.3f}x" for w in widths))

"""One draft forward's wall time, exact against layer-parallel groups, on any device (run from the repo root):
    python docs/results/2026-11-27-group-forward.py [cuda|cpu] [bfloat16|float32]
The embedded draft, unpacked (the PyTorch path: what a GPU runs), a 100-token committed prefix, T new tokens
as a tree level sees them (depth 0, a 2- or 3-node level); the mean of 300 forwards after 30 warm ones, each
rolled back so every forward sees the same cache. Synchronised per forward on CUDA (launch-bound: host time)."""
import sys
import time

import torch

from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model

device = sys.argv[1] if len(sys.argv) > 1 else "cpu"
dtype = getattr(torch, sys.argv[2] if len(sys.argv) > 2 else "float32")
model = load_model("models/draft", dtype=dtype, device=device, pack=False, draft=True)
GROUPINGS = {"exact": None, "1,2,1": [range(0, 1), range(1, 3), range(3, 4)], "2,2": [range(0, 2), range(2, 4)]}


def per_forward_ms(groups, T: int) -> float:
    try:
        cache = KVCache.for_model(model, 1, 256, groups=groups or ())
    except TypeError:           # the code before stacked group caches (an A/B against it)
        cache = KVCache.for_model(model, 1, 256)
    with torch.no_grad():
        model(torch.randint(0, 8192, (1, 100), device=device), cache)
        cache.commit_all()
        x = torch.randint(0, 8192, (1, T), device=device)
        depths, tree = torch.zeros(T, dtype=torch.long), torch.eye(T, dtype=torch.bool)
        for i in range(330):
            if i == 30:
                if device != "cpu":
                    torch.cuda.synchronize()
                start = time.perf_counter()
            model(x, cache, depths=depths, tree_mask=tree, groups=groups)
            cache.prune(0, [])
            if device != "cpu":
                torch.cuda.synchronize()
    return (time.perf_counter() - start) / 300 * 1e3


for T in (2, 3):
    times = {name: per_forward_ms(groups, T) for name, groups in GROUPINGS.items()}
    print(f"{device} {dtype} T={T}: " + ", ".join(f"{n} {ms:.3f} ms ({ms / times['exact']:.2f}x)"
                                                  for n, ms in times.items()))

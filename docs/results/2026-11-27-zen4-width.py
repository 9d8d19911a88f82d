"""The target's (or, for a path with "draft" in it, the draft's) forward by width over CTX cached tokens, median of 40
rounds: usage python THIS.py [PATH] [CTX]."""
import sys, time, statistics, torch
torch.set_num_threads(2)
from specmesh.model.loader import load_model
from specmesh.model.cache import KVCache
path = sys.argv[1] if len(sys.argv) > 1 else "models/target"
ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 128
model = load_model(path, torch.bfloat16, draft="draft" in path)
V = model.config.vocab_size
torch.manual_seed(0)
cache = KVCache.for_model(model, 1, 2048)
with torch.inference_mode():
    model(torch.randint(1, V, (1, ctx)), cache); cache.commit_all()
res = {}
widths = (1, 2, 4, 6, 8, 12, 16)
with torch.inference_mode():
    for rnd in range(40):
        for w in widths:
            x = torch.randint(1, V, (1, w))
            t0 = time.perf_counter(); model(x, cache); dt = time.perf_counter() - t0
            cache.rollback(0, ctx)                 # back to the ctx committed tokens: the same context each time
            res.setdefault(w, []).append(dt * 1e3)
one = statistics.median(res[1])
print(" ".join(f"{w}:{statistics.median(res[w]):.2f}ms({statistics.median(res[w])/one:.2f}x)" for w in widths))

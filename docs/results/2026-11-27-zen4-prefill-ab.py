"""Prefill timing on this CPU: C attention (attend512 with spans) vs PyTorch's attention, same model."""
import sys, time, statistics, torch
from specmesh.model.loader import load_model
from specmesh.model.cache import KVCache
torch.set_num_threads(2)
path = sys.argv[1] if len(sys.argv) > 1 else "models/target"
model = load_model(path, torch.bfloat16)
fwd = model.fast_forward
print("long", fwd.long, "c_attention", fwd.c_attention)
torch.manual_seed(0)
V = model.config.vocab_size
res = {}
for T in (64, 128, 380, 700):
    ids = torch.randint(1, V, (1, T))
    outs = {}
    for rnd in range(5):
        for mode in (True, False):
            fwd.c_attention = mode
            cache = KVCache.for_model(model, 1, 1024)
            with torch.inference_mode():
                t0 = time.perf_counter(); out = model(ids, cache, last_only=True); dt = time.perf_counter() - t0
            res.setdefault((T, mode), []).append(dt * 1e3); outs[mode] = out
    d = (outs[True] - outs[False]).abs().max().item()
    print(f"T={T}: C {min(res[(T, True)]):.1f} ms (median {statistics.median(res[(T, True)]):.1f}), "
          f"PyTorch {min(res[(T, False)]):.1f} ms (median {statistics.median(res[(T, False)]):.1f}); max |dlogit| {d:.3g}")

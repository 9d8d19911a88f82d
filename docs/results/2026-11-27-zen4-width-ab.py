"""The target's forward by width, two builds of the kernels in one process, alternating forward by forward: usage
[QUANT=int8|int4] python THIS.py OLD_CSRC_DIR [CTX]; the first model runs this checkout's csrc/, the second
OLD_CSRC_DIR's (avx2.c, avx512.c). Median of 40 rounds per width; both models' logits compared bit for bit."""
import os, statistics, sys, time
from pathlib import Path
import torch
torch.set_num_threads(2)
from specmesh.kernels import build
from specmesh.model.cache import KVCache
from specmesh.model.loader import load_model

def load() -> torch.nn.Module:
    return load_model("models/target", torch.bfloat16, quant=os.environ.get("QUANT"))

models = {"new": load()}
build.SOURCE, build.AVX512_SOURCE = Path(sys.argv[1]) / "avx2.c", Path(sys.argv[1]) / "avx512.c"
build.kernel_version.cache_clear(); build.avx2_lib.cache_clear()
models["old"] = load()
assert models["old"].fast_forward.kernel is not models["new"].fast_forward.kernel
ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 400
V = models["new"].config.vocab_size
torch.manual_seed(0)
prompt = torch.randint(1, V, (1, ctx))
caches = {}
with torch.inference_mode():
    for name, model in models.items():
        caches[name] = KVCache.for_model(model, 1, 2048)
        model(prompt, caches[name]); caches[name].commit_all()
    widths, times, same = (1, 2, 4, 5, 8, 12, 16), {}, True
    for rnd in range(40):
        for w in widths:
            x = torch.randint(1, V, (1, w))
            outs = {}
            for name in (("new", "old") if rnd % 2 else ("old", "new")):
                t0 = time.perf_counter(); outs[name] = models[name](x, caches[name])
                times.setdefault((name, w), []).append((time.perf_counter() - t0) * 1e3)
                caches[name].rollback(0, ctx)
            same &= torch.equal(outs["new"], outs["old"])
for name in ("old", "new"):
    one = statistics.median(times[(name, 1)])
    print(name, " ".join(f"{w}:{statistics.median(times[(name, w)]):.2f}ms({statistics.median(times[(name, w)]) / one:.2f}x)"
                         for w in widths))
print("logits bit for bit equal:", same)

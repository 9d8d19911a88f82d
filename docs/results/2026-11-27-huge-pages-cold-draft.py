"""A draft forward of one token right after the target's forward of W tokens, against one right after another draft
forward (what a speculative step does: the target verifies, then the draft reads the accepted tokens), with the
weights and caches on 4 KiB pages (4k) or 2 MiB pages (huge): usage python THIS.py 4k|huge [W] [THREADS]."""
import statistics, sys, time
import torch
import specmesh.kernels.select as S
import specmesh.model.cache as C
import specmesh.model.pages as P
from specmesh.llm import LLM
from specmesh.model.cache import KVCache

huge = sys.argv[1] == "huge"
S.on_huge_pages = P.on_huge_pages if huge else (lambda m: 0)
C.huge_pages = lambda: huge                     # (caches: a version of the change had them on huge pages too)
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
llm = LLM("embedded", method="sd", dtype="bfloat16")
d, tgt = llm.models.draft, llm.models.target
g = torch.Generator().manual_seed(0)
dc, tc = KVCache.for_model(d, 1, 4096), KVCache.for_model(tgt, 1, 4096)
with torch.inference_mode():
    d(torch.randint(1000, (1, 64), generator=g), dc, last_only=True); dc.commit_all()
    tgt(torch.randint(1000, (1, 300), generator=g), tc, last_only=True); tc.commit_all()
    cold, hot, tv = [], [], []
    for i in range(300):
        t = time.perf_counter(); tgt(torch.randint(1000, (1, int(sys.argv[2]) if len(sys.argv) > 2 else 6), generator=g), tc)
        tv.append(time.perf_counter() - t)
        tc.rollback(0, 300)
        for j in range(3):
            t = time.perf_counter(); d(torch.randint(1000, (1, 1), generator=g), dc); dt = time.perf_counter() - t
            (cold if j == 0 else hot).append(dt)
            dc.rollback(0, 64)
ms = lambda a: f"{statistics.median(a) * 1e3:.3f}"
print(f"{sys.argv[1]:4s}: target {ms(tv)} ms; a draft token after it {ms(cold)} ms, after a draft forward {ms(hot)} ms")

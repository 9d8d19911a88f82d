"""The target's two halves (layers 0-3, then 4-7 and the head) in one process, in turn, one new token each over
~400 cached, the pool borrowing a core (as a lending `pp` rank): back to back ("none"), a 200 µs sleep between them
("sleep"), or the sleep with the pool's helper asleep too ("halt"). Median µs of each half."""
import time, torch, statistics as st, numpy as np, sys
from specmesh.model.loader import load_model
from specmesh.model.cache import KVCache
from specmesh.kernels.build import avx2_lib
from specmesh import embedded
k = avx2_lib()
m = load_model(embedded.ROOT / "models" / "target", torch.bfloat16)
busy = np.array([1, 0], dtype=np.int32)
A, B = range(0, 4), range(4, 8)
def run(mode, n=150):
    torch.set_num_threads(1)
    k.pool_lend(busy.ctypes.data, 2, 2)
    ca, cb = (KVCache.for_model(m, 1, 700, r) for r in (A, B))
    x = torch.randint(0, 8000, (1, 400)); h = m(x, ca, layers=A); ca.commit_all(); m(h, cb, layers=B); cb.commit_all()
    ta, tb = [], []
    def gap():
        if mode == "sleep":
            time.sleep(0.0002)
        elif mode == "halt":               # the pool's helper sleeps too (its core is "busy" elsewhere)
            busy[1] = 1; time.sleep(0.0002); busy[1] = 0
    for i in range(n):
        x = torch.randint(0, 8000, (1, 1))
        gap()
        t0 = time.perf_counter(); h = m(x, ca, layers=A); ca.commit_all(); t1 = time.perf_counter()
        gap()
        t2 = time.perf_counter(); m(h, cb, layers=B, last_only=True); cb.commit_all(); t3 = time.perf_counter()
        ta.append(t1 - t0); tb.append(t3 - t2)
    k.pool_lend(None, 0, 0); torch.set_num_threads(2)
    return st.median(ta) * 1e6, st.median(tb) * 1e6
with torch.inference_mode():
    for r in range(3):
        print("  ".join(f"{mode}: %.0f %.0f" % run(mode) for mode in ("none", "sleep", "halt")), flush=True)

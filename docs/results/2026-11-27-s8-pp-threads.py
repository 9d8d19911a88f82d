"""Prototype: pp's two stages as two threads of one process (queues for the hand-offs, the pool with one borrowed
core), against ar in the same process. Greedy; ms per token after the first. Usage: python THIS [SLEEPY]; SLEEPY 1
sends the pool's helper thread to sleep at every hand-off and wakes it at the next stage's first loop, as the
lending processes must (the helper belongs to one process)."""
import json, queue, threading, time, statistics as st, sys
import numpy as np, torch
from specmesh.model.loader import load_model
from specmesh.model.cache import KVCache
from specmesh.kernels.build import avx2_lib
from specmesh import embedded
torch.set_num_threads(1)
k = avx2_lib()
busy = np.array([1, 0], dtype=np.int32)
k.pool_lend(busy.ctypes.data, 2, 2)
m = load_model(embedded.ROOT / "models" / "target", torch.bfloat16)
A, B, F = range(0, 4), range(4, 8), range(0, 8)
prompts = [json.loads(l)["prompt"] for l in open("/work/main/prompts/stdlib-heldout.jsonl")][:8]
from specmesh import LLM
tok = LLM(target="embedded", method="ar").tokenizer
N = 160
SLEEPY = int(sys.argv[1]) if len(sys.argv) > 1 else 0
def ar(ids):
    c = KVCache.for_model(m, 1, len(ids) + N + 2, F)
    x = torch.tensor([ids]); out = []
    logits = m(x, c, last_only=True); c.commit_all(); t = int(logits[0, -1].argmax()); out.append(t)
    t0 = time.perf_counter()
    for i in range(N - 1):
        logits = m(torch.tensor([[t]]), c, last_only=True); c.commit_all(); t = int(logits[0, -1].argmax()); out.append(t)
    return out, (time.perf_counter() - t0) / (N - 1)
def pp(ids):
    ca, cb = KVCache.for_model(m, 1, len(ids) + N + 2, A), KVCache.for_model(m, 1, len(ids) + N + 2, B)
    q1, q2 = queue.SimpleQueue(), queue.SimpleQueue()
    def stage1():
        while (h := q1.get()) is not None:
            if SLEEPY: busy[1] = 0
            logits = m(h, cb, layers=B, last_only=True); cb.commit_all()
            if SLEEPY: busy[1] = 1
            q2.put(int(logits[0, -1].argmax()))
    th = threading.Thread(target=stage1); th.start()
    x = torch.tensor([ids]); out = []
    h = m(x, ca, layers=A); ca.commit_all(); q1.put(h); t = q2.get(); out.append(t)
    t0 = time.perf_counter()
    for i in range(N - 1):
        if SLEEPY: busy[1] = 0
        h = m(torch.tensor([[t]]), ca, layers=A); ca.commit_all()
        if SLEEPY: busy[1] = 1
        q1.put(h); t = q2.get(); out.append(t)
    dt = (time.perf_counter() - t0) / (N - 1)
    q1.put(None); th.join()
    return out, dt
with torch.inference_mode():
    ar(tok.encode(prompts[0])); pp(tok.encode(prompts[0])); busy[1] = 0
    ra, rp = [], []
    for p in prompts:
        ids = tok.encode(p)
        busy[1] = 0; oa, ta = ar(ids); op, tp = pp(ids); busy[1] = 0
        assert oa == op
        ra.append(ta); rp.append(tp)
print(f"sleepy={SLEEPY} ar {st.mean(ra)*1e3:.3f} ms/token, pp as threads {st.mean(rp)*1e3:.3f} ms/token: {st.mean(ra)/st.mean(rp):.3f}x ar")

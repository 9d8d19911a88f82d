"""TTFT of a prompt served once and again, prefix cache on/off (the embedded target, bf16, through the engine)."""
import threading, time, torch
torch.set_num_threads(2)
from specmesh.bench.prompts import load_prompts
from specmesh.spec.sampling import SamplingParams
from specmesh.serve import ServeConfig, build

def ttfts(mb):
    server, _ = build(ServeConfig(prefix_cache_mb=mb))
    engine = server.engine.start()
    tok = engine.tokenizer
    out = []
    try:
        for p in load_prompts(None)[:10]:
            ids = tok.encode(p)[:400]
            for rep in range(2):
                first, done = [], threading.Event()
                [seq] = engine.sequences(ids, SamplingParams(max_new_tokens=4, temperature=0))
                def emit(ev, first=first, done=done):
                    if not first: first.append(time.perf_counter())
                    if ev.finish_reason: done.set()
                seq.emit = emit
                t = time.perf_counter(); engine.submit([seq]); done.wait(60)
                out.append((len(ids), rep, (first[0] - t) * 1e3))
    finally:
        engine.stop()
    return out, engine.stats.cached_prompt_tokens

for mb in (0, 64):
    out, cached = ttfts(mb)
    a = sorted(x[2] for x in out if x[1] == 0); b = sorted(x[2] for x in out if x[1] == 1)
    print(f"prefix cache {mb} MB: first time median {a[len(a)//2]:.1f} ms, again {b[len(b)//2]:.1f} ms; cached tokens {cached}; prompt tokens {sorted(x[0] for x in out)[len(out)//2]}")

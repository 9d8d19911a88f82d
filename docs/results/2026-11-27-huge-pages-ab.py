"""Paired A/B in one process: the embedded pair loaded with its weights on 4 KiB pages (huge=0) and on 2 MiB pages
(huge=1, the default since 2026-11-27), prompts interleaved, decode time after the first token. (Written when caches
of 2 MiB or more went on huge pages too: C.huge_pages no longer exists in model/cache.py.)
Usage: python 2026-11-27-huge-pages-ab.py METHOD PROMPTS THREADS [PROMPTS.jsonl [TARGET]]"""
import json, os, sys, time
import specmesh.model.pages as P, specmesh.model.cache as C, specmesh.kernels.select as S
import torch
torch.set_num_threads(int(sys.argv[3]))
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams
method, n = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in open(sys.argv[4] if len(sys.argv) > 4 else "prompts/stdlib-heldout.jsonl")][:n]
def use(h: str) -> None:
    """Caches (made with each generate's engine) and weights (at load) on huge pages or not."""
    if hasattr(C, "huge_pages"):
        C.huge_pages = (lambda: True) if h == "1" else (lambda: False)
    S.on_huge_pages = P.on_huge_pages if h == "1" else (lambda m: 0)


llms = {}
for h in ("0", "1"):
    use(h)
    llms[h] = LLM(sys.argv[5] if len(sys.argv) > 5 else "embedded", method=method, dtype="bfloat16")
    llms[h].generate([rows[0]["prompt"]], SamplingParams(max_new_tokens=16))
tot = {h: 0.0 for h in llms}; decode = {h: 0.0 for h in llms}; toks = {h: 0 for h in llms}; same = 0
for i, r in enumerate(rows):
    outs = {}
    for h in (("0", "1") if i % 2 == 0 else ("1", "0")):
        use(h)
        t = time.perf_counter()
        run = llms[h].stream(r["prompt"], SamplingParams(max_new_tokens=128))
        it = iter(run); next(it); first = time.perf_counter()
        for _ in it: pass
        end = time.perf_counter()
        tot[h] += end - t; decode[h] += end - first; toks[h] += len(run.output.tokens); outs[h] = run.output.tokens
    same += outs["0"] == outs["1"]
for h in llms:
    print(f"{method} huge={h}: {toks[h]/tot[h]:.1f} tok/s, decode {decode[h]/(toks[h]-n)*1e3:.3f} ms/token")
print(f"huge/4k: {tot['0']/tot['1']:.3f}x overall, decode {decode['0']/decode['1']:.3f}x; same outputs {same}/{n}")

"""Side by side in one process, prompts interleaved: usage lend-bench.py PROMPTS TOKENS ar,sd@1t,pp,pp+lend,...

NAME+lend starts the method with SPECMESH_LEND=1, else =0 (pp, stpp, pipedec: the pipelines' lending of cores, see
docs/pipelines.md). The run logged in 2026-11-27-zen4-session7.md also had a `pearl+lend`, from a working tree where
pearl's link lent too (not kept: pearl does not read SPECMESH_LEND)."""
import json, os, sys, time, torch
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams
from specmesh.timing import torch_threads, chosen_threads
N, TOK = int(sys.argv[1]), int(sys.argv[2])
names = sys.argv[3].split(",")
prompts = [json.loads(l)["prompt"] for l in open("/work/main/prompts/stdlib-heldout.jsonl")][:N]
runs = {}
for name in names:
    method, _, lend = name.partition("+")
    method, _, th = method.partition("@")
    os.environ["SPECMESH_LEND"] = "1" if lend else "0"
    kw = {"stages": 2} if method in ("pp", "pipedec") else {}
    runs[name] = [LLM("embedded", method=method, dtype="bfloat16", **kw), int(th[:-1]) if th else None, 0.0, 0, []]
sp = SamplingParams(max_new_tokens=TOK)
for name, r in runs.items():           # warm-up
    r[0].generate(prompts[0], SamplingParams(max_new_tokens=8))
for i, p in enumerate(prompts):
    order = names[i % len(names):] + names[:i % len(names)]
    for name in order:
        r = runs[name]
        t = time.perf_counter()
        if r[1]:
            with chosen_threads(r[1]):
                o = r[0].generate(p, sp)
        else:
            o = r[0].generate(p, sp)
        r[2] += time.perf_counter() - t
        o = o[0] if isinstance(o, list) else o
        r[3] += len(o.tokens); r[4].append(o.tokens)
base = runs[names[0]]
for name, r in runs.items():
    same = sum(a == b for a, b in zip(r[4], base[4]))
    print(f"{name:16s} {r[3] / r[2]:7.1f} tok/s  {r[3] / r[2] / (base[3] / base[2]):.3f}x {names[0]}  same {same}/{len(prompts)}", flush=True)

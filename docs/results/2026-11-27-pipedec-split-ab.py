"""pipedec with its stage split forced, splits interleaved prompt by prompt in one process: usage THIS.py N 2+6 3+5 ..."""
import json, sys, time, torch
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams
from specmesh.runtime.pipeline import ranges
n = int(sys.argv[1]); splits = [tuple(map(int, s.split("+"))) for s in sys.argv[2:]]
rows = [json.loads(l) for l in open("prompts/stdlib-heldout.jsonl")][:n]
llm = LLM("embedded", method="pipedec", dtype="bfloat16")
costs = llm.models.remote.costs
cur = {"s": None}
orig = costs.split
costs.split = lambda ctx: ranges(list(cur["s"])) if cur["s"] else orig(ctx)
llm.generate(rows[0]["prompt"], SamplingParams(max_new_tokens=16))
acc = {s: [0.0, 0] for s in splits}
for i, r in enumerate(rows):
    order = splits[i % len(splits):] + splits[:i % len(splits)]
    for s in order:
        cur["s"] = s
        t = time.perf_counter(); o = llm.generate(r["prompt"], SamplingParams(max_new_tokens=128))
        acc[s][0] += time.perf_counter() - t; acc[s][1] += o.stats.generated_tokens
print("model's choice at 128/400/1024:", [orig(c) for c in (128, 400, 1024)])
for s in splits: print(s, f"{acc[s][1]/acc[s][0]:.1f} tok/s")

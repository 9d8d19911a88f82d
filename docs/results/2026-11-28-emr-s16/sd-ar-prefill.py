"""sd and ar side by side, 20 stdlib prompts interleaved, two rounds: one new token (the prompt's time) and 128."""
import time, torch, sys
torch.set_num_threads(2)
from specmesh import LLM, SamplingParams
from specmesh.bench.prompts import load_prompts
prompts = load_prompts("prompts/stdlib-heldout.jsonl", 20)
llms = {m: LLM("embedded", method=m, dtype="bfloat16") for m in ("ar", "sd")}
for m, l in llms.items():
    for p in prompts[:3]: l.generate(p, SamplingParams(max_new_tokens=1))
for n in (1, 128):
    tot = {m: 0.0 for m in llms}
    for r in range(2):
        for p in prompts:
            for m, l in llms.items():
                t = time.perf_counter(); l.generate(p, SamplingParams(max_new_tokens=n)); tot[m] += time.perf_counter() - t
    print(n, {m: round(v / 40 * 1e3, 1) for m, v in tot.items()}, "sd/ar", round(tot["ar"] / tot["sd"], 3))

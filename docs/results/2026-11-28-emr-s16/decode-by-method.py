"""Prompt time and decode ms a token of methods side by side (python THIS.py ar,pp), 8 stdlib prompts x 128 tokens,
interleaved; with the pipelines, rank 0's Stage.forward median."""
import time, torch, sys, statistics
torch.set_num_threads(2)
from specmesh import LLM, SamplingParams
from specmesh.bench.prompts import load_prompts
from specmesh.runtime import pipeline as P
prompts = load_prompts("prompts/stdlib-heldout.jsonl", 8)
fw = []
orig = P.Stage.forward
def forward(self, packet):
    t = time.perf_counter(); out = orig(self, packet); fw.append(time.perf_counter() - t); return out
P.Stage.forward = forward
llms = {m: LLM("embedded", method=m, dtype="bfloat16") for m in sys.argv[1].split(",")}
for m, l in llms.items():
    for p in prompts[:2]: l.generate(p, SamplingParams(max_new_tokens=16))
tot = {m: [0.0, 0.0, []] for m in llms}
for p in prompts:
    for m, l in llms.items():
        a = l.generate(p, SamplingParams(max_new_tokens=1)).stats.elapsed_s
        fw.clear()
        b = l.generate(p, SamplingParams(max_new_tokens=128)).stats.elapsed_s
        tot[m][0] += a; tot[m][1] += (b - a) / 127
        tot[m][2] += fw[2:]
for m, (a, d, f) in tot.items():
    print(m, f"prompt {a/len(prompts)*1e3:.1f} ms, decode {d/len(prompts)*1e3:.3f} ms/token, rank0 forward median {statistics.median(f)*1e3 if f else 0:.3f} ms")

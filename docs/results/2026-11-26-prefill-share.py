"""How much of a bench run is the prompt: per method, each held-out prompt run for 1 new token (the prefill and the
first token) and for 128, methods alternating prompt by prompt; the decode part is the difference.
Run: python docs/results/2026-11-26-prefill-share.py ar sd tree selfdraft  (N=20 prompts, bf16, 2 threads)"""
import json, os, sys, time
import torch
torch.set_num_threads(2)
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams
prompts = [json.loads(line)["prompt"] for line in open("prompts/stdlib-heldout.jsonl")][:int(os.environ.get("N", 20))]
llms = {m: LLM(target="embedded", method=m, dtype="bfloat16") for m in sys.argv[1:]}
first, full, outs = {m: 0.0 for m in llms}, {m: 0.0 for m in llms}, {m: [] for m in llms}
for llm in llms.values():
    llm.generate(prompts[0], SamplingParams(max_new_tokens=8))
for p in prompts:
    for m, llm in llms.items():
        a = time.perf_counter(); llm.generate(p, SamplingParams(max_new_tokens=1)); b = time.perf_counter()
        outs[m].append(llm.generate(p, SamplingParams(max_new_tokens=128)).tokens); c = time.perf_counter()
        first[m] += b - a; full[m] += c - b
tokens = sum(len(o) for o in outs["ar"])
mean_prompt = sum(len(llms["ar"].encode(p)) for p in prompts) / len(prompts)
print(f"{len(prompts)} prompts of {mean_prompt:.0f} tokens on average, {tokens} new tokens a method")
for m in llms:
    decode = full[m] - first[m]
    print(f"{m:10} prompt+first token {first[m] / len(prompts) * 1e3:6.1f} ms  whole run {full[m] / len(prompts) * 1e3:6.1f} ms"
          f"  (prompt {first[m] / full[m]:.0%})  vs ar: whole {full['ar'] / full[m]:.2f}x, "
          f"decode only {(full['ar'] - first['ar']) / decode:.2f}x  = ar: {outs[m] == outs['ar']}")

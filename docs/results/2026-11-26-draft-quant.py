"""A bf16 draft against the same draft quantized (load_model(..., quant=)), side by side, prompt by prompt in
rotating order: usage [T=TARGET] python THIS.py PROMPTS.jsonl N METHOD,METHOD (the first runs also had an int8 arm)."""
import json, sys, time, torch
torch.set_num_threads(2)
from specmesh import LLM, SamplingParams, catalog
from specmesh.model.loader import load_model
import os; T = os.environ.get("T", "embedded")
prompts = [json.loads(l)["prompt"] for l in open(sys.argv[1])][:int(sys.argv[2])]
arms = {}
for q in ("bf16", "int4"):
    for m in sys.argv[3].split(","):
        llm = LLM(target=T, method=m, dtype="bfloat16")
        if q != "bf16":
            llm.models.draft = load_model(catalog.draft_for(catalog.resolve(T)), torch.bfloat16, "cpu", draft=True, quant=q)
        arms[f"{m}-{q}"] = llm
S = {k: [0.0, 0, 0, 0.0] for k in arms}
for i, p in enumerate(prompts):
    names = list(arms); names = names[i % len(names):] + names[:i % len(names)]
    for n in names:
        t = time.perf_counter(); o = arms[n].generate(p, SamplingParams(max_new_tokens=128)); S[n][0] += time.perf_counter() - t
        S[n][1] += len(o.tokens); S[n][2] += o.stats.target_forwards; S[n][3] += o.stats.draft_s
base = S[list(S)[0]][1] / S[list(S)[0]][0]
for n, (s, t, f, d) in S.items():
    print(f"{n:12} {t/s:6.1f} tok/s {t/s/base:.3f}x tau {t/f:.2f} draft {1e3*d/f:.2f} ms/step")

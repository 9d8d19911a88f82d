"""Interleaved A/B of cosine's depth choice in one process: argv rows nprompts chunk [src]. Variants: fixed (the
full depth, as before) and chosen (the policy's depth choice)."""
import collections, json, sys, time, torch
torch.set_num_threads(2)
from specmesh import LLM, SamplingParams
rows, n, chunk = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
src = sys.argv[4] if len(sys.argv) > 4 else "mixed"
if src == "mixed":
    ps = [json.loads(l)["prompt"] for f in ("prompts/tests-heldout.jsonl", "prompts/lib-heldout.jsonl") for l in open(f)]
    ps = ps[:n // 2] + ps[60:60 + n // 2]
else:
    ps = [json.loads(l)["prompt"] for l in open(src)][:n]
variants = sys.argv[5].split(",") if len(sys.argv) > 5 else ["fixed", "chosen"]
llm = LLM(target="embedded", method="cosine", dtype="bfloat16")
params = SamplingParams(max_new_tokens=96)
ids = [llm.encode(p) for p in ps]
total = {v: [0, 0.0, 0, collections.Counter()] for v in variants}
outs = {v: [] for v in variants}
for c in range(0, len(ids), chunk):
    part = ids[c:c + chunk]
    for v in (variants if c // chunk % 2 == 0 else variants[::-1]):
        engine = llm.engine(part, params, rows=rows)
        pol = engine.method.policy
        if v == "fixed":
            pol.best_depth = lambda *a, pol=pol: pol.depth
        elif v.startswith("g"):
            g = int(v[1:]); pol.best_depth = lambda *a, g=g: g
        seqs = [s for i in part for s in engine.sequences(i, params)]
        t = time.perf_counter(); engine.submit(seqs); steps = 0
        while not engine.idle:
            engine.step(); steps += 1; total[v][3][getattr(pol, "current", -1)] += 1
        total[v][1] += time.perf_counter() - t
        total[v][0] += sum(len(s.tokens) for s in seqs); total[v][2] += steps
        outs[v] += [s.tokens for s in seqs]
base = variants[0]
for v, (tok, dt, steps, d) in total.items():
    print(f"{v:8} {tok/dt:7.1f} tok/s ({tok/dt/(total[base][0]/total[base][1]):.3f}x {base}), {tok/steps:.2f} tok/step, same as {base}: {outs[v]==outs[base]}, depths {sorted(d.items())}")

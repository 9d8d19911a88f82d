import json, sys, time, torch
torch.set_num_threads(1)
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams
prompts = [json.loads(l)["prompt"] for l in open("/work/main/prompts/stdlib-heldout.jsonl")][:int(sys.argv[1])]
arms = {"sd@1t": dict(method="sd"), "pearl": dict(method="pearl"), "pearl-c": dict(method="pearl", gamma_rule="c"),
        "pearl-g5": dict(method="pearl", gamma=5), "pearl-g7": dict(method="pearl", gamma=7)}
sums = {k: [0.0, 0, 0] for k in arms}
for rnd in range(2):
    for k, opts in (list(arms.items()) if rnd == 0 else list(arms.items())[::-1]):
        with LLM("embedded", dtype="bfloat16", **opts) as llm:
            llm.generate([prompts[0]], SamplingParams(max_new_tokens=16))     # warm
            for p in prompts:
                t = time.perf_counter(); out = llm.generate([p], SamplingParams(max_new_tokens=128))[0]
                sums[k][0] += time.perf_counter() - t; sums[k][1] += out.stats.generated_tokens; sums[k][2] += out.stats.target_forwards
base = sums["sd@1t"][1] / sums["sd@1t"][0]
for k, (t, n, f) in sums.items():
    print(f"{k:10s} {n / t:7.1f} tok/s ({n / t / base:.3f}x sd@1t)  tau {n / f:.2f}")

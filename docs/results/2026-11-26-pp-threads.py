"""pp and ar alternating prompt by prompt (greedy, 128 new tokens, bf16): SHARE threads for every stage process
(0: the default share), WSPIN sets GOMP_SPINCOUNT for the launched stage processes only; GOMP_SPINCOUNT itself for every
process. Run: SHARE=2 GOMP_SPINCOUNT=3000 python docs/results/2026-11-26-pp-threads.py ar pp
The waiting rank sleeping at once was link.SPIN_S = 0 (a local patch, not kept)."""
import json, time, torch, sys, os
share = int(os.environ.get("SHARE", "0"))
import specmesh.timing as timing, specmesh.runtime.pipeline as pl
if share:
    timing.share_of_cores = lambda processes: share
    pl.share_of_cores = lambda processes: share
torch.set_num_threads(2)
if os.environ.get("WSPIN"): os.environ["GOMP_SPINCOUNT"] = os.environ["WSPIN"]
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams
prompts=[json.loads(l)["prompt"] for l in open("prompts/stdlib-heldout.jsonl")][:int(os.environ.get("N", "8"))]
llms = {m: LLM(target="embedded", method=m, dtype="bfloat16") for m in sys.argv[1:]}
for l in llms.values(): l.generate(prompts[0], SamplingParams(max_new_tokens=8))
tot = {m: 0.0 for m in llms}; toks = {m: 0 for m in llms}; outs = {}
for p in prompts:
    for m, l in llms.items():
        a = time.perf_counter(); o = l.generate(p, SamplingParams(max_new_tokens=128)); tot[m] += time.perf_counter() - a
        toks[m] += o.stats.generated_tokens if hasattr(o, "stats") else 0
        outs.setdefault(p, []).append(tuple(o.tokens))
print({m: f"{toks[m]/tot[m]:.1f} tok/s" for m in llms}, "same:", all(len(set(v)) == 1 for v in outs.values()), f"SHARE={share} SPIN={os.environ.get('GOMP_SPINCOUNT')}")
for l in llms.values(): l.close()

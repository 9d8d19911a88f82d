"""Where cosine's drafting time goes (one request at a time, 16 mixed-domain prompts): usage python THIS.py METHOD"""
import json, time, torch, collections
torch.set_num_threads(2)
from specmesh import LLM, SamplingParams
from specmesh.proposers import fused_drafters as FD, draft_model as DM
T = collections.Counter()
def timed(cls, name, key):
    f = getattr(cls, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); T[key] += time.perf_counter() - t; T[key + "#"] += 1; return r
    setattr(cls, name, g)
timed(FD.FusedDrafters, "propose", "propose")
timed(DM.DraftModel, "_forward", "model forward")
from specmesh.proposers import context_drafter as CD
timed(CD.ContextDrafter, "_lookup", "context lookup")
timed(FD.FusedDrafters, "_grow", "grow")
timed(FD.FusedDrafters, "accept", "accept")
ps = [json.loads(l)["prompt"] for f in ("prompts/tests-heldout.jsonl", "prompts/lib-heldout.jsonl") for l in list(open(f))[:8]]
llm = LLM(target="embedded", method=__import__("sys").argv[1], dtype="bfloat16")
steps = 0
for p in ps:
    o = llm.generate(p, SamplingParams(max_new_tokens=96)); steps += o.stats.target_forwards
    T["verify"] += o.stats.verify_s
for k in sorted(T):
    if not k.endswith("#"):
        print(f"{k:16} {1e3*T[k]/steps:6.2f} ms/step  calls/step {T[k+'#']/steps:.1f}")

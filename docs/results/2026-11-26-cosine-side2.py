"""Side by side in one process, prompts interleaved: usage side.py PROMPTS N 'name:method=sd' 'name:drafters=...,routed=1' ..."""
import json, sys, time
import torch
from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams
from specmesh import catalog, llm as llm_mod

real = catalog.drafters_for
def drafters_for(target, spec=""):         # "context-only": the context drafter alone (no such user option)
    return ([], True) if spec == "context-only" else real(target, spec)
llm_mod.catalog.drafters_for = drafters_for

torch.set_num_threads(2)
rows = [json.loads(l) for l in open(sys.argv[1])][:int(sys.argv[2])]
prompts = [r["prompt"] for r in rows]
domain = lambda src: "tests" if any(p in ("test", "tests", "idle_test") or p.startswith("test_") for p in src.split("/")) else "lib"
domains = [domain(r["source"]) for r in rows]
runs = {}
CONSTS = {}
from specmesh.proposers import fused_drafters as FD
DEFAULTS = {k: getattr(FD, k) for k in ('PROMPT_GAP', 'ETA', 'START', 'EXPLORE')}
for spec in sys.argv[3:]:
    name, _, rest = spec.partition(":")
    opts = dict(kv.split("=", 1) for kv in rest.split(";") if kv)
    opts = {k: (True if v == "true" else int(v) if v.lstrip("-").isdigit() else float(v) if v.replace(".", "", 1).isdigit() else v) for k, v in opts.items()}
    consts = {k: opts.pop(k) for k in list(opts) if k.isupper()}
    CONSTS[name] = consts
    runs[name] = [LLM("embedded", method=opts.pop("method", "cosine"), dtype="bfloat16", **opts), 0.0, 0, 0, [], [], 0.0]
ref = None
for i, p in enumerate(prompts):
    names = list(runs)
    names = names[i % len(names):] + names[:i % len(names)]
    outs = {}
    for name in names:
        r = runs[name]
        for k, v in (DEFAULTS | CONSTS[name]).items():
            setattr(FD, k, v)
        t = time.perf_counter()
        run = r[0].stream(p, SamplingParams(max_new_tokens=96))
        pieces = iter(run)
        next(pieces)
        first = time.perf_counter()
        for _ in pieces:
            pass
        out = run.output
        r[1] += time.perf_counter() - t
        r[6] += time.perf_counter() - first           # decoding after the first token (TPOT's time)
        r[2] += out.stats.generated_tokens; r[3] += out.stats.target_forwards
        outs[name] = out.tokens
        info = out.stats.info
        if info.get("drafters"):
            model = [n for n, d in enumerate(info["drafters"]) if d != "context"]
            top = max(model, key=lambda n: info["rounds"][n]) if model else None
            r[5].append((domains[i], None if top is None else info["drafters"][top], info["rounds"]))
    first = outs[list(runs)[0]]
    for name in runs:
        runs[name][4].append(outs[name] == first)
base = None
out = {}
for name, (_, t, tok, fwd, same, routed, decode) in runs.items():
    base = base or tok / t
    own = sum(1 for d, top, _ in routed if top and top.endswith(d))
    line = (f"{name:24s} tok/s {tok / t:6.1f} ({tok / t / base:.2f}x)  decode ms/token {decode / (tok - len(same)) * 1e3:5.2f}  "
            f"tau {tok / fwd:.3f}  same as first {sum(same)}/{len(same)}")
    if routed:
        line += f"  routed most to own domain {own}/{len(routed)}"
    print(line)
    out[name] = {"tok_s": tok / t, "decode_ms_per_token": decode / (tok - len(same)) * 1e3, "tau": tok / fwd,
                 "same_as_first": sum(same), "prompts": len(same), "routing": routed}
if len(sys.argv) and "--json" in " ".join(sys.argv[3:]): pass
json.dump(out, open(sys.argv[0] + ".json", "w"), indent=1)

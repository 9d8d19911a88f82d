"""Methods side by side in one process, prompts interleaved, each output checked against the first's: usage
N=16 python 2026-11-27-s8-env-ab.py ar=ar pp=pp pp-old=pp:SPECMESH_LEND=0 (name=method[:ENV=V,...]). The variables are
set only while that configuration's LLM is made: its worker processes and its construction see them, rank 0's
code that reads them later does not."""
import json, os, sys, time, statistics as st
from specmesh import LLM
from specmesh.spec.sampling import SamplingParams
N = int(os.environ.get("N", 8))
prompts = [json.loads(l)["prompt"] for l in open("/work/main/prompts/stdlib-heldout.jsonl")][:N]
p = SamplingParams(temperature=0, max_new_tokens=160, ignore_eos=True)
confs = {}
for spec in sys.argv[1:]:          # name=method[:ENV=V,ENV=V]
    name, rest = spec.split("=", 1)
    method, _, envs = rest.partition(":")
    saved = dict(os.environ)
    for kv in filter(None, envs.split(",")):
        k, v = kv.split("="); os.environ[k] = v
    confs[name] = LLM(target="embedded", method=method, dtype="bfloat16")
    os.environ.clear(); os.environ.update(saved)
ref = {}
res = {n: [] for n in confs}
for llm in confs.values(): llm.generate(prompts[:1], p)
for pr in prompts:
    for n, llm in confs.items():
        t = time.perf_counter(); out = llm.generate([pr], p)[0]; res[n].append(time.perf_counter() - t)
        ref.setdefault(pr, out.tokens); assert out.tokens == ref[pr], n
first = list(res)[0]
for n in res: print(f"{n:12s} {sum(res[n]):.3f}s  vs {first}: {sum(res[first]) / sum(res[n]):.3f}x")

"""Configurations side by side in one process, prompt by prompt in rotating order, as `specmesh bench` counts
(prompt time included, greedy). usage: [TARGET=NAME] python THIS.py PROMPTS.jsonl N TOKENS 'label:method=sd' 'label:method=tree;min_prob=0.05' ...
Prints tok/s, the ratio to the first arm, tokens per target forward, draft and verify ms per step, and how many
outputs equal the first arm's."""
import json
import os
import sys
import time

import torch

from specmesh.llm import LLM
from specmesh.spec.sampling import SamplingParams


def parse(spec: str) -> tuple[str, dict]:
    name, _, rest = spec.partition(":")
    opts = dict(kv.split("=", 1) for kv in rest.split(";") if kv)
    num = lambda v: int(v) if v.isdigit() else float(v) if v.replace(".", "", 1).isdigit() else v
    return name, {k: num(v) for k, v in opts.items()}


def side_by_side(arms: list[tuple[str, dict]], prompts: list[str], tokens: int) -> dict:
    target = os.environ.get("TARGET", "embedded")
    llms = {name: LLM(target, dtype="bfloat16", **opts) for name, opts in arms}
    sums = {name: dict(s=0.0, tokens=0, forwards=0, draft_s=0.0, verify_s=0.0, same=0) for name in llms}
    for i, prompt in enumerate(prompts):
        order = list(llms)[i % len(llms):] + list(llms)[:i % len(llms)]
        outs = {}
        for name in order:
            start = time.perf_counter()
            out = llms[name].generate(prompt, SamplingParams(max_new_tokens=tokens))
            s, st = sums[name], out.stats
            s["s"] += time.perf_counter() - start
            s["tokens"] += len(out.tokens); s["forwards"] += st.target_forwards
            s["draft_s"] += st.draft_s; s["verify_s"] += st.verify_s
            outs[name] = out.tokens
        for name in llms:
            sums[name]["same"] += outs[name] == outs[arms[0][0]]
    base = sums[arms[0][0]]["tokens"] / sums[arms[0][0]]["s"]
    for name, s in sums.items():
        s["tok_s"] = s["tokens"] / s["s"]
        print(f"{name:24s} {s['tok_s']:6.1f} tok/s ({s['tok_s'] / base:.3f}x)  tau {s['tokens'] / s['forwards']:.2f}  "
              f"draft {1e3 * s['draft_s'] / s['forwards']:.2f} ms/step  verify {1e3 * s['verify_s'] / s['forwards']:.2f} "
              f"ms/step  same {s['same']}/{len(prompts)}")
    return sums


if __name__ == "__main__":
    torch.set_num_threads(2)
    rows = [json.loads(line) for line in open(sys.argv[1])][:int(sys.argv[2])]
    if any("turns" in r for r in rows):         # chat requests: through the target's chat template
        from specmesh import catalog
        from specmesh.model.loader import load_tokenizer
        tok = load_tokenizer(catalog.resolve(os.environ.get("TARGET", "embedded")))
        rows = [{"prompt": tok.render_chat([{"role": "user", "content": r["turns"][0]}])} for r in rows]
    side_by_side([parse(a) for a in sys.argv[4:]], [r["prompt"] for r in rows], int(sys.argv[3]))

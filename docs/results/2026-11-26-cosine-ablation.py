"""cosine's ablations, each component switched off, at one client (real time, interleaved in one process) and on the
simulated cluster (8 requests in flight, gpu-cluster profile, virtual clock).
usage: python THIS.py PROMPTS.jsonl N {client|cluster}"""
import json, sys, time
import torch
import specmesh
from specmesh import SamplingParams
from specmesh.bench import simulate_cosine as S

torch.set_num_threads(2)
ABLATIONS = [("cosine (defaults)", {}), ("--no-routing", {"no_routing": True}), ("--no-fusion", {"no_fusion": True}),
             ("--no-scheduler", {"no_scheduler": True}), ("--no-adaptive", {"no_adaptive": True}),
             ("without the context drafter", {"drafters": "specmesh-drafter-tests,specmesh-drafter-lib"})]
prompts: list[str] = []
real = specmesh.LLM


def cluster() -> None:
    profile = S.ClusterProfile.load("gpu-cluster")
    sd = S.run_traced("sd", prompts, 8, 96, profile, "embedded")
    base = sd["tokens"] / sum(profile.step_ms("sd", t, l) for _, t, l in sd["trace"])
    print(f"{'sd':{width()}} {1000 * base:7.1f} tok/s (simulated)  {sd['tokens'] / len(sd['trace']):.2f} tokens a step")
    for name, extra in ABLATIONS:
        specmesh.LLM = lambda *a, extra=extra, **k: real(*a, **(k | extra))
        run = S.run_traced("cosine", prompts, 8, 96, profile, "embedded")
        rate = run["tokens"] / sum(profile.step_ms("cosine", t, l) for _, t, l in run["trace"])
        print(f"{name:{width()}} {1000 * rate:7.1f} tok/s (simulated, {rate / base:.2f}x sd)  "
              f"{run['tokens'] / len(run['trace']):.2f} tokens a step")


def client() -> None:
    llms = {"sd": real("embedded", method="sd", dtype="bfloat16")} | {
        name: real("embedded", method="cosine", dtype="bfloat16", **extra) for name, extra in ABLATIONS}
    totals = {name: [0.0, 0, 0, []] for name in llms}           # decode s, tokens after the first, forwards, outputs
    for i, prompt in enumerate(prompts):
        names = list(llms)[i % len(llms):] + list(llms)[:i % len(llms)]
        for name in names:
            run = llms[name].stream(prompt, SamplingParams(max_new_tokens=96))
            pieces = iter(run)
            next(pieces)
            first = time.perf_counter()
            for _ in pieces:
                pass
            t = totals[name]
            t[0] += time.perf_counter() - first
            t[1] += run.output.stats.generated_tokens - 1
            t[2] += run.output.stats.target_forwards
            t[3].append(run.output.tokens)
    sd_ms = 1e3 * totals["sd"][0] / totals["sd"][1]
    for name, (s, tokens, forwards, outs) in totals.items():
        ms = 1e3 * s / tokens
        same = sum(a == b for a, b in zip(outs, totals["sd"][3]))
        print(f"{name:{width()}} {ms:5.2f} ms a token ({ms / sd_ms:.2f}x sd)  tau {(tokens + len(outs)) / forwards:.2f}  "
              f"same as sd {same}/{len(outs)}")


def width() -> int:
    return max(len(name) for name, _ in ABLATIONS)


def main(argv: list[str]) -> None:
    """argv: THIS.py PROMPTS.jsonl N {client|cluster} (2026-11-27-s10-cosine-ablation.py runs it with more rows)."""
    prompts[:] = [json.loads(line)["prompt"] for line in open(argv[1])][:int(argv[2])]
    {"client": client, "cluster": cluster}[argv[3]]()


if __name__ == "__main__":
    main(sys.argv)

"""The cost of crossing hosts: each multi-process method on one host and across two hosts made here (bench/hosts.py,
one core each, pinned), at each link rate, with `specmesh simulate`'s figure for the same link beside it.

    specmesh bench --link 10gbit,1gbit --json crossing.json --plot crossing.png
    python -m specmesh.bench.crossing --rates 10gbit,1gbit --json crossing.json       # the same

Every figure is a real run of the method (bfloat16, the embedded models, greedy; `pearl` with γ fixed, as the
simulator runs it) but the simulated ones, which run the real algorithm on a virtual clock from a profile measured here
first (`specmesh simulate --calibrate --hosts`). A shared machine slows down for seconds at a time, so each side
takes what the machine does undisturbed: the profile each cost's fastest of its rounds, a run each prompt's
fastest of `--repeat` answers, a pause between them (`job`, one process or torchrun job for them all). Needs root
(network namespaces).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from specmesh.bench.hosts import Hosts

PIPELINES = ("pp", "pipedec", "stpp")
METHODS = (*PIPELINES, "pearl", "sd", "cosine")     # sd: its target split over the two (--tp 2); cosine: its drafter
PROMPTS = ("def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\ndef list_files(path):")


OPTIONS = {"pearl": {"gamma": 4}, "sd": {"tp": 2, "gamma": 4},
           "cosine": {"drafters": "specmesh-drafter-lib,context", "gamma": 4, "no_scheduler": True,
                      "drafter_processes": True}}


def options(method: str) -> dict:
    """The options every real run of `method` takes here: those `specmesh simulate` runs it with by default
    (simulator/calibration.py's OPTIONS: pearl's and cosine's γ fixed, as their rules choose by wall-clock times a
    simulation has not got; sd's target split over the ranks; cosine's one model drafter in a process of its own)."""
    return OPTIONS.get(method, {"stages": 2})


def flags(method: str) -> list[str]:
    return [flag for k, v in options(method).items()
            for flag in ([f"--{k.replace('_', '-')}"] + ([] if v is True else [str(v)]))]


def job(method: str, tokens: int, repeat: int, prompts: list[str]) -> None:
    """One process, or every rank of a torchrun job: rank 0 answers each prompt `repeat` times and prints, as JSON,
    each prompt's fastest tokens/s and last answer; the ranks after it become `specmesh generate` processes, which
    serve the method."""
    from specmesh import LLM, SamplingParams
    from specmesh.timing import pause_then
    if int(os.environ.get("RANK", 0)):
        os.execv(sys.executable, [sys.executable, "-m", "specmesh.cli", "generate", "--target", "embedded", "--dtype",
                                  "bfloat16", "--method", method, *flags(method), prompts[0]])
    params, out = SamplingParams(max_new_tokens=tokens), {"tokens_per_s": [], "tokens": [], "traffic": []}
    with LLM(target="embedded", dtype="bfloat16", method=method, **options(method)) as llm:
        llm.generate(prompts[0], params)                                    # the processes' first steps
        traffic = llm.models.remote.link.traffic                            # rank 0's: every message of 2 ranks
        for prompt in prompts:
            fastest = 0.0
            for _ in range(repeat):
                before = traffic.copy()
                answer = pause_then(lambda: llm.generate(prompt, params))
                fastest = max(fastest, answer.stats.tokens_per_s)
            out["tokens_per_s"].append(fastest)
            out["tokens"].append(answer.tokens)
            out["traffic"].append(per_token(traffic - before, len(answer.tokens)))
    print(json.dumps(out))


def per_token(traffic: Counter, tokens: int) -> dict:
    """An answer's messages and bytes (in all, and by way) per token it gave."""
    ways = {way: n / tokens for way, n in sorted(traffic.items())}
    messages = sum(n for way, n in ways.items() if not way.endswith("bytes"))
    return {"messages": messages, "bytes": sum(ways.values()) - messages, "ways": ways}


def job_argv(method: str, tokens: int, repeat: int, prompts: list[str]) -> list[str]:
    return ["-m", "specmesh.bench.crossing", "--job", method, "--max-new-tokens", str(tokens), "--repeat",
            str(repeat), "--prompts", json.dumps(prompts)]


def checked(done: subprocess.CompletedProcess, what: str) -> dict:
    """A finished job's JSON, or a RuntimeError with its stderr."""
    if done.returncode:
        raise RuntimeError(f"{what}: {done.stderr[-800:]}")
    return json.loads(done.stdout)


def one_host(method: str, tokens: int, cores: str, repeat: int = 5, prompts=PROMPTS) -> dict:
    """`job` in one process on `cores` (the method's own processes beside it)."""
    done = subprocess.run(["taskset", "-c", cores, sys.executable, *job_argv(method, tokens, repeat, list(prompts))],
                          capture_output=True, text=True, timeout=900)
    return checked(done, f"{method} on one host")


def across_hosts(method: str, tokens: int, rate: str, cpus: list[list[int]] | None, repeat: int = 5,
                 prompts=PROMPTS) -> dict:
    """`job` under torchrun on two hosts at `rate` (host i pinned to the cores cpus[i]; None: not pinned)."""
    with Hosts(2, rate=rate, cpus=cpus) as hosts:
        done = hosts.torchrun(job_argv(method, tokens, repeat, list(prompts)), timeout=900)[0]
    return checked(done, f"{method} across hosts at {rate}")


def simulated(method: str, tokens: int, rate: str, profile: Path, prompts=PROMPTS) -> list[float]:
    """`specmesh simulate`'s tokens/s for each prompt, every rank on a host of its own at `rate` (the simulator's
    defaults are `options`' but for the pipelines' stages)."""
    def rate_of(prompt: str) -> float:
        done = subprocess.run([sys.executable, "-m", "specmesh.cli", "simulate", "--target", "embedded", "--method",
                               method, *(["--stages", "2"] if method in PIPELINES else []), "--profile", str(profile),
                               "--link", rate,
                               "--max-new-tokens", str(tokens), "--json", "-", prompt],
                              capture_output=True, text=True, timeout=600)
        return checked(done, f"simulate {method}")["tokens_per_s"]
    return [rate_of(p) for p in prompts]


def run(rates: list[str], tokens: int, methods=METHODS, repeat: int = 5, prompts=PROMPTS) -> dict:
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise ValueError("the crossing bench needs two cores (one per host)")
    with tempfile.TemporaryDirectory() as tmp:
        profile = Path(tmp) / "profile.json"
        subprocess.run([sys.executable, "-m", "specmesh.cli", "simulate", "--calibrate", str(profile), "--hosts"],
                       check=True, capture_output=True, text=True)
        link_ms = json.loads(profile.read_text())["link_ms"]
        rows = []
        for method in methods:
            alone = one_host(method, tokens, ",".join(map(str, cores)), repeat, prompts)["tokens_per_s"]
            for rate in rates:
                hosts = across_hosts(method, tokens, rate, [[c] for c in cores], repeat, prompts)
                row = {"method": method, "rate": rate, "one_host_tokens_per_s": statistics.median(alone),
                       "hosts_tokens_per_s": statistics.median(hosts["tokens_per_s"]),
                       "messages_per_token": statistics.median(t["messages"] for t in hosts["traffic"]),
                       "bytes_per_token": statistics.median(t["bytes"] for t in hosts["traffic"]),
                       "simulated_tokens_per_s": statistics.median(simulated(method, tokens, rate, profile, prompts))}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return {"what": "the embedded models in bfloat16, greedy, 2 processes: one host (both cores) vs 2 hosts (network "
                    "namespaces on this machine, one core each, pinned; tbf at each rate); the median over the "
                    "prompts of each prompt's fastest answer; the messages between the hosts (either way) and "
                    "their bytes per token given, as rank 0 counts them",
            "tokens": tokens, "repeat": repeat, "prompts": list(prompts), "link_ms": link_ms, "rows": rows}


def table(result: dict) -> str:
    lines = ["| method | link | messages / token | bytes / token | 1 host tok/s | 2 hosts tok/s | simulated tok/s "
             "| simulated / measured |", "|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        sim = r["simulated_tokens_per_s"]
        lines.append(f"| {r['method']} | {r['rate']} | {r['messages_per_token']:.2f} | {r['bytes_per_token']:.0f} | "
                     f"{r['one_host_tokens_per_s']:.0f} | {r['hosts_tokens_per_s']:.0f} | {sim:.0f} | "
                     f"{sim / r['hosts_tokens_per_s']:.2f} |")
    return "\n".join(lines)


def plot(result: dict, path: str) -> None:
    """Tokens per second per method: one host, then across the hosts at each rate, measured and simulated."""
    from specmesh.bench.report import pyplot
    plt = pyplot()
    methods = list(dict.fromkeys(r["method"] for r in result["rows"]))
    rates = list(dict.fromkeys(r["rate"] for r in result["rows"]))
    row = {(r["method"], r["rate"]): r for r in result["rows"]}
    colors = ["#3a7", "#37a", "#a73", "#a37"]
    bars = [("1 host", [row[m, rates[0]]["one_host_tokens_per_s"] for m in methods], "#888", None)]
    for k, rate in enumerate(rates):
        color = colors[k % len(colors)]
        bars += [(f"2 hosts, {rate}", [row[m, rate]["hosts_tokens_per_s"] for m in methods], color, None),
                 (f"2 hosts, {rate}, simulated", [row[m, rate]["simulated_tokens_per_s"] for m in methods], color,
                  "//")]
    fig, ax = plt.subplots(figsize=(2 + 1.4 * len(methods), 3.6))
    width = 0.8 / len(bars)
    for i, (label, values, color, hatch) in enumerate(bars):
        xs = [j + (i - (len(bars) - 1) / 2) * width for j in range(len(methods))]
        ax.bar(xs, values, width, label=label, color=color, hatch=hatch, edgecolor="white")
    ax.set_xticks(range(len(methods)), methods)
    ax.set_ylabel("tokens / s")
    ax.set_title("one host vs two hosts (one core each), measured and simulated", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specmesh.bench.crossing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10gbit,1gbit", help="link rates, comma-separated (default: 10gbit,1gbit)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", metavar="FILE", help="write the result here")
    parser.add_argument("--job", metavar="METHOD", help=argparse.SUPPRESS)    # job(): a process of the runs
    parser.add_argument("--repeat", type=int, default=5,
                        help="answers to each prompt in a run, the fastest counting (default: 5)")
    parser.add_argument("--prompts", type=json.loads, default=list(PROMPTS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job:
        job(args.job, args.max_new_tokens, args.repeat, args.prompts)
        return 0
    result = run(args.rates.split(","), args.max_new_tokens, args.methods.split(","), args.repeat)
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

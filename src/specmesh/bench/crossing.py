"""The cost of crossing hosts: each multi-process method on one host and across two hosts made here (bench/hosts.py,
one core each, pinned), at each link rate, with `specmesh simulate`'s figure for the same link beside it.

    python -m specmesh.bench.crossing --rates 10gbit,1gbit --json docs/results/crossing.json

Every figure is a real run of `specmesh generate` (bfloat16, the embedded models, greedy) but the simulated ones,
which run the real algorithm on a virtual clock from a profile measured here first (`specmesh simulate --calibrate
--hosts`). Needs root (network namespaces).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from specmesh.bench.hosts import Hosts

METHODS = ("pp", "pipedec", "stpp", "pearl")
SIMULATED = ("pp", "pipedec", "stpp")           # the pipeline simulator's methods
PROMPTS = ("def fibonacci(n):", "class Stack:\n    def __init__(self):", "import os\n\ndef list_files(path):")


def generate(method: str, prompt: str, tokens: int) -> list[str]:
    return ["-m", "specmesh.cli", "generate", "--target", "embedded", "--method", method, "--max-new-tokens",
            str(tokens), "--json", "-", prompt]


def tokens_per_s(stdout: str) -> float:
    return json.loads(stdout)["stats"]["tokens_per_s"]


def median_over_prompts(rate_of: Callable[[str], float]) -> float:
    return statistics.median(rate_of(prompt) for prompt in PROMPTS)


def checked(done: subprocess.CompletedProcess, what: str) -> str:
    """A finished run's stdout, or a RuntimeError with its stderr."""
    if done.returncode:
        raise RuntimeError(f"{what}: {done.stderr[-800:]}")
    return done.stdout


def one_host(method: str, tokens: int, cores: str) -> float:
    """Median tokens/s over the prompts, every process of the method on `cores`."""
    def rate_of(prompt: str) -> float:
        done = subprocess.run(["taskset", "-c", cores, sys.executable, *generate(method, prompt, tokens)],
                              capture_output=True, text=True, timeout=600)
        return tokens_per_s(checked(done, f"{method} on one host"))
    return median_over_prompts(rate_of)


def across_hosts(method: str, tokens: int, rate: str, cpus: list[list[int]]) -> float:
    def rate_of(prompt: str) -> float:
        with Hosts(2, rate=rate, cpus=cpus) as hosts:
            done = hosts.torchrun(generate(method, prompt, tokens), timeout=600)[0]
        return tokens_per_s(checked(done, f"{method} across hosts at {rate}"))
    return median_over_prompts(rate_of)


def simulated(method: str, tokens: int, rate: str, profile: Path) -> float:
    def rate_of(prompt: str) -> float:
        done = subprocess.run([sys.executable, "-m", "specmesh.cli", "simulate", "--target", "embedded", "--method",
                               method, "--stages", "2", "--profile", str(profile), "--link", rate,
                               "--max-new-tokens", str(tokens), "--json", "-", prompt],
                              capture_output=True, text=True, timeout=600)
        return json.loads(checked(done, f"simulate {method}"))["tokens_per_s"]
    return median_over_prompts(rate_of)


def run(rates: list[str], tokens: int, methods=METHODS) -> dict:
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
            alone = one_host(method, tokens, ",".join(map(str, cores)))
            for rate in rates:
                row = {"method": method, "rate": rate, "one_host_tokens_per_s": alone,
                       "hosts_tokens_per_s": across_hosts(method, tokens, rate, [[c] for c in cores]),
                       "simulated_tokens_per_s": simulated(method, tokens, rate, profile) if method in SIMULATED
                       else None}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    return {"what": "the embedded models in bfloat16, greedy, 2 processes: one host (both cores) vs 2 hosts (network "
                    "namespaces on this machine, one core each, pinned; tbf at each rate)",
            "tokens": tokens, "prompts": list(PROMPTS), "link_ms": link_ms, "rows": rows}


def table(result: dict) -> str:
    lines = ["| method | link | 1 host tok/s | 2 hosts tok/s | simulated tok/s | simulated / measured |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        sim = r["simulated_tokens_per_s"]
        ratio = f"{sim / r['hosts_tokens_per_s']:.2f}" if sim else "not simulated"
        lines.append(f"| {r['method']} | {r['rate']} | {r['one_host_tokens_per_s']:.0f} | "
                     f"{r['hosts_tokens_per_s']:.0f} | {f'{sim:.0f}' if sim else '-'} | {ratio} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specmesh.bench.crossing", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rates", default="10gbit,1gbit", help="link rates, comma-separated (default: 10gbit,1gbit)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--json", metavar="FILE", help="write the result here")
    args = parser.parse_args(argv)
    result = run(args.rates.split(","), args.max_new_tokens, args.methods.split(","))
    print(table(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

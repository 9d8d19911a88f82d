"""A method's speed projected to a larger target (labelled projected): the token behaviour of a real run, the
costs of the larger files.

Where no real model of the size can be had, a bench run on the real models gives what each method does with
tokens (its JSON: tokens per target forward, rows per verification, draft forwards per step, the proposer's own
time), and the larger files (real shapes, random weights: bench/shapes.py) give what a forward costs: the
target's by width and the draft's of one row, measured here. Per verification step:

    ms = draft_forwards x draft_ms(1)                      (a draft model's steps; without one: the run's own
                                                            proposing time, which does not grow with the target)
         + target_ms(rows per verification)
    tokens = tokens per target forward
    projected tok/s = 1000 tokens / ms,  against ar's 1000 / target_ms(1)

and, for a chain draft, the γ that maximizes it from the run's acceptance rate a (tokens per step
(1 - a^(γ+1)) / (1 - a), each drafted token accepted with probability a independently).

    python -m specmesh.bench.project --target 8B.gguf --draft 1B.gguf --run smollm2.json --run gemma.json
"""
from __future__ import annotations

import argparse
import json
import platform
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specmesh.kernels import cpu_model
from specmesh.timing import by_width, widths_ms

WIDTHS = (1, 2, 4, 8, 16, 32)


@dataclass(frozen=True)
class Projection:
    method: str
    run: str                        # the bench JSON its token behaviour comes from
    tokens_per_step: float
    rows: float                     # rows per verification forward
    draft_forwards: float           # per step
    step_ms: float
    tokens_per_s: float
    speedup_vs_ar: float
    best_gamma: int | None = None   # a chain draft's γ by these costs and the run's acceptance rate
    best_gamma_speedup: float | None = None


def measure(path: Path, widths=WIDTHS, context: int = 256, reps: int = 7) -> dict[int, float]:
    """A model file's forward time in ms by width (rows), after `context` cached tokens, bfloat16 (the widths
    measured in turns: timing.widths_ms)."""
    from specmesh.model.loader import load_model
    return widths_ms(load_model(path, torch.bfloat16), tuple(widths), context, reps)


def chain_gamma(acceptance: float, draft_ms: float, target_ms, most: int = 16) -> tuple[int, float]:
    """The γ with the most tokens per ms for a chain draft accepted token by token with probability
    `acceptance`, and its tokens per ms."""
    def rate(g: int) -> float:
        tokens = g + 1 if acceptance >= 1 else (1 - acceptance ** (g + 1)) / (1 - acceptance)
        return tokens / (g * draft_ms + target_ms(g + 1))
    best = max(range(1, most + 1), key=rate)
    return best, rate(best)


def project(run: dict, name: str, target: dict[int, float], draft_ms: float | None) -> list[Projection]:
    """Each speculative method of a bench JSON (`run`) projected onto the costs `target` (ms by width) and
    `draft_ms` (the draft's one-row forward; None: no draft model measured, so methods that need one are left
    out)."""
    ms = by_width(target)
    out = []
    for method, m in run["methods"].items():
        steps = m.get("verifications") or 0
        if not steps or m.get("tokens_per_forward") is None or m.get("rows_per_verification") is None:
            continue
        drafts = m.get("draft_forwards_per_step") or 0.0
        if drafts and draft_ms is None:
            continue
        propose = drafts * draft_ms if drafts else (m.get("draft_ms_per_step") or 0.0)
        step = propose + ms(round(m["rows_per_verification"]))
        tokens = m["tokens_per_forward"]
        best = None
        if drafts and m.get("acceptance_rate") is not None and m.get("options", {}).get("gamma") is not None:
            gamma, rate = chain_gamma(m["acceptance_rate"], draft_ms, ms)
            best = (gamma, rate * target[1])
        out.append(Projection(method, name, tokens, m["rows_per_verification"], drafts, step, 1e3 * tokens / step,
                              tokens * target[1] / step, *(best or (None, None))))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m specmesh.bench.project", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog=__doc__.split("\n\n", 1)[1])
    parser.add_argument("--target", required=True, type=Path, help="the larger target's file (measured here)")
    parser.add_argument("--draft", type=Path, help="a draft model's file for the methods that draft with one")
    parser.add_argument("--run", action="append", required=True, type=Path, metavar="JSON",
                        help="a bench JSON of real models whose token behaviour is projected (repeatable)")
    parser.add_argument("--out", type=Path, help="write the projection's JSON here")
    args = parser.parse_args(argv)
    runs = {}
    for path in args.run:
        try:
            runs[path.name] = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            parser.error(f"--run {path}: {e}")
    for path in (args.target, args.draft):
        if path is not None and not path.exists():
            parser.error(f"no such file: {path}")
    print(f"measuring {args.target.name} by width {', '.join(map(str, WIDTHS))} ...", flush=True)
    target = measure(args.target)
    draft_ms = measure(args.draft, (1,))[1] if args.draft else None
    rows = [p for name, run in runs.items() for p in project(run, name, target, draft_ms)]
    print(f"PROJECTED from measured costs on {cpu_model()}: {args.target.name} ar {target[1]:.1f} ms/token"
          + (f", draft {args.draft.name} {draft_ms:.1f} ms/token" if draft_ms else ""))
    print("  target ms by width: " + ", ".join(f"{w}: {t:.1f}" for w, t in target.items()))
    print(f"  {'method':<12} {'run':<36} {'tok/step':>8} {'rows':>6} {'drafts':>6} {'ms/step':>8} {'tok/s':>7} "
          f"{'x ar':>6}  best γ")
    for p in rows:
        gamma = f"{p.best_gamma} ({p.best_gamma_speedup:.2f}x)" if p.best_gamma else ""
        print(f"  {p.method:<12} {p.run[:36]:<36} {p.tokens_per_step:8.2f} {p.rows:6.1f} {p.draft_forwards:6.1f} "
              f"{p.step_ms:8.1f} {p.tokens_per_s:7.2f} {p.speedup_vs_ar:5.2f}x  {gamma}")
    if args.out:
        args.out.write_text(json.dumps({
            "label": "projected", "machine": cpu_model(), "python": platform.python_version(),
            "target": args.target.name, "draft": args.draft.name if args.draft else None,
            "target_ms_by_width": target, "draft_ms": draft_ms, "runs": sorted(runs),
            "projections": [asdict(p) for p in rows]}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

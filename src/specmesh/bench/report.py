"""Bench results as a terminal table, a plot, ratios between any two methods of a bench's JSON, and the README's
table of figures:

    python -m specmesh.bench.report BENCH.json tree/sd pipedec/pp     # each ratio with its 95% interval
    python -m specmesh.bench.report --readme README.md                # its table again, from the JSON files it names
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import numpy as np

COLUMNS = [("method", "{}"), ("dtype", "{}"), ("threads", "{}"), ("tokens_per_s", "{:.1f}"),
           ("speedup_vs_ar", "{:.2f}x"), ("speedup_ci95", "{}"), ("tokens_per_forward", "{:.2f}"),
           ("acceptance_rate", "{:.2f}"), ("mean_accepted_length", "{:.2f}"), ("draft_ms_per_step", "{:.2f}"),
           ("verify_ms_per_step", "{:.2f}"), ("mat", "{:.2f}"), ("tokens_per_timestep", "{:.2f}"),
           ("hit_rate", "{:.2f}"), ("greedy_equal_to_ar", "{}"), ("near_tie_divergences", "{}"), ("peak_rss_mb", "{:.0f}")]
HEADERS = ["method", "dtype", "thr", "tok/s", "vs ar", "95% CI", "tok/fwd", "accept", "acc.len", "draft ms",
           "verify ms", "mat", "tok/step", "hit", "= ar", "near-tie", "RSS MB"]


def print_table(result: dict, file=sys.stdout) -> None:
    rows = []
    for name, m in result["methods"].items():
        m = m | {"method": name}
        rows.append(["-" if m.get(k) is None else fmt.format(m[k]) for k, fmt in COLUMNS])
        rows[-1][HEADERS.index("= ar")] = f"{m['greedy_equal_to_ar']}/{m['prompts']}"
        ci = m.get("speedup_ci95")
        rows[-1][HEADERS.index("95% CI")] = f"{ci[0]:.2f}-{ci[1]:.2f}" if ci and name != "ar" else "-"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    print(f"{result['machine']}  {result['date']}", file=file)
    for line in [HEADERS, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)), file=file)
    print("95% CI: a paired bootstrap over the prompts of the speed ratio to ar (prompts drawn with replacement)",
          file=file)
    if bound := result.get("memory_bound"):
        ar = result["methods"]["ar"]["tokens_per_s"]
        print(f"ar's memory bound: {bound['target_weight_mb']:.0f} MB of target weights per token at "
              f"{bound['copy_gb_s']:.1f} GB/s (measured copy) = {bound['ar_tokens_per_s_bound']:.0f} tok/s; "
              f"ar ran at {ar / bound['ar_tokens_per_s_bound']:.1%} of it", file=file)
    for name, m in result["methods"].items():
        if "peer_weights" in m:
            what = "the target's own file" if m["peer_weights"] == "file" else "a copy at specmesh's precision"
            print(f"{name}: ran {m['peer_model']} ({what}; --peer-weights)", file=file)
        if "chose" in m:
            opts = ", ".join(f"{k}={v}" for k, v in m["options"].items())
            print(f"{name}: chose {m['chose']} ({opts})", file=file)
        if "c" in m:
            print(f"{name}: c = {m['c']:.2f} (target / draft forward time, one thread each), "
                  f"gamma = {m['gamma']} (mean over rounds); mat = accepted drafts per drafting phase", file=file)


def pyplot():
    """matplotlib.pyplot drawing to files, or a ValueError saying how to install it."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install -e .[plot]") from None
    return plt


def plot(result: dict, path: str) -> None:
    """Two bar charts: speedup over ar and tokens per target forward, per method."""
    plt = pyplot()
    names = list(result["methods"])
    fig, axes = plt.subplots(1, 2, figsize=(4 + 1.2 * len(names), 3.6))
    for ax, key, title in ((axes[0], "speedup_vs_ar", "tokens/s vs ar"),
                           (axes[1], "tokens_per_forward", "tokens per target forward (τ)")):
        values = [result["methods"][n][key] or 0 for n in names]
        bars = ax.bar(names, values, color=["#888" if n == "ar" else "#3a7" for n in names])
        ax.bar_label(bars, fmt="%.2f")
        ax.set_ylim(0, 1.15 * max(values + [1.0]))          # room for the labels
        ax.axhline(1.0, color="k", lw=0.6)
        ax.set_title(title)
        ax.tick_params(axis="x", rotation=30)
    fig.suptitle(f"{result['machine']} — {result['date']}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def speedup_interval(runs: list[tuple[int, float]], base: list[tuple[int, float]], level: float = 0.95,
                     resamples: int = 2000) -> list[float] | None:
    """A paired bootstrap interval for (tokens / seconds of `runs`) / (tokens / seconds of `base`), (tokens, seconds)
    per prompt, the same prompts in the same order: prompts drawn with replacement, each draw's ratio of sums, the
    central `level` of them. How far the ratio could move with other prompts like these (None under 3 prompts)."""
    if len(runs) < 3:
        return None
    (tokens, seconds), (base_tokens, base_seconds) = np.array(runs, dtype=np.float64).T, np.array(base).T
    draws = np.random.default_rng(0).integers(len(runs), size=(resamples, len(runs)))      # [R, n] prompt indices
    ratios = tokens[draws].sum(1) / seconds[draws].sum(1) * base_seconds[draws].sum(1) / base_tokens[draws].sum(1)
    lo, hi = np.quantile(ratios, [(1 - level) / 2, (1 + level) / 2])
    return [round(float(lo), 4), round(float(hi), 4)]


def ratio(result: dict, a: str, b: str) -> tuple[float, list[float] | None, int]:
    """Method a's speed over method b's on the prompts both ran (per_prompt): the ratio, its 95% interval
    (speedup_interval) and the prompt count."""
    runs: dict[str, dict[int, tuple[int, float]]] = {}
    for r in result["per_prompt"]:                     # older files have no elapsed_s: tokens / (tokens / s)
        seconds = r.get("elapsed_s") or r["new_tokens"] / r["tokens_per_s"]
        runs.setdefault(r["method"], {})[r["prompt"]] = (r["new_tokens"], seconds)
    for name in (a, b):
        if name not in runs:
            raise ValueError(f"no method {name!r} in this bench (it ran {', '.join(runs)})")
    prompts = sorted(set(runs[a]) & set(runs[b]))
    ours, theirs = ([runs[name][p] for p in prompts] for name in (a, b))
    speed = lambda done: sum(t for t, _ in done) / sum(s for _, s in done)      # noqa: E731
    return speed(ours) / speed(theirs), speedup_interval(ours, theirs), len(prompts)


def is_peer(method: str) -> bool:
    """Another engine run beside specmesh's methods (llama.cpp's tools or bindings, transformers)."""
    return method.startswith(("llama.cpp", "hf"))


def machine_cell(machine: str) -> str:
    """The CPU and its vector units from a bench's machine line, and the kernels it was held to where it was
    (SPECMESH_KERNELS: a stand-in for a CPU without those units)."""
    held = re.search(r"SPECMESH_KERNELS=([\w-]+(?:,[\w-]+)*)", machine)
    return machine.split("), ")[0] + ")" + (f", held to {held[1]}" if held else "")


def figures_row(result: dict) -> str:
    """One bench as a row of the README's table: the model and prompts, the machine, `ar`'s speed, specmesh's fastest
    method over `ar`, and against the peer where one ran (its plain decoding and its fastest)."""
    config, methods = result.get("config", {}), result["methods"]
    speed = {name: m["tokens_per_s"] for name, m in methods.items()}
    ours = max((n for n in speed if not is_peer(n)), key=speed.get)
    peers = [n for n in speed if is_peer(n)]
    plain = next((n for n in ("llama.cpp", "hf") if n in speed), None)
    cells = [config.get("target", "?"), config.get("prompts", "?"), machine_cell(result["machine"]),
             f"{speed['ar']:.1f}", f"`{ours}` {speed[ours] / speed['ar']:.2f}x",
             f"{speed['ar'] / speed[plain]:.2f}x" if plain else "–",
             f"{speed[ours] / max(speed[n] for n in peers):.2f}x (`{max(peers, key=speed.get)}`)" if peers else "–",
             f"{min(m['greedy_equal_to_ar'] for n, m in methods.items() if not is_peer(n))}/"
             f"{methods['ar']['prompts']}", result["date"][:10], result.get("commit", "?")]
    return "| " + " | ".join(cells) + " |"


FIGURES = re.compile(r"(<!-- figures from: (?P<files>[^>]*?) -->\n)(?P<table>.*?)(<!-- end of figures -->)", re.S)
FIGURES_HEAD = ("| model | prompts | machine | `ar` tok/s | fastest vs `ar` | `ar` vs llama.cpp | fastest vs the "
                "peer's fastest | = `ar` | date | commit |\n|---|---|---|---|---|---|---|---|---|---|\n")


def readme_figures(readme: Path) -> str:
    """The README's text with its table of figures made again from the bench JSON files its marker names (paths
    relative to the README)."""
    text = readme.read_text()
    found = FIGURES.search(text)
    if found is None:
        raise ValueError(f"{readme}: no '<!-- figures from: FILE.json ... -->' ... '<!-- end of figures -->' block")
    rows = [figures_row(json.loads((readme.parent / f).read_text())) for f in found["files"].split()]
    return text[:found.start("table")] + FIGURES_HEAD + "\n".join(rows) + "\n" + text[found.end("table"):]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m specmesh.bench.report",
                                     description="ratios between methods of a `specmesh bench --json` file, or the "
                                                 "README's table of figures made again from its bench files")
    parser.add_argument("bench", nargs="?", help="the bench's JSON file")
    parser.add_argument("pairs", nargs="*", metavar="A/B", help="method A's speed over method B's, e.g. tree/sd")
    parser.add_argument("--readme", type=Path, metavar="README.md",
                        help="write this file's table of figures again from the bench JSON files it names")
    args = parser.parse_args(argv)
    if args.readme is None and (args.bench is None or not args.pairs):
        parser.error("give BENCH.json and at least one A/B pair, or --readme README.md")
    try:
        if args.readme is not None:
            args.readme.write_text(readme_figures(args.readme))
            return
        result = json.loads(open(args.bench).read())
        for pair in args.pairs:
            a, slash, b = pair.partition("/")
            if not slash or not a or not b:
                raise ValueError(f"{pair!r}: a pair is two method names with a slash, e.g. tree/sd")
            value, ci, n = ratio(result, a, b)
            interval = f" (95% CI {ci[0]:.2f}-{ci[1]:.2f})" if ci else ""
            print(f"{a} vs {b}: {value:.3f}x{interval}, {n} prompts")
    except (OSError, ValueError, KeyError) as e:
        parser.exit(2, f"{parser.prog}: error: {e}\n")


if __name__ == "__main__":
    main()

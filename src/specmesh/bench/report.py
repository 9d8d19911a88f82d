"""Bench results as a terminal table."""
from __future__ import annotations

import sys

COLUMNS = [("method", "{}"), ("dtype", "{}"), ("threads", "{}"), ("tokens_per_s", "{:.1f}"),
           ("speedup_vs_ar", "{:.2f}x"), ("speedup_ci95", "{}"), ("tokens_per_forward", "{:.2f}"), ("acceptance_rate", "{:.2f}"),
           ("mean_accepted_length", "{:.2f}"), ("draft_ms_per_step", "{:.2f}"),
           ("verify_ms_per_step", "{:.2f}"), ("mat", "{:.2f}"), ("tokens_per_timestep", "{:.2f}"),
           ("hit_rate", "{:.2f}"), ("greedy_equal_to_ar", "{}"), ("near_tie_divergences", "{}"), ("peak_rss_mb", "{:.0f}")]
HEADERS = ["method", "dtype", "thr", "tok/s", "vs ar", "95% CI", "tok/fwd", "accept", "acc.len", "draft ms", "verify ms", "mat",
           "tok/step", "hit", "= ar", "near-tie", "RSS MB"]


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
        if "chose" in m:
            opts = ", ".join(f"{k}={v}" for k, v in m["options"].items())
            print(f"{name}: chose {m['chose']} ({opts})", file=file)
        if "c" in m:
            print(f"{name}: c = {m['c']:.2f} (target / draft forward time, one thread each), "
                  f"gamma = {m['gamma']} (mean over rounds); mat = accepted drafts per drafting phase", file=file)


def plot(result: dict, path: str) -> None:
    """Two bar charts: speedup over ar and tokens per target forward, per method."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install -e .[plot]") from None
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

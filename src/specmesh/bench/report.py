"""Bench results as a terminal table."""
from __future__ import annotations

import sys

COLUMNS = [("method", "{}"), ("dtype", "{}"), ("threads", "{}"), ("tokens_per_s", "{:.1f}"),
           ("speedup_vs_ar", "{:.2f}x"), ("tokens_per_forward", "{:.2f}"), ("acceptance_rate", "{:.2f}"),
           ("mean_accepted_length", "{:.2f}"), ("greedy_equal_to_ar", "{}"), ("near_tie_divergences", "{}"),
           ("peak_rss_mb", "{:.0f}")]
HEADERS = ["method", "dtype", "thr", "tok/s", "vs ar", "tok/fwd", "accept", "acc.len", "= ar", "near-tie", "RSS MB"]


def print_table(result: dict, file=sys.stdout) -> None:
    rows = []
    for name, m in result["methods"].items():
        m = m | {"method": name}
        rows.append(["-" if m.get(k) is None else fmt.format(m[k]) for k, fmt in COLUMNS])
        rows[-1][8] = f"{m['greedy_equal_to_ar']}/{m['prompts']}"
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(HEADERS)]
    print(f"{result['machine']}  {result['date']}", file=file)
    for line in [HEADERS, *rows]:
        print("  ".join(c.rjust(w) for c, w in zip(line, widths)), file=file)

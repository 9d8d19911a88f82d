"""How big an engine is: its cache rows (sequences decoded together) and the tokens each row holds.

One rule for `LLM` and the server, sized once when an engine is built: a row holds a full context (the target's,
or `max_len`) plus the method's slack, in the target's cache and the draft's; up to `max_batch` rows (default
MAX_BATCH) fit within `max_kv_mb` (default a quarter of the memory available now). Where not even one full-context
row fits and no `max_len` was asked for (a long-context model: Llama 3.1 8B's 131,072 tokens take 16 GiB in bf16), the
row holds what does fit. The caches are mapped lazily (model/cache.py): memory is spent only where tokens are
written, so the bound is the worst case, not what a short request costs.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

MAX_BATCH = 16              # rows by default
MIN_LEN = 256               # the least a row may hold when memory cuts it down


@dataclass(frozen=True)
class Sizing:
    rows: int
    max_len: int            # cache slots a row holds: context + slack
    context: int            # tokens a sequence may reach (prompt + generated)


def kv_mb_per_token(models) -> float:
    """MB of keys and values a token holds in the target's cache and the draft's."""
    return sum(m.config.num_layers * 2 * m.config.num_kv_heads * m.config.head_dim * m.cache_dtype.itemsize
               for m in (models.target, models.draft) if m is not None) / 2 ** 20


def available_mb() -> float:
    """Memory available for new allocations (Linux's MemAvailable; elsewhere the free physical pages)."""
    try:
        with open("/proc/meminfo") as f:
            return next(int(line.split()[1]) / 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration):
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def size(models, slack: int, max_batch: int | None = None, max_kv_mb: float | None = None,
         max_len: int | None = None) -> Sizing:
    """The rows and row length for these models and a method of `slack`; asked-for sizes past the bound are an
    error naming what to lower."""
    budget = max_kv_mb if max_kv_mb is not None else available_mb() / 4
    per_token = kv_mb_per_token(models)
    full = models.target.config.max_position_embeddings
    context = min(full, max_len) if max_len is not None else full
    if max_len is None and max_batch is None and (context + slack) * per_token > budget:   # a long context: what fits
        context = max(MIN_LEN, int(budget / per_token) - slack)
    row_mb = (context + slack) * per_token
    rows = max_batch or max(1, min(MAX_BATCH, int(budget // row_mb)))
    if rows * row_mb > budget:
        raise ValueError(f"a batch of {rows} rows of {context} tokens needs {rows * row_mb:.0f} MB of KV cache "
                         f"({row_mb:.1f} MB a row), over the bound of {budget:.0f} MB: lower max_batch (--max-batch) "
                         f"or max_len, or raise max_kv_mb (--max-kv-mb)")
    return Sizing(rows, context + slack, context)

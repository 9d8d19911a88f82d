"""Decoding methods: each declared once (methods/base.py's MethodSpec), built into a step the engine runs.

`ar` and the speculative methods (`sd`, `tree`, `easyspec`, `cosine`, `selfdraft`, `suffix`: methods/speculative.py) step over any
number of running sequences; `pearl` and the pipelines (methods/pipeline/) run their own loops
across processes, one sequence at a time (methods/loop.py).
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from specmesh.engine.engine import Engine
from specmesh.engine.prefix_cache import PrefixCache
from specmesh.engine.runner import PREFILL_CHUNK, Runner
from specmesh.methods.base import Configured, MethodSpec, Models, configure
from specmesh.model.tokenizer import Tokenizer
from specmesh.options import CARDS

# where each method's MethodSpec is declared (module under specmesh.methods, name): imported when first asked for,
# so a run imports only its own method's modules
WHERE = {"ar": ("ar", "SPEC"), "sd": ("speculative", "SD"), "tree": ("speculative", "TREE"),
         "easyspec": ("speculative", "EASYSPEC"), "cosine": ("speculative", "COSINE"),
         "selfdraft": ("speculative", "SELFDRAFT"), "suffix": ("speculative", "SUFFIX"), "pearl": ("pearl", "SPEC"),
         "pp": ("pipeline.pp", "SPEC"), "pipedec": ("pipeline.pipedec", "SPEC"), "stpp": ("pipeline.stpp", "SPEC")}


class Registry(Mapping):
    """name -> MethodSpec, in CARDS' order, each imported on first use."""

    def __getitem__(self, name: str) -> MethodSpec:
        module, attr = WHERE[name]
        return getattr(importlib.import_module(f"specmesh.methods.{module}"), attr)

    def __iter__(self) -> Iterator[str]:
        return iter(CARDS)

    def __len__(self) -> int:
        return len(CARDS)


METHODS = Registry()


def get(name: str, options: dict | None = None, defaults: dict | None = None) -> Configured:
    """The method `name` with `options` applied over `defaults` (options of other methods are ignored)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: auto, {', '.join(METHODS)}")
    return configure(METHODS[name], options or {}, defaults)


def engine(models: Models, method: Configured | list[Configured], tokenizer: Tokenizer, rows: int, max_len: int,
           prefix_cache: PrefixCache | None = None, prefill_chunk: int = PREFILL_CHUNK,
           prefill_share: float | None = None, per_request: int | None = None) -> Engine:
    """An engine running `method` on `models` over `rows` cache rows of `max_len` slots (engine/sizing.py sizes
    them; a method that takes one sequence at a time gets one row). Several methods: each request names one, and
    one step carries rows of each (methods/mixed.py)."""
    several = list(method) if isinstance(method, (list, tuple)) else [method]
    first = several[0]
    rows = min(rows, first.spec.max_rows or rows)
    runner = Runner(models.target, rows, max_len, prefix_cache, prefill_chunk)
    context = min(models.target.config.max_position_embeddings, max_len - max(m.slack for m in several))
    if len(several) == 1:
        built, name = first.spec.build(models, first, runner), first.name
    else:
        from specmesh.methods.mixed import build_mixed
        built, name = build_mixed(models, {m.name: m for m in several}, runner), ",".join(m.name for m in several)
    return Engine(runner, built, tokenizer, name, context, first.spec.check_params, prefill_share, per_request,
                  tuple(m.name for m in several))


__all__ = ["METHODS", "Configured", "MethodSpec", "Models", "engine", "get"]

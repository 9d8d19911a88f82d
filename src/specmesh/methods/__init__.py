"""Decoding methods: each declared once (methods/base.py's MethodSpec), built into a step the engine runs.

`ar` and the speculative methods (`sd`, `tree`, `easyspec`, `cosine`, `selfdraft`: methods/speculative.py) step over any
number of running sequences; `pearl` and the pipelines (methods/pipeline/) run their own loops
across processes, one sequence at a time (methods/loop.py).
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from specmesh.methods.base import Configured, MethodSpec, Models, configure
from specmesh.options import CARDS, OPTIONS

# where each method's MethodSpec is declared (module under specmesh.methods, name): imported when first asked for,
# so a run imports only its own method's modules
WHERE = {"ar": ("ar", "SPEC"), "sd": ("speculative", "SD"), "tree": ("speculative", "TREE"),
         "easyspec": ("speculative", "EASYSPEC"), "cosine": ("speculative", "COSINE"),
         "selfdraft": ("speculative", "SELFDRAFT"), "pearl": ("pearl", "SPEC"), "pp": ("pipeline.pp", "SPEC"),
         "pipedec": ("pipeline.pipedec", "SPEC"), "stpp": ("pipeline.stpp", "SPEC")}


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


__all__ = ["METHODS", "OPTIONS", "Configured", "MethodSpec", "Models", "get"]

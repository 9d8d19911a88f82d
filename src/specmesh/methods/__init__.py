"""Decoding methods: each declared once (methods/base.py's MethodSpec), built into a step the engine runs.

`ar` and the speculative methods (`sd`, `tree`, `easyspec`, `cosine`, `selfdraft`: methods/speculative.py) step over any
number of running sequences; `pearl` and the pipelines (methods/pipeline/) run their own loops
across processes, one sequence at a time (methods/loop.py).
"""
from __future__ import annotations

from specmesh.methods import ar, pearl, speculative
from specmesh.methods.base import Configured, MethodSpec, Models, configure
from specmesh.methods.pipeline import pipedec, pp, stpp
from specmesh.options import OPTIONS

METHODS: dict[str, MethodSpec] = {spec.name: spec for spec in (
    ar.SPEC, speculative.SD, speculative.TREE, speculative.EASYSPEC,
    speculative.COSINE, speculative.SELFDRAFT, pearl.SPEC, pp.SPEC, pipedec.SPEC, stpp.SPEC)}


def get(name: str, options: dict | None = None, defaults: dict | None = None) -> Configured:
    """The method `name` with `options` applied over `defaults` (options of other methods are ignored)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: auto, {', '.join(METHODS)}")
    return configure(METHODS[name], options or {}, defaults)


def having(option: str) -> list[MethodSpec]:
    """The methods that have `option`."""
    return [spec for spec in METHODS.values() if option in spec.defaults]


__all__ = ["METHODS", "OPTIONS", "Configured", "MethodSpec", "Models", "get", "having"]

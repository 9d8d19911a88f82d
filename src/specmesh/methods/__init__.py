"""Decoding methods. Each module has `decode(models, job, **options)`, a generator that
yields, per step, the tokens newly committed for each of the job's rows (a list of
lists; the generation driver stops it once every row is finished), plus
`NEEDS_DRAFT`, `OPTIONS` (defaults) and `slack(**options)` (extra cache slots)."""
from __future__ import annotations

import functools

from specmesh.methods import ar, sd, tree

METHODS = {"ar": ar, "sd": sd, "tree": tree}


def get(name: str):
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    return METHODS[name]


def bind(name: str, options: dict) -> tuple[object, object, int]:
    """(module, decode with options bound, cache slack) for a method and the options that apply to it."""
    module = get(name)
    known = {k for m in METHODS.values() for k in m.OPTIONS}
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown method option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    opts = {k: v for k, v in options.items() if k in module.OPTIONS and v is not None}
    for k, v in opts.items():
        if not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}: {k} must be a positive integer, got {v!r}")
    return module, functools.partial(module.decode, **opts), module.slack(**(module.OPTIONS | opts))

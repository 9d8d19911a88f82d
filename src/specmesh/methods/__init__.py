"""Decoding methods. Each module has `decode(models, job, **options)`, a generator that
yields, per step, the tokens newly committed for each of the job's rows (a list of
lists; the generation driver stops it once every row is finished), plus
`NEEDS_DRAFT`, `OPTIONS` (defaults) and `slack(**options)` (extra cache slots);
`BATCHED = True` when it decodes several rows at once; `start(models, draft, dtype,
options)` when it runs other processes (pearl's draft rank, the pipelines' stages)."""
from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

from specmesh.methods import ar, pearl, pipedec, pp, sd, selfdraft, stpp, tree

METHODS = {"ar": ar, "sd": sd, "tree": tree, "selfdraft": selfdraft, "pearl": pearl, "pp": pp,
           "pipedec": pipedec, "stpp": stpp}


@dataclass
class Method:
    name: str
    decode: Callable            # decode(models, job) with the options bound
    needs_draft: bool
    batched: bool
    slack: int                  # cache slots beyond prompt + new tokens (speculative nodes)
    options: dict               # every option's value, defaults filled in
    start: Callable | None      # start(models, draft, dtype, options): starts the method's other processes


def get(name: str, options: dict | None = None) -> Method:
    """A method with the given options applied (options other methods have are ignored)."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    options = options or {}
    known = {k for m in METHODS.values() for k in m.OPTIONS}
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"unknown method option(s) {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    module = METHODS[name]
    opts = {k: v for k, v in options.items() if k in module.OPTIONS and v is not None}
    for k, v in opts.items():
        if isinstance(module.OPTIONS[k], bool):
            if not isinstance(v, bool):
                raise ValueError(f"{name}: {k} must be true or false, got {v!r}")
        elif isinstance(module.OPTIONS[k], int) and (not isinstance(v, int) or v < 1):
            raise ValueError(f"{name}: {k} must be a positive integer, got {v!r}")
    return Method(name, functools.partial(module.decode, **opts), module.NEEDS_DRAFT,
                  getattr(module, "BATCHED", False), module.slack(**(module.OPTIONS | opts)), module.OPTIONS | opts,
                  getattr(module, "start", None))

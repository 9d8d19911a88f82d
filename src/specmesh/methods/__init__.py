"""Decoding methods. Each is a generator `decode(models, job)` that yields, per step,
the tokens newly committed for each of the job's rows (list of lists); the
generation driver stops it once every row is finished."""
from __future__ import annotations

from specmesh.methods import ar

METHODS = {"ar": ar.decode}
NEEDS_DRAFT: set[str] = set()


def get(name: str):
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; available: {', '.join(METHODS)}")
    return METHODS[name]

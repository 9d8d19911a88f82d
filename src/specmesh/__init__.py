"""specmesh: lossless speculative decoding for Llama-family models."""
import os
from pathlib import Path

# PyTorch's OpenMP threads (libgomp: read once, when torch loads) spin ~300,000 pauses (milliseconds) after each
# of its parallel ops. The kernels' loops run on threads of their own (csrc/pool.c), which those spinners would
# keep from the cores: a short spin, then sleep. Not where AMX does the products: there the loops run on OpenMP's
# team, which spins between them (docs/kernels.md).
if "amx_tile" not in (Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""):
    os.environ.setdefault("GOMP_SPINCOUNT", "1000")

__all__ = ["LLM", "SamplingParams", "Stats", "Output", "Sample"]
__version__ = "0.1.0"

# imported on first use, so that `import specmesh` (the CLI's parser, `specmesh --help`) does not load torch
_EXPORTS = {"LLM": "specmesh.llm", "SamplingParams": "specmesh.lossless.sampling", "Stats": "specmesh.engine.stats",
            "Output": "specmesh.engine.sequence", "Sample": "specmesh.engine.sequence"}


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'specmesh' has no attribute {name!r}")

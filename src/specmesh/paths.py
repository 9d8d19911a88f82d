"""Where specmesh keeps what it measures, builds and downloads for this machine (no torch: the CLI's fast
commands read it)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`--method auto`'s choices, the kernels, GGUF copies, tokenizers, llama.cpp's tools, downloaded model files:
    $SPECMESH_CACHE_DIR, else specmesh/ under $XDG_CACHE_HOME or ~/.cache."""
    if os.environ.get("SPECMESH_CACHE_DIR"):
        return Path(os.environ["SPECMESH_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specmesh"

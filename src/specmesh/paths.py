"""Where specmesh keeps what it measures, builds and downloads for this machine (no torch: the CLI's fast
commands read it)."""
from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`--method auto`'s choices, the kernels, GGUF copies, tokenizers, llama.cpp's tools, downloaded model files:
    $SPECMESH_CACHE_DIR, else specmesh/ under $XDG_CACHE_HOME or ~/.cache."""
    from specmesh.settings import settings
    if (chosen := settings().cache_dir) is not None:
        return chosen
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specmesh"


def write_whole(file: Path, data: bytes) -> None:
    """`data` written to a temporary name, then renamed: a reader never sees half of it; nothing where the cache
    is read-only (made again next time)."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        part = file.with_suffix(f".{os.getpid()}.part")
        part.write_bytes(data)
        part.replace(file)
    except OSError:
        pass

"""Where specmesh keeps what it measures, builds and downloads for this machine (no torch: the CLI's fast
commands read it)."""
from __future__ import annotations

import json
import os
from pathlib import Path


def cache_dir() -> Path:
    """`--method auto`'s choices, the kernels, GGUF copies, tokenizers, llama.cpp's tools, downloaded model files:
    $SPECMESH_CACHE_DIR, else specmesh/ under $XDG_CACHE_HOME or ~/.cache."""
    from specmesh.settings import settings
    if (chosen := settings().cache_dir) is not None:
        return chosen
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specmesh"


def stamp(path: Path) -> str:
    """A checkpoint folder's (or file's) identity on this machine: its path, and each file's name, size and
    modification time (new weights make a new stamp)."""
    path = Path(path).resolve()
    files = sorted(path.iterdir()) if path.is_dir() else [path]
    return f"{path}:" + ",".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)


def cached_json(file: Path) -> dict:
    """A cache file's JSON object, or {} where it is missing, unreadable or not an object (made again)."""
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def cache_entry(file: Path, key: str, value, indent: int | None = None) -> None:
    """`value` under `key` in a cache file's JSON object, the file written whole (write_whole)."""
    write_whole(file, json.dumps(cached_json(file) | {key: value}, indent=indent).encode())


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

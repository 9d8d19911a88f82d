"""A GGUF file's header and tensors, read from a memory map with numpy alone (no torch: `specmesh models` counts a
file's parameters with it); model/gguf.py makes a specmesh checkpoint of them."""
from __future__ import annotations

import functools
import math
import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specmesh.paths import cache_dir, cache_entry, cached_json, stamp

MAGIC = b"GGUF"

# ggml's tensor types by id: (name, weights a block, bytes a block), as the gguf package's GGMLQuantizationType and
# GGML_QUANT_SIZES give them (tests/model/test_gguf.py holds this to them); any other type is looked up there. The
# table spares reading a file the package's import, a tenth of a second of every start.
TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20), 6: ("Q5_0", 32, 22),
         7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110),
         12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176), 14: ("Q6_K", 256, 210), 20: ("IQ4_NL", 32, 18),
         23: ("IQ4_XS", 256, 136), 30: ("BF16", 1, 2)}


def tensor_type(kind: int) -> tuple[str, int, int]:
    """(name, weights a block, bytes a block) of ggml's tensor type `kind`, or a GGUFError where it is unknown."""
    if kind in TYPES:
        return TYPES[kind]
    import gguf
    try:
        known = gguf.GGMLQuantizationType(kind)
        return (known.name, *gguf.GGML_QUANT_SIZES[known])
    except (ValueError, KeyError):
        raise GGUFError(f"unknown type {kind}") from None


class GGUFError(ValueError):
    """A file that is not a GGUF specmesh can load (the message names the file and the problem)."""


def is_gguf(path: str | Path) -> bool:
    path = Path(path)
    if path.suffix.lower() == ".gguf":
        return True
    if not path.is_file():
        return False
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


# GGUF's metadata value types: numpy dtypes of the scalars, 8 string, 9 array
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


class Strings(Sequence):
    """A header's array of n strings: their bytes, split and decoded on first use (reading a file's config needs
    none of its vocabulary; walking and decoding 100k tokens and merges was most of reading a header)."""

    def __init__(self, data: bytes, n: int, starts: list[int] | None = None):
        self.data, self.n, self.starts, self._list = data, n, starts, None   # string i: data[starts[i]:starts[i+1]-8]

    def __len__(self) -> int:
        return self.n

    def __eq__(self, other) -> bool:
        return list(self) == list(other) if isinstance(other, (list, Strings)) else NotImplemented

    def __getitem__(self, i):
        if self._list is None:
            data, at = self.data, self.starts or walk(self.data, 0, self.n)
            self._list = [data[at[j]:at[j + 1] - 8].decode("utf-8", "replace") for j in range(self.n)]
        return self._list[i]


def walk(raw: bytes, pos: int, n: int) -> list[int]:
    """Where each of n length-prefixed strings from `pos` starts (its u64 length before it), then the end + 8."""
    starts, length = [], struct.Struct("<Q").unpack_from
    for _ in range(n):
        if pos + 8 > len(raw) or pos + 8 + (k := length(raw, pos)[0]) > len(raw):
            raise ValueError(f"the file ends at byte {len(raw)}, inside its header")
        starts.append(pos + 8)
        pos += 8 + k
    return starts + [pos + 8]


HEADERS = "headers.json"    # in cache_dir(): a file's stamp -> where each of its header's string arrays ends


@dataclass
class Tensor:
    name: str
    shape: tuple[int, ...]                    # numpy order: rows first
    kind: int                                 # a GGMLQuantizationType value
    data: np.ndarray                          # uint8 [rows, bytes per row], a view of the file


class GGUFFile:
    """A GGUF file's metadata (`fields`) and tensors, parsed from a memory map. gguf.GGUFReader makes a numpy
    view per array element (4 s for SmolLM2's 49k tokens and merges); this reads them in a fraction of that."""

    def __init__(self, path: Path, stamp: str = ""):
        self.data, self.pos = np.memmap(path, mode="r"), len(MAGIC)
        with open(path, "rb") as f:
            self.raw = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)     # the header, read by struct
        if (version := self.read("<I")) not in (2, 3):
            raise GGUFError(f"GGUF version {version} is not one this reader knows (2, 3)")
        known = self.array_ends(stamp)
        self.ends = dict(known)
        n_tensors, n_fields = self.read("<Q"), self.read("<Q")
        self.fields = {}
        for _ in range(n_fields):
            key = self.string()
            self.fields[key] = self.value(self.read("<I"))
        infos = [(self.string(), [self.read("<Q") for _ in range(self.read("<I"))], self.read("<I"),
                  self.read("<Q")) for _ in range(n_tensors)]
        align = self.fields.get("general.alignment", 32)
        start = -(-self.pos // align) * align
        self.tensors = [self.tensor(name, dims, kind, start + offset) for name, dims, kind, offset in infos]
        self.raw.close()
        if stamp and self.ends != known:
            self.save_array_ends(stamp)

    @staticmethod
    def array_ends(stamp: str) -> dict[int, int]:
        """The cached ends of this file's string arrays, by their start (none for a file not seen before)."""
        try:
            return {int(k): v for k, v in cached_json(cache_dir() / HEADERS).get(stamp, {}).items()}
        except (ValueError, AttributeError):
            return {}

    def save_array_ends(self, stamp: str) -> None:
        cache_entry(cache_dir() / HEADERS, stamp, self.ends)

    def read(self, dtype: str, count: int | None = None):
        size = struct.calcsize(dtype) * (count or 1)
        if self.pos + size > len(self.raw):
            raise ValueError(f"the file ends at byte {len(self.raw)}, inside its header")
        at, self.pos = self.pos, self.pos + size
        if count is not None:
            return np.frombuffer(self.raw, dtype, count, at)
        return struct.unpack_from(dtype, self.raw, at)[0]

    def string(self) -> str:
        n = self.read("<Q")
        if self.pos + n > len(self.raw):
            raise ValueError(f"the file ends at byte {len(self.raw)}, inside its header")
        self.pos += n
        return self.raw[self.pos - n:self.pos].decode("utf-8", "replace")

    def strings(self, n: int) -> Strings:
        """An array of n strings (a vocabulary's tokens and merges, the header's longest part), decoded when read;
        its end found by walking its lengths once per file (then cached)."""
        base, starts = self.pos, None
        if base not in self.ends:
            starts = walk(self.raw, base, n)
            self.ends[base] = starts[-1] - 8
        self.pos = self.ends[base]
        if self.pos > len(self.raw):
            raise ValueError(f"the file ends at byte {len(self.raw)}, inside its header")
        return Strings(self.raw[base:self.pos], n, starts and [s - base for s in starts])

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind == ARRAY:
            item, n = self.read("<I"), self.read("<Q")
            if item in SCALARS:
                return self.read(SCALARS[item], n).tolist() if n else []
            if item == STRING:
                return self.strings(n)
            return [self.value(item) for _ in range(n)]
        if kind not in SCALARS:
            raise ValueError(f"unknown metadata type {kind} at byte {self.pos}")
        return self.read(SCALARS[kind])

    def tensor(self, name: str, dims: list[int], kind: int, offset: int) -> Tensor:
        try:
            _, block, size = tensor_type(kind)
        except GGUFError:
            raise GGUFError(f"tensor {name} has unknown type {kind}") from None
        rows, row = int(np.prod(dims[1:])), dims[0]
        nbytes = rows * row // block * size
        if offset + nbytes > len(self.data):
            raise ValueError(f"tensor {name} needs bytes up to {offset + nbytes}, the file ends at {len(self.data)}")
        return Tensor(name, (*reversed(dims[1:]), row), kind, self.data[offset:offset + nbytes].reshape(rows, -1))


@functools.lru_cache(maxsize=4)
def _open(path: Path, stamp: str) -> GGUFFile:
    return GGUFFile(path, stamp)


def open_gguf(path: str | Path) -> GGUFFile:
    """The parsed file (cached: the tokenizer and the weights read it once)."""
    path = Path(path)
    if not path.is_file():
        raise GGUFError(f"GGUF file not found: {path}")
    with open(path, "rb") as f:
        head = f.read(4)
    if head != MAGIC:
        raise GGUFError(f"{path} is not a GGUF file (it starts with {head!r}, not {MAGIC!r})")
    try:
        return _open(path.resolve(), stamp(path))
    except GGUFError as e:
        raise GGUFError(f"{path}: {e}") from None
    except Exception as e:
        raise GGUFError(f"{path}: truncated or corrupt GGUF ({e})") from None


def parameter_count(path: str | Path) -> int:
    """Parameters of a GGUF file or a safetensors folder, from their headers (tied weights counted once)."""
    path = Path(path)
    if is_gguf(path):
        return sum(math.prod(t.shape) for t in open_gguf(path).tensors)
    import json
    from safetensors import safe_open
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() \
        else ["model.safetensors"]
    total = 0
    for name in files:
        with safe_open(path / name, "np") as f:
            for key in f.keys():
                total += math.prod(f.get_slice(key).get_shape())
    return total

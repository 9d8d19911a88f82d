"""Weights on 2 MiB pages: a model's tensors moved into one anonymous mapping that Linux backs with huge pages
(transparent huge pages in `madvise` mode or `always`).

A forward streams every weight once. On 4 KiB pages the embedded target's 55 MB span 13,000 pages, far more than
the TLB holds, so every forward walks the page tables again (in a virtual machine, guest and host tables both);
on 2 MiB pages they are 28, and the walks go (the measured gain: docs/kernels.md). Where
the system gives no huge pages (THP `never`, not Linux) nothing moves. KV caches stay on 4 KiB pages: the server's
is sized for full contexts and costs memory only where requests write (model/cache.py), and on huge pages a
request's first token would fill 2 MiB of every layer's every head.
"""
from __future__ import annotations

import functools
import json
import mmap
import weakref
from pathlib import Path
from typing import Callable

import torch
from torch import nn

ALIGN = 64                  # each tensor starts on a cache line, as PyTorch's allocator places them
LIVE: dict[int, tuple[int, int]] = {}       # the huge mappings alive: id -> [first byte's address, end)


@functools.cache
def huge_pages() -> bool:
    """Whether this system gives a mapping advised so huge pages (Linux's THP `always` or `madvise`)."""
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    return hasattr(mmap, "MADV_HUGEPAGE") and hasattr(mmap, "MAP_ANONYMOUS") and thp.exists() \
        and "[never]" not in thp.read_text()


def on_huge_pages(model: nn.Module) -> int:
    """Move the CPU tensors of `model` (parameters, buffers, and the packed weights kernels keep as plain attributes)
    into one mapping advised for huge pages, in place; tensors that were one stay one. Returns the bytes moved.
    Call it before anything keeps the tensors' addresses (model.c_forward's CBlock, CForward)."""
    if not huge_pages():
        return 0
    places = [(m, name, _key(t), t) for m in model.modules() for name, t in _tensors(m)   # keyed before any move
              if t.device.type == "cpu" and t.layout == torch.strided and t.numel() and t.is_contiguous()]
    streamed = {k for m, _, k, _ in places if not isinstance(m, nn.Embedding)}
    places = [p for p in places if p[2] in streamed      # a lookup table reads a few rows: unless a head reads it all
              and not placed(p[3])]                      # read onto huge pages already (load)
    unique = {k: t for _, _, k, t in places}
    if not unique:
        return 0
    sizes = {k: aligned(t.nbytes) for k, t in unique.items()}
    users: dict[tuple, list] = {}
    for m, name, k, _ in places:
        users.setdefault(k, []).append((m, name))
    del places
    raw, at = huge_zeros(sum(sizes.values())), 0
    for k in list(unique):          # each tensor let go as it moves: a load's peak is the model and one tensor more
        t = unique.pop(k)
        moved = raw[at:at + t.nbytes].view(t.dtype).view(t.shape).copy_(t)
        del t
        for m, name in users[k]:
            _put(m, name, moved)
        at += sizes[k]
    return at


def aligned(nbytes: int) -> int:
    """`nbytes` rounded up to a whole number of cache lines (ALIGN)."""
    return -(-nbytes // ALIGN) * ALIGN


def huge_zeros(nbytes: int) -> torch.Tensor:
    """uint8 [nbytes] of zeros in a private anonymous mapping advised for huge pages (a shared one gets none); the
    tensor holds the mapping. Only where huge_pages()."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    buf.madvise(mmap.MADV_HUGEPAGE)          # before the first write: pages fault in as huge ones
    raw = torch.frombuffer(buf, dtype=torch.uint8)
    LIVE[id(buf)] = (raw.data_ptr(), raw.data_ptr() + nbytes)
    weakref.finalize(buf, LIVE.pop, id(buf), None)        # unmapped when its last tensor goes
    return raw


def arena(nbytes: int) -> torch.Tensor:
    """uint8 [nbytes] for weights written once where they stay: huge_zeros where the system gives huge pages (then
    on_huge_pages leaves them where they are), else plain memory."""
    return huge_zeros(max(nbytes, ALIGN)) if huge_pages() else torch.empty(nbytes, dtype=torch.uint8)


def placed(t: torch.Tensor) -> bool:
    """Whether `t` lies in a huge mapping made here."""
    return any(start <= t.data_ptr() < end for start, end in LIVE.values())


DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
          "BOOL": torch.bool}


def load(file: str | Path, huge: bool = True, read: Callable[[int], object] | None = None) -> dict[str, torch.Tensor]:
    """A safetensors file's tensors, read from the file, not mapped (safetensors' load_file gives views of the
    file's one mapping: a view kept keeps it whole). `huge`, where the system gives huge pages: into one mapping
    advised for them, each on a cache line (on_huge_pages leaves them there); else each into memory of its own, so
    that each goes alone once copied or replaced. `read(n)` is told the bytes read, the whole file's in all (a
    bar's update). Its layout (safetensors' format): a u64 header length, the JSON header (name -> dtype, shape,
    data_offsets), the data."""
    file = Path(file)
    huge = huge and huge_pages()
    with open(file, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        if n > file.stat().st_size:
            raise ValueError(f"{file} is not a safetensors file")
        header = json.loads(f.read(n))
        header.pop("__metadata__", None)
        read = read or (lambda nbytes: None)
        read(8 + n)
        spans = {k: v["data_offsets"] for k, v in header.items()}
        raw, at, out = huge_zeros(max(sum(aligned(e - b) for b, e in spans.values()), ALIGN)) if huge else None, 0, {}
        for k, (b, e) in spans.items():
            dest = raw[at:at + e - b] if huge else torch.empty(e - b, dtype=torch.uint8)
            f.seek(8 + n + b)
            if f.readinto(dest.numpy()) != e - b:
                raise ValueError(f"{file}: {k} ends past the file")
            out[k] = dest.view(DTYPES[header[k]["dtype"]]).view(header[k]["shape"])
            at += aligned(e - b)
            read(e - b)
    return out


def _key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.dtype, tuple(t.shape)


def _tensors(m: nn.Module):
    yield from ((n, t) for n, t in m._parameters.items() if t is not None)
    yield from ((n, t) for n, t in m._buffers.items() if t is not None)
    yield from ((n, t) for n, t in vars(m).items() if isinstance(t, torch.Tensor) and not isinstance(t, nn.Parameter))


def _put(m: nn.Module, name: str, t: torch.Tensor) -> None:
    if name in m._parameters:
        m._parameters[name].data = t
    elif name in m._buffers:
        m._buffers[name] = t
    else:
        setattr(m, name, t)

"""A GGUF file's Q8_0 / Q4_0 / Q4_1 matrices in kernels.Q8Linear's layout, cached per file.

Repacking a file's blocks for Q8Linear's products (reading its blocks, dequantizing them, joining fused
projections, kernels.q8_pack) was most of such a file's load. The packed weights are a function of the file's
bytes and of the layout alone, so the first load writes them to cache_dir()/packed/ under the file's identity
(its path, size and modification time) and the kernels' version; later loads read them back and build the
linears from them, reading from the file only what stays in PyTorch (the embedding, norms, biases, a head
without blocks): the same tensors, bit for bit.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import nn

from specmesh.kernels.build import kernel_version
from specmesh.kernels.linears import Q8Linear
from specmesh.model import pages
from specmesh.paths import cache_dir


def cache_file(identity: str, part: str = "") -> Path:
    """Where the packed matrices (part "") or the other weights (part "state") of the file of this identity
    (paths.stamp) live."""
    key = hashlib.sha256(f"{identity}|{kernel_version()}".encode()).hexdigest()[:20]
    return cache_dir() / "packed" / f"{key}{'.' + part if part else ''}.safetensors"


def read(identity: str) -> dict[str, tuple[torch.Tensor, torch.Tensor, int]] | None:
    """Module name -> (packed weight, scale words, Q8Linear kind) as `write` stored them, or None (not cached, or
    a damaged file: made again)."""
    file = cache_file(identity)
    if not file.is_file():
        return None
    try:
        tensors = pages.load(file)          # read onto huge pages at once
    except (SafetensorError, OSError, ValueError, KeyError):
        return None
    names = [n.removesuffix(".weight") for n in tensors if n.endswith(".weight")]
    return {n: (tensors[f"{n}.weight"], tensors[f"{n}.scale"], int(tensors[f"{n}.kind"])) for n in names}


def write(identity: str, model: nn.Module) -> None:
    """Store every Q8Linear of a loaded model (its tensors copied out of the model's shared huge-page mapping); a
    read-only cache is left alone (the next load repacks again)."""
    tensors = {}
    for name, m in model.named_modules():
        if isinstance(m, Q8Linear):
            name = name.replace(".block.", ".")         # c_forward.CBlock holds the Block it runs
            tensors |= {f"{name}.weight": m.weight.clone(), f"{name}.scale": m.scale.clone(),
                        f"{name}.kind": torch.tensor(m.KIND)}
    save(tensors, cache_file(identity))


def read_state(identity: str) -> dict[str, torch.Tensor] | None:
    """The weights beside the packed matrices (embedding, norms, biases: by our names, in bf16) as write_state
    stored them, or None."""
    try:
        return load_file(cache_file(identity, "state"))
    except (SafetensorError, OSError):
        return None


def write_state(identity: str, state: dict[str, torch.Tensor]) -> None:
    """Store them in bf16 (the model rounds them to bf16: the same values), so a later load neither reads nor
    dequantizes them from the file again."""
    save({k: v.to(torch.bfloat16).contiguous() for k, v in state.items()}, cache_file(identity, "state"))


def save(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """Written whole under a temporary name, then renamed; a read-only cache is left alone."""
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        part = file.with_suffix(f".{os.getpid()}.part")
        save_file(tensors, part)
        part.replace(file)
    except OSError:
        pass


def linear(in_features: int, out_features: int, packed: tuple[torch.Tensor, torch.Tensor, int],
           bias: torch.Tensor | None, kernel) -> Q8Linear:
    """A Q8Linear from its cached tensors, as Q8Linear(BF16Linear) would have built it (the bias in bf16 and float32)."""
    weight, scale, kind = packed
    m = Q8Linear.__new__(Q8Linear)
    nn.Module.__init__(m)
    m.in_features, m.out_features, m.kernel = in_features, out_features, kernel
    m.bias = None if bias is None else bias.to(torch.bfloat16)
    m.bias32 = None if m.bias is None else m.bias.float()
    m.KIND = kind
    m.product = getattr(kernel, next(p for k, p in Q8Linear.KINDS.values() if k == kind))
    m.weight, m.scale = weight, scale
    return m

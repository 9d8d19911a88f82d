"""What a Transformer's forward is given beside its tokens and cache (`Batch`), and what runs it beside its
PyTorch modules (`Execution`: the kernels' one-call forward, a tensor-parallel group). Other packages change how a
model runs only by handing it an Execution (`Transformer.run_on`); nothing else sets attributes on it.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from specmesh.model.cache import KVCache


@dataclass(frozen=True)
class Batch:
    """One forward's metadata (as nano-vllm's context or vLLM's attention metadata). The defaults: every layer,
    a chain continuing the cache's held speculative slots, logits at every position."""
    depths: torch.Tensor | None = None      # [T] or [B,T]: each new token's depth below the committed prefix
                                            # (its position = committed length + depth)
    tree_mask: torch.Tensor | None = None   # [T, S+T] or [B,T,S+T]: the speculative slots (S held + T new) each
                                            # new token sees
    layers: range | None = None             # the layers run (default all): tokens in at layer 0, logits out at
                                            # the last, hidden states [B,T,D] in and out elsewhere
    last_only: bool | int = False           # logits at the last position only ([B,1,V]); n: at the last n
    head: torch.Tensor | None = None        # token ids [K]: logits [B,T,K] of those only, from the head's rows
                                            # (distilling a draft whose head will be restricted to them)
    groups: list[range] | None = None       # consecutive ranges covering `layers`, each run layer-parallel
                                            # (EasySpec's fuzzy drafting); a one-layer group is the exact layer
    lens: list[int] | None = None           # [B] real tokens of each row, the rest pads: the kernels' forward
                                            # skips the pads' products (their outputs are then zeros)

    def span(self, num_layers: int) -> range:
        """The layers run: `layers`, else all `num_layers`."""
        return self.layers or range(num_layers)


WHOLE = Batch()


class FastForward:
    """A whole forward in one call beside the model's PyTorch path: called as forward is, it returns the
    result, or None where it does not apply (then the PyTorch path runs)."""
    long = False                # it runs forwards of many rows (prefills) as well, in C
    c_attention = False         # its attention runs row by row in C (a token's result as in a one-row forward)
    tile_attention = False      # its prefills attend on the tile unit (AMX)

    def __call__(self, x: torch.Tensor, cache: KVCache | None, batch: Batch) -> torch.Tensor | None:
        raise NotImplementedError


class Split(Protocol):
    """Rank 0 of a model split over processes (runtime/tensor_parallel.Leader): every cache it makes is
    mirrored on the other ranks."""
    name: str

    def cache(self, batch: int, max_len: int, layers: range | None = None) -> KVCache: ...


@dataclass(frozen=True)
class Execution:
    """What runs a Transformer's forward beside its PyTorch modules; the default: nothing (PyTorch alone)."""
    fast: FastForward | None = None         # the kernels' one-call forward (model/c_forward.py) or a split's
    kv_dtype: torch.dtype | None = None     # the KV cache's dtype, where the kernels chose one
    layer_parallel: Callable | None = None  # a layer-parallel group's forward (default model.layer_parallel; a
                                            # draft spread over ranks: tensor_parallel.Group's)
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None   # a shard's block outputs summed over
                                            # the ranks, in PyTorch (default: as they are, one process)
    c_reduce: int | None = None             # the same for the C blocks: a C callback's address
    split: Split | None = None              # rank 0 of a tensor-parallel model (makes its caches)

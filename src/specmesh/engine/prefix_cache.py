"""Prefix caching: the keys and values of prompts served before, kept in blocks of BLOCK tokens,
so that a request whose prompt begins with a cached prefix reads it instead of computing it
(vLLM's automatic prefix caching, simplified): block i of a prompt is found by a digest of
tokens [0, BLOCK (i + 1)) (a chain: each block's digest covers its predecessor's), and a full
pool evicts the least recently used block.

Exact, not approximate. A block is reused only where computing it again would give the same
bits: where a prefill runs in the C kernels (c_forward.CForward: on the tile unit with AMX, a bf16 cache
and head dim 64; or, without AMX, with a decoding step's attention (AVX2's or AVX-512's) beside products
that run prefills) it computes every row alone (products row by row; each query's attention over the keys
it sees, in a fixed order from key 0), so the keys, values and logits of tokens P.. computed after P cached
ones equal those of one prefill of the whole prompt, provided the rest takes that same path: at least MIN_REST tokens.
Elsewhere (PyTorch's products and attention round a row by how many rows share them) the cache
stays off.

The pool is allocated and zeroed when the server starts: resident memory does not grow as it fills.
"""
from __future__ import annotations

import collections
import hashlib

import numpy as np
import torch

from specmesh.model.cache import KVCache
from specmesh.model.model import PREFILL_TOKENS

BLOCK = 16                          # tokens per block
MIN_REST = PREFILL_TOKENS + 1       # a prompt's uncached rest attends as its whole prefill does (tiles: > 64)


def unsupported(model) -> str | None:
    """Why cached prefixes would not be bit-exact for this model here; None where they are."""
    if model.tp is not None:
        return "the target is split over processes (--tp): each keeps its own part of the keys and values"
    forward = model.fast_forward
    if forward is None or not (forward.tile_attention or forward.long and forward.c_attention):
        return ("cached prefixes are bit-exact only where prefills run row by row in the C kernels (AMX tiles, or "
                "the C attention with products that run prefills: bf16 or --quant on x86), which this run lacks")
    return None


class PrefixCache:
    def __init__(self, model, budget_mb: float):
        cfg = model.config
        dtype = model.cache_dtype
        shape = (cfg.num_layers, cfg.num_kv_heads, BLOCK, cfg.head_dim)       # one block, keys or values
        blocks = int(budget_mb * 2**20 // (2 * np.prod(shape) * dtype.itemsize))
        if blocks < 1:
            raise ValueError(f"a prefix cache of {budget_mb} MB holds no block of {BLOCK} tokens")
        L, Hkv, _, hd = shape
        self.k = torch.zeros(L, blocks, Hkv, BLOCK, hd, dtype=dtype, device=model.device)
        self.v = torch.zeros_like(self.k)
        self.table: collections.OrderedDict[bytes, int] = collections.OrderedDict()   # digest -> block, LRU first
        self.free = list(range(blocks))

    @property
    def blocks(self) -> int:
        return self.k.shape[1]

    def load(self, prompt: list[int], cache: KVCache, row: int) -> int:
        """Put the longest cached prefix of `prompt` that leaves at least MIN_REST tokens to compute into
        `row` (empty) as committed tokens; returns its length (0 on a miss)."""
        ids = []
        for digest in digests(prompt, max(0, len(prompt) - MIN_REST) // BLOCK):
            block = self.table.get(digest)
            if block is None:
                break
            self.table.move_to_end(digest)
            ids.append(block)
        if not ids:
            return 0
        index = torch.tensor(ids, device=self.k.device)
        layers = range(self.k.shape[0])
        # per layer: blocks [n, Hkv, BLOCK, hd] -> the row's [Hkv, n * BLOCK, hd]
        cache.fill(row, [self.k[l, index].transpose(0, 1).flatten(1, 2) for l in layers],
                   [self.v[l, index].transpose(0, 1).flatten(1, 2) for l in layers])
        return len(ids) * BLOCK

    def store(self, prompt: list[int], cache: KVCache, row: int) -> None:
        """Keep the full blocks of `prompt`, whose keys and values `row` holds."""
        n = min(len(prompt) // BLOCK, self.blocks)          # more than the pool holds would evict itself
        new = []
        for i, digest in enumerate(digests(prompt, n)):
            if digest in self.table:
                self.table.move_to_end(digest)
            else:
                block = self._take()
                self.table[digest] = block
                new.append((i, block))
        if not new:
            return
        src = torch.tensor([i for i, _ in new], device=self.k.device)
        dst = torch.tensor([b for _, b in new], device=self.k.device)
        for l, (kc, vc) in enumerate(zip(cache.k, cache.v)):
            for pool, c in ((self.k, kc), (self.v, vc)):
                blocks = c[row, :, :n * BLOCK].unflatten(1, (n, BLOCK)).transpose(0, 1)    # [n, Hkv, BLOCK, hd]
                pool[l, dst] = blocks[src]

    def _take(self) -> int:
        """A free block, or the least recently used one."""
        if self.free:
            return self.free.pop()
        _, block = self.table.popitem(last=False)
        return block


def digests(prompt: list[int], blocks: int) -> list[bytes]:
    """Digest of tokens [0, BLOCK (i + 1)) for each of the first `blocks` blocks."""
    tokens = np.asarray(prompt[:blocks * BLOCK], dtype=np.int64)
    out, digest = [], b""
    for i in range(blocks):
        digest = hashlib.blake2b(digest + tokens[i * BLOCK:(i + 1) * BLOCK].tobytes(), digest_size=16).digest()
        out.append(digest)
    return out

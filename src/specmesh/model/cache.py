"""Preallocated KV cache with a committed prefix and speculative slots.

Per row b the slots [0, L_b) hold committed tokens and [L_b, L_b + S_b) hold
speculative ones (tree nodes, draft tokens) not yet accepted. A forward writes its
T new tokens at [L_b + S_b, L_b + S_b + T) and they become speculative slots; each
attends to the committed prefix plus whichever speculative slots its tree mask
allows (its ancestors), at rotary position L_b + depth.

`commit(b, path, keep)` moves the slots `path` (indices into the speculative
region, root to leaf) to become committed positions L_b.., then keeps the slots
`keep` as the new speculative region; `prune` keeps without committing;
`rollback` truncates. Tree verification, PipeDec's past/predict cache, Self-Draft
branches and batched serving all use this one mechanism.

`view(start, stop)` is a cache over a contiguous range of rows that shares this one's
memory and counters: the server keeps its running requests in rows [0, B) and runs
each step on `view(0, B)`, and prefills a new request alone in its own row.

`stacked`: layer ranges whose caches are held as one tensor [B, g*Hkv, max_len, hd] (layer-major heads),
each layer's cache a view of its heads, so that a layer-parallel group (model.group_attention) writes and
attends over its g layers' entries in one go.
"""
from __future__ import annotations

import math
import mmap
from collections.abc import Sequence

import numpy as np
import torch


LAZY_BYTES = 16 << 20      # CPU caches from this size on are mapped lazily (zeros)


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str) -> torch.Tensor:
    """torch.zeros, but a large one on a CPU from an anonymous mapping whose pages the OS maps, zeroed, on first
    write: a server's cache sized for full contexts (5.4 GB for SmolLM2's 8192 tokens x 15 rows in float32)
    costs memory only where requests write, and allocating it writes nothing (torch.zeros wrote it all, 10 s
    on the first request). Page-aligned, so every kernel's loads are aligned as before. A small one (a
    request's own cache) stays torch.zeros: the heap hands back pages already mapped, where fresh ones
    fault on first write (the embedded pair's 378-token prefills took 10-20 ms longer)."""
    nbytes = math.prod(shape) * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < LAZY_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    pages = torch.frombuffer(mmap.mmap(-1, nbytes), dtype=torch.uint8)         # holds its mapping
    return pages.view(dtype).view(shape)


class ContextOverflowError(ValueError):
    pass


class KVCache:
    def __init__(self, num_layers: int, batch: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str, first_layer: int = 0,
                 stacked: Sequence[range] = ()):
        self.first_layer = first_layer
        self.stacks: dict[range, tuple[torch.Tensor, torch.Tensor]] = {}     # layers -> their k, v storage
        self.k: list[torch.Tensor] = []                                      # per layer [B, Hkv, max_len, hd]
        self.v: list[torch.Tensor] = []
        layers = range(first_layer, first_layer + num_layers)
        alone = [range(i, i + 1) for i in layers if not any(i in r for r in stacked)]
        for r in sorted([*stacked, *alone], key=lambda r: r.start):
            shape = (batch, len(r) * num_kv_heads, max_len, head_dim)
            self.stacks[r] = zeros(shape, dtype, device), zeros(shape, dtype, device)
            for j in range(len(r)):                      # layer r.start + j: heads [j*Hkv, (j+1)*Hkv)
                self.k.append(self.stacks[r][0][:, j * num_kv_heads:(j + 1) * num_kv_heads])
                self.v.append(self.stacks[r][1][:, j * num_kv_heads:(j + 1) * num_kv_heads])
        self.row0 = 0                                    # a view's first row in the cache it views
        self.max_len = max_len
        self.lengths = np.zeros(batch, dtype=np.int64)   # committed tokens per row
        self.spec = np.zeros(batch, dtype=np.int64)      # speculative slots per row
        self.starts: list[int] = []                      # each row's first slot of the current forward
        self.kv_len = 0                                  # keys the current forward attends over
        self.queries = np.zeros((batch, 0), dtype=np.int64)   # the current forward's query positions [B, T]
        self.views: dict[tuple[int, int], KVCache] = {}

    def view(self, start: int, stop: int) -> "KVCache":
        """Rows [start, stop) as a cache of their own, sharing memory and counters with this one (made once
        per range: a decoding step asks for the same few every time)."""
        if (start, stop) not in self.views:
            view = type(self).__new__(type(self))
            view.k, view.v = [k[start:stop] for k in self.k], [v[start:stop] for v in self.v]
            view.stacks = {r: (k[start:stop], v[start:stop]) for r, (k, v) in self.stacks.items()}
            view.first_layer, view.max_len, view.row0 = self.first_layer, self.max_len, self.row0 + start
            view.lengths, view.spec = self.lengths[start:stop], self.spec[start:stop]     # numpy views
            view.starts, view.kv_len, view.views = [], 0, {}
            self.views[start, stop] = view
        return self.views[start, stop]

    def move_row(self, src: int, dst: int) -> None:
        """Row src's tokens become row dst's (src keeps a stale copy)."""
        n = int(self.lengths[src] + self.spec[src])
        for kc, vc in zip(self.k, self.v):
            kc[dst, :, :n] = kc[src, :, :n]
            vc[dst, :, :n] = vc[src, :, :n]
        self.lengths[dst], self.spec[dst] = self.lengths[src], self.spec[src]

    @classmethod
    def for_model(cls, model, batch: int, max_len: int, layers: range | None = None,
                  groups: Sequence[range] = ()) -> "KVCache":
        """A cache for `model`'s `layers`; `groups` (layer-parallel groups) stacked where the model's PyTorch
        path runs them (the kernels' one-call forward reads every layer's cache at one row stride)."""
        if model.tp is not None:                      # rank 0 of a tensor-parallel target: every rank keeps one
            return model.tp.cache(batch, max_len, layers)
        cfg = model.config
        layers = layers or range(cfg.num_layers)
        stacked = [g for g in groups if len(g) > 1] if model.fast_forward is None else []
        return cls(len(layers), batch, max_len, cfg.num_kv_heads, cfg.head_dim,
                   model.cache_dtype, model.device, first_layer=layers.start, stacked=stacked)

    @property
    def batch(self) -> int:
        return len(self.lengths)

    @property
    def device(self) -> torch.device:
        return self.k[0].device

    # -- one forward: prepare -> write (per layer) -> advance -------------------------------
    def slots(self, T: int, depths: torch.Tensor | None = None) -> np.ndarray:
        """Claim the next T slots of every row for a forward: their rotary positions [B, T] (int64)."""
        starts = self.lengths + self.spec
        if int(starts.max()) + T > self.max_len:
            raise ContextOverflowError(
                f"sequence of {int(starts.max()) + T} tokens exceeds the cache/context length {self.max_len}")
        self.starts, self.kv_len = starts.tolist(), int(starts.max()) + T
        if depths is None:
            self.queries = starts[:, None] + np.arange(T)
        else:
            self.queries = self.lengths[:, None] + depths.cpu().numpy().reshape(-1, T)
        return self.queries

    def prepare(self, T: int, depths: torch.Tensor | None = None,
                tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Positions [B,T] and attention mask [B,1,T,K] (True = attend) for T new tokens; None when
        they see every key (one token after all that is held) or are causal among themselves (an
        empty cache)."""
        positions = torch.from_numpy(self.slots(T, depths)).to(self.device)
        if tree_mask is None and (T == 1 and len(set(self.starts)) == 1 and len(set(self.lengths.tolist())) == 1
                                  or max(self.starts) == 0):
            return positions, None       # one token after everything held, or a first prefill: no mask needed
        return positions, self.mask(T, tree_mask)

    def mask(self, T: int, tree_mask: torch.Tensor | None) -> torch.Tensor:
        """The attention mask [B,1,T,K] of a forward whose slots were just claimed (True = attend); made on the
        host (a tree mask is best passed there too) and copied to the cache's device once."""
        return torch.from_numpy(self.host_mask(T, tree_mask)).to(self.device)

    def host_mask(self, T: int, tree_mask: torch.Tensor | None) -> np.ndarray:
        """mask's, as a numpy array [B,1,T,K]."""
        tree = None if tree_mask is None else tree_mask.cpu().numpy()
        mask = np.zeros((self.batch, 1, T, self.kv_len), dtype=bool)
        for b, (L, s) in enumerate(zip(self.lengths.tolist(), self.spec.tolist())):
            mask[b, :, :, :L] = True
            if tree is None:            # chain continuing the held speculative slots
                mask[b, 0, :, L:L + s + T] = np.tri(T, s + T, s, dtype=bool)
            else:
                mask[b, 0, :, L:L + s + T] = tree if tree.ndim == 2 else tree[b]
        return mask

    def window_mask(self, mask: torch.Tensor | None, tree_mask: torch.Tensor | None, window: int
                    ) -> torch.Tensor | None:
        """A sliding layer's mask for the forward whose slots were just claimed: `mask` (prepare's, for the same
        tree_mask) less the keys `window` or more positions before their query's, [B,1,T,K]; `mask` itself where
        no query is that far past position 0. Key positions: committed slot j is position j; the speculative slots
        a token sees are its ancestors, one a depth in slot order, so the n-th of them is position L_b + n."""
        T = len(self.queries[0])
        if int(self.queries.max()) < window:
            return mask
        seen = self.host_mask(T, tree_mask)[:, 0]                                   # [B, T, K]
        slot = np.arange(self.kv_len)
        spec = slot[None, :] >= self.lengths[:, None]                               # [B, K]: speculative slots
        depth = np.cumsum(seen & spec[:, None], axis=-1) - 1                       # [B, T, K]
        keys = np.where(spec[:, None], self.lengths[:, None, None] + depth, slot)   # [B, T, K] key positions
        near = self.queries[:, :, None] - keys < window
        return torch.from_numpy((seen & near)[:, None]).to(self.device)

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v [B,Hkv,T,hd] at each row's write offset; return keys/values [B,Hkv,K,hd]."""
        return self._store(self.k[layer - self.first_layer], self.v[layer - self.first_layer], k, v)

    def write_group(self, layers: range, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store a group's k, v [B,g*Hkv,T,hd] (layer-major heads); return its keys/values [B,g*Hkv,K,hd]:
        in one go where the group is stacked, else layer by layer and joined."""
        if layers in self.stacks:
            return self._store(*self.stacks[layers], k, v)
        kv = [self.write(i, kj, vj) for i, kj, vj in zip(layers, k.chunk(len(layers), 1), v.chunk(len(layers), 1))]
        return torch.cat([kc for kc, _ in kv], 1), torch.cat([vc for _, vc in kv], 1)

    def _store(self, kc: torch.Tensor, vc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        T = k.shape[2]
        if len(set(self.starts)) == 1:
            s = self.starts[0]
            kc[:, :, s:s + T] = k
            vc[:, :, s:s + T] = v
        else:
            for b, s in enumerate(self.starts):
                kc[b, :, s:s + T] = k[b]
                vc[b, :, s:s + T] = v[b]
        return kc[:, :, :self.kv_len], vc[:, :, :self.kv_len]

    def written(self, layer: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values the current forward wrote for `layer`: [B,Hkv,T,hd] each."""
        kc, vc = self.k[layer - self.first_layer], self.v[layer - self.first_layer]
        if len(set(self.starts)) == 1:
            s = self.starts[0]
            return kc[:, :, s:s + T], vc[:, :, s:s + T]
        return (torch.stack([kc[b, :, s:s + T] for b, s in enumerate(self.starts)]),
                torch.stack([vc[b, :, s:s + T] for b, s in enumerate(self.starts)]))

    def advance(self, T: int) -> None:
        """The T tokens just written become speculative slots."""
        self.spec += T

    # -- after verification ------------------------------------------------------------------
    def commit(self, row: int, path: Sequence[int], keep: Sequence[int] = ()) -> None:
        """Speculative slots `path` become committed (in order); `keep` stays speculative."""
        order = list(path) + list(keep)
        if any(not 0 <= i < self.spec[row] for i in order):
            raise IndexError(f"slot index out of range: row {row} holds {self.spec[row]} speculative slots")
        L = int(self.lengths[row])
        if order != list(range(len(order))):
            src = torch.tensor(order, device=self.device) + L
            for kc, vc in zip(self.k, self.v):
                kc[row, :, L:L + len(order)] = kc[row].index_select(1, src)
                vc[row, :, L:L + len(order)] = vc[row].index_select(1, src)
        self.lengths[row] = L + len(path)
        self.spec[row] = len(keep)

    def commit_all(self, row: int | None = None) -> None:
        """Every speculative slot becomes committed, in slot order (plain decoding)."""
        rows = slice(None) if row is None else row
        self.lengths[rows] += self.spec[rows]
        self.spec[rows] = 0

    def prune(self, row: int, keep: Sequence[int]) -> None:
        self.commit(row, [], keep)

    def prefix(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """A copy of the committed prefix (all rows equally long): per-layer k, v [B,Hkv,L,hd]."""
        L = int(self.lengths[0])
        return [k[:, :, :L].clone() for k in self.k], [v[:, :, :L].clone() for v in self.v]

    def fill_prefix(self, row: int, kv: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        """Row's committed tokens become those of a one-row cache's `prefix()` copy."""
        self.fill(row, [k[0] for k in kv[0]], [v[0] for v in kv[1]])

    def load_prefix(self, kv: tuple[list[torch.Tensor], list[torch.Tensor]]) -> None:
        """Make a `prefix()` copy the committed tokens of every row."""
        L = kv[0][0].shape[2]
        for dst, src in zip(self.k + self.v, kv[0] + kv[1]):
            dst[:, :, :L] = src
        self.lengths[:] = L
        self.spec[:] = 0

    def fill(self, row: int, k: list[torch.Tensor], v: list[torch.Tensor]) -> None:
        """Row's committed tokens become these keys and values (per layer [Hkv, P, hd]); none speculative."""
        P = k[0].shape[1]
        for dst, src in zip(self.k + self.v, k + v):
            dst[row, :, :P] = src
        self.lengths[row], self.spec[row] = P, 0

    def rollback(self, row: int, length: int) -> None:
        """Truncate row to `length` committed tokens and drop its speculative slots."""
        if not 0 <= length <= self.lengths[row] + self.spec[row]:
            raise IndexError(f"cannot roll back row {row} to {length}")
        self.lengths[row] = length
        self.spec[row] = 0

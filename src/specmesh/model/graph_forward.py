"""model.fast_forward for a model on CUDA (docs/gpu.md): a forward with a cache of up to MAX_TOKENS new tokens a row
(decoding's and verification's widths) replays a CUDA graph captured once for its shape, so that a step costs GPU
time rather than the host's kernel launches.

A graph is captured once per (rows, new tokens, cache) over static buffers: the token ids, their positions (the
rotary angles are computed inside), the slots they are written to and an attention mask over the cache's whole
length (True = attend), so that nothing in it depends on how many keys a forward sees. Before each replay the host
claims the slots as the model's own path does (KVCache.slots, host_mask) and copies the inputs in; after it the slots
become speculative (KVCache.advance), as there. `capture=False` runs the same static forward eagerly: the CPU's
check of it (tests/model/test_graph_forward.py), and what CUDA runs while a shape is warmed up before capture.
Sliding layers (Gemma 3) get a second mask, the host's window mask (KVCache.window_mask) over the whole length, and
their own rotary. Forwards it does not take (a prefill, layer ranges, groups, a restricted head) return None: the
model's own path.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specmesh.model.execution import Batch, FastForward

MAX_TOKENS = 64                 # new tokens a row up to which forwards replay graphs; longer ones (prefills) do not
MAX_SHAPES = 64                 # shapes kept (each a graph and its memory): the one first captured goes beyond


@dataclass
class Static:
    """One shape's buffers: the inputs copied in before a replay, the logits read out after it."""
    ids: torch.Tensor           # [B, T] int64
    positions: torch.Tensor     # [B, T] int64: rotary positions
    rows: torch.Tensor          # [B, T] int64: each token's cache row (0 .. B - 1)
    slots: torch.Tensor         # [B, T] int64: the cache slot each token's keys and values go to
    mask: torch.Tensor          # [B, 1, T, max_len] bool: the keys each token sees
    local: torch.Tensor         # [B, 1, T, max_len] bool: those a sliding layer's token sees (a model with them)
    logits: torch.Tensor | None = None
    graph: object = None        # torch.cuda.CUDAGraph once captured


class Writes:
    """The cache as the layers see it in a static forward: `write` puts k, v [B, Hkv, T, hd] at the static slots
    and returns the whole cache [B, Hkv, max_len, hd] (the mask hides what a token may not see)."""

    def __init__(self, cache, s: Static):
        self.cache, self.s = cache, s

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        kc, vc = self.cache.k[layer - self.cache.first_layer], self.cache.v[layer - self.cache.first_layer]
        kc.transpose(1, 2)[self.s.rows, self.s.slots] = k.transpose(1, 2).to(kc.dtype)
        vc.transpose(1, 2)[self.s.rows, self.s.slots] = v.transpose(1, 2).to(vc.dtype)
        return kc, vc


class GraphForward(FastForward):
    """The model's forwards of up to MAX_TOKENS new tokens a row as graphs (capture) or as the same static forward
    run eagerly (not capture); the others None."""

    def __init__(self, model, capture: bool = True):
        self.model, self.capture = model, capture
        self.shapes: dict[tuple, Static] = {}

    def __call__(self, x: torch.Tensor, cache, batch: Batch) -> torch.Tensor | None:
        cfg = self.model.config
        if (cache is None or x.dim() != 2 or x.shape[1] > MAX_TOKENS or batch.layers is not None or batch.groups
                or batch.head is not None or batch.lens):
            return None
        B, T = x.shape
        positions = torch.from_numpy(cache.slots(T, batch.depths))        # [B, T]: the slots claimed
        seen = torch.from_numpy(cache.host_mask(T, batch.tree_mask))      # [B, 1, T, kv_len], made once on the host
        s = self._static(cache, B, T)
        s.ids.copy_(x)
        s.positions.copy_(positions)
        s.slots.copy_(torch.as_tensor(cache.starts)[:, None] + torch.arange(T))
        self._fill(s.mask, seen)
        if cfg.has_sliding:
            self._fill(s.local, cache.window_mask(seen, batch.tree_mask, cfg.sliding_window))
        self._run(s, cache)
        cache.advance(T)
        logits = s.logits
        if batch.last_only:
            logits = logits[:, -int(batch.last_only):]
        return logits.clone()

    def _static(self, cache, B: int, T: int) -> Static:
        key = (B, T, cache.k[0].data_ptr(), cache.max_len)
        if key not in self.shapes:
            if len(self.shapes) >= MAX_SHAPES:
                self.shapes.pop(next(iter(self.shapes)))
            device = cache.k[0].device
            zeros = lambda: torch.zeros(B, T, dtype=torch.int64, device=device)                  # noqa: E731
            masks = lambda: torch.zeros(B, 1, T, cache.max_len, dtype=torch.bool, device=device)  # noqa: E731
            self.shapes[key] = Static(zeros(), zeros(), torch.arange(B, device=device)[:, None].expand(B, T).clone(),
                                      zeros(), masks(), masks())
        return self.shapes[key]

    @staticmethod
    def _fill(whole: torch.Tensor, mask: torch.Tensor) -> None:
        """A static mask [B,1,T,max_len] from a forward's [B,1,T,kv_len]: the keys past kv_len hidden."""
        whole.zero_()
        whole[..., :mask.shape[-1]].copy_(mask)

    def _forward(self, s: Static, cache) -> torch.Tensor:
        """The static forward: embedding, the layers over the whole cache, norm and head -> logits [B,T,V]."""
        model, cfg = self.model, self.model.config
        h = model.embedding(s.ids)
        inputs = {False: (*model.rotary(s.positions, h.dtype), s.mask)}
        if cfg.has_sliding:
            inputs[True] = (*model.rotary(s.positions, h.dtype, local=True), s.local)
        writes = Writes(cache, s)
        for i, layer in enumerate(model.layers):
            cos, sin, mask = inputs[cfg.sliding(i)]
            h = layer(h, cos, sin, writes, mask)
        return model.logits(h)

    def _run(self, s: Static, cache) -> None:
        if not self.capture:
            s.logits = self._forward(s, cache)
            return
        if s.graph is None:
            self._capture(s, cache)
        s.graph.replay()

    def _capture(self, s: Static, cache) -> None:
        """Warm the shape up on a side stream (CUDA's allocator and kernels' first-call work), then capture it. The
        warm-up writes the same keys and values at the same slots as the replay that follows, so it changes nothing."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward(s, cache)
        torch.cuda.current_stream().wait_stream(stream)
        s.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(s.graph):
            s.logits = self._forward(s, cache)

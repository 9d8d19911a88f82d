"""Methods whose decoding is a loop of their own across processes (pearl, pp, stpp, pipedec): the engine
runs them one sequence at a time (a batch of one), and each step advances the loop by one round.

A loop is a generator `decode(models, seq, options)` that yields the tokens each round committed; the
engine closes it when the sequence is done, which ends the round trip with the other processes.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

from specmesh.engine.sequence import Sequence
from specmesh.methods.base import Models
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.model import Transformer
from specmesh.options import Options


class Loop:
    chunked_prefill = False     # each loop prefills in its own processes

    def __init__(self, models: Models, decode: Callable[[Models, Sequence, Options], Iterator[list[int]]],
                 options: Options):
        self.models, self.decode, self.options = models, decode, options

    def admit(self, seq: Sequence, row: int) -> list[int]:
        seq.loop = self.decode(self.models, seq, self.options)
        return next(seq.loop)

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        return [next(seq.loop) for seq in seqs]

    def move_row(self, src: int, dst: int) -> None:
        pass                                # one sequence at a time: it always holds row 0

    def release(self, seq: Sequence) -> None:
        if seq.loop is not None:
            seq.loop.close()
            seq.loop = None


def prefill(model: Transformer, cache: KVCache, seq: Sequence) -> torch.Tensor:
    """The prompt into `cache` (committed); the logits after it [1, V]."""
    logits = model(torch.tensor([seq.ids], device=model.device), cache, Batch(last_only=True))[:, -1]
    cache.commit_all()
    seq.stats.target_forwards += 1
    return logits

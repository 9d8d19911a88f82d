"""Plain autoregressive decoding of the target: the reference every method must match.

A step is one target forward over every running sequence's newest token.
"""
from __future__ import annotations

import torch

from specmesh.engine.runner import Runner
from specmesh.engine.sequence import Sequence
from specmesh.lossless.penalties import penalise
from specmesh.lossless.sampling import argmax, next_tokens
from specmesh.methods.base import MethodSpec


def target_token(logits: torch.Tensor, seq: Sequence) -> int:
    """The sequence's next token from the target's logits [1, V] after its tokens (the prefill's: the first)."""
    return int(next_tokens(penalise(seq.penalty, logits), seq.params, seq.generator))


class AR:
    chunked_prefill = True  # it prefills through Runner.prefill, which takes a long prompt computed in chunks

    def __init__(self, runner: Runner):
        self.runner = runner

    def admit(self, seq: Sequence, row: int) -> list[int]:
        return self.first_token(seq, self.runner.prefill(seq, row)[-1:])

    @staticmethod
    def first_token(seq: Sequence, logits: torch.Tensor) -> list[int]:
        """The token after the prompt, from the prefill's logits [1, V]."""
        seq.score(logits)
        return [target_token(logits, seq)]

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        tokens = torch.tensor([[s.last] for s in seqs], device=self.runner.device)
        logits = self.runner.forward(tokens)[:, -1]                      # [B, V]
        self.runner.cache.commit_all()
        tops = argmax(logits).tolist()                                  # the greedy rows' tokens, at once
        out = []
        for i, seq in enumerate(seqs):
            seq.stats.target_forwards += 1
            seq.score(logits[i:i + 1])
            plain = seq.params.greedy and seq.penalty is None
            out.append([tops[i] if plain else target_token(logits[i:i + 1], seq)])
        return out

    def move_row(self, src: int, dst: int) -> None:
        self.runner.move_row(src, dst)

    def release(self, seq: Sequence) -> None:
        pass


SPEC = MethodSpec.of("ar", build=lambda models, method, runner: AR(runner), slack=lambda options: 0)

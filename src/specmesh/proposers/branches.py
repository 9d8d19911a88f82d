"""Self-Draft's draft branches: short token windows the target extends inside its own forward.

Each branch starts from 1-2 tokens copied from random places of the sequence. Every
step the target predicts a next token after each prefix of each branch (one forward,
the branches kept apart by the attention mask); the branch grows by its last
prediction and drops its oldest token beyond `length`. Each window of gram-1 branch
tokens plus the prediction after it is a contextual n-gram.
"""
from __future__ import annotations

import random
from collections.abc import Sequence

import torch


class Branches:
    def __init__(self, count: int, length: int, gram: int, sequence: Sequence[int], seed: int = 0):
        self.length, self.gram = length, gram
        rng = random.Random(seed)
        self.tokens: list[list[int]] = []
        for _ in range(count):
            start = rng.randrange(len(sequence))
            self.tokens.append(list(sequence[start:start + rng.randint(1, 2)]))

    def __len__(self) -> int:
        return sum(len(b) for b in self.tokens)

    def layout(self, offset: int) -> tuple[list[int], list[int], list[list[int]]]:
        """Flattened branch tokens, their depths below the root, and for each the slots it attends to
        (slot 0 is the root; branch tokens take slots offset, offset + 1, ...)."""
        tokens, depths, sees = [], [], []
        slot = offset
        for branch in self.tokens:
            first = slot
            for j, t in enumerate(branch):
                tokens.append(t)
                depths.append(j + 1)
                sees.append([0, *range(first, slot + 1)])
                slot += 1
        return tokens, depths, sees

    def update(self, predictions: torch.Tensor) -> list[list[int]]:
        """Grow each branch by its last prediction; return the contextual n-grams.

        predictions: the target's token after each branch position, in layout order.
        """
        preds = predictions.tolist()
        grams, i = [], 0
        for branch in self.tokens:
            out = preds[i:i + len(branch)]
            i += len(branch)
            for j in range(self.gram - 2, len(branch)):      # gram-1 branch tokens + their prediction
                grams.append(branch[j - self.gram + 2:j + 1] + [out[j]])
            branch.append(out[-1])
            del branch[:-self.length]
        return grams

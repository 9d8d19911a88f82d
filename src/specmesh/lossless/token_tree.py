"""TokenTree: the one token-tree structure every speculative method proposes.

Nodes are stored in BFS order (a parent always precedes its children). Node 0 is
the root: the newest committed token, which the target has not processed yet; the
drafted nodes hang below it. Verifying a tree runs the target once over all nodes
(`depths`, `ancestor_mask` feed the cache's tree attention) and walks down from the
root. A chain is a tree with one child per node.

Per node: token id, parent index (-1 for the root), depth, the draft's probability
of the token at its parent (`prob`) and the cumulative log-probability from the
root (`logp`). When children were drawn i.i.d. from the draft distribution (not
picked deterministically), `q[node]` holds that distribution [V] and `sampled` is set:
verification then uses rejection sampling against it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class TokenTree:
    tokens: list[int]
    parents: list[int]
    depths: list[int]
    prob: list[float]
    logp: list[float]
    sampled: bool = False
    q: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def root(cls, token: int) -> "TokenTree":
        return cls([token], [-1], [0], [1.0], [0.0])

    def add(self, token: int, parent: int, prob: float = 1.0) -> int:
        """Append a child of `parent` (parents must be added before children); returns its index."""
        self.tokens.append(token)
        self.parents.append(parent)
        self.depths.append(self.depths[parent] + 1)
        self.prob.append(prob)
        self.logp.append(self.logp[parent] + (math.log(prob) if prob > 0 else -math.inf))
        self._children = None
        return len(self.tokens) - 1

    @classmethod
    def chain(cls, root: int, tokens: list[int], probs: list[float] | None = None) -> "TokenTree":
        tree = cls.root(root)
        for i, t in enumerate(tokens):
            tree.add(t, i, probs[i] if probs else 1.0)
        return tree

    @classmethod
    def from_paths(cls, root: int, paths: list[list[int]]) -> "TokenTree":
        """Merge candidate continuations into a trie: shared prefixes become shared nodes."""
        tree = cls.root(root)
        index: dict[tuple[int, ...], int] = {(): 0}
        for d in range(max((len(p) for p in paths), default=0)):    # level by level keeps BFS order
            for path in paths:
                key = tuple(path[:d + 1])
                if len(path) > d and key not in index:
                    index[key] = tree.add(path[d], index[key[:-1]])
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def children(self, node: int) -> list[int]:
        if getattr(self, "_children", None) is None:
            self._children = [[] for _ in self.tokens]
            for i, p in enumerate(self.parents):
                if p >= 0:
                    self._children[p].append(i)
        return self._children[node]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root down to `node`."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def ancestor_mask(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """M [N, N] bool: M[i, j] = j is an ancestor of i or i itself."""
        n = len(self)
        mask = np.zeros((n, n), dtype=bool)         # numpy: a row copy per node costs a tensor op each in torch
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return torch.from_numpy(mask).to(device)

    def node(self, tokens: list[int]) -> int:
        """The node reached from the root by following `tokens`."""
        node = 0
        for t in tokens:
            node = next(c for c in self.children(node) if self.tokens[c] == t)
        return node

    def truncate(self, depth: int) -> "TokenTree":
        """The nodes at most `depth` below the root (a prefix: nodes are in BFS order)."""
        n = next((i for i, d in enumerate(self.depths) if d > depth), len(self))
        if n == len(self):
            return self
        return TokenTree(self.tokens[:n], self.parents[:n], self.depths[:n], self.prob[:n], self.logp[:n],
                         self.sampled, {k: q for k, q in self.q.items() if k < n})

    def depth_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(self.depths, device=device)

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))

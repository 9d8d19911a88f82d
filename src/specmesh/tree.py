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
        mask = torch.zeros(n, n, dtype=torch.bool)
        for i, p in enumerate(self.parents):
            if p >= 0:
                mask[i] = mask[p]
            mask[i, i] = True
        return mask.to(device)

    def depth_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        return torch.tensor(self.depths, device=device)

    def is_chain(self) -> bool:
        return all(p == i - 1 for i, p in enumerate(self.parents))


class DynamicTree:
    """PipeDec's dynamic prediction tree (Yin et al., §3.3), grown one layer per timestep.

    BFS arrays: tokens X [n], probabilities P [n] (of each token at its parent; the root's
    is 1), child counts C [n], and the ancestor mask M [n, n] (M[i, j]: j is i or an
    ancestor of i); `layers` holds the node count of each layer, root first. numpy arrays:
    the draft updates them every timestep, and a torch op costs 5-10 us where numpy's costs 1.
    """

    def __init__(self, root: int):
        self.X = np.array([root], dtype=np.int64)
        self.P = np.ones(1, dtype=np.float32)
        self.C = np.zeros(1, dtype=np.int64)
        self.M = np.ones((1, 1), dtype=bool)
        self.layers = [1]

    def __len__(self) -> int:
        return len(self.X)

    @property
    def depth(self) -> int:
        return len(self.layers)

    def layer(self, l: int) -> slice:
        """Node indices of layer l (0: the root)."""
        start = sum(self.layers[:l])
        return slice(start, start + self.layers[l])

    def cumulative(self) -> np.ndarray:
        """B = M · log(P): each node's cumulative log-probability from the root [n]."""
        return self.M.astype(np.float32) @ np.log(self.P)

    def grow(self, Q, Y, width: int) -> None:
        """Add a layer: Q, Y [n_last, c] are the draft's top-c probabilities and tokens at each node
        of the last layer; the min(width, n_last * c) candidates with the highest cumulative
        log-probability B' = log(Q) + B (x) 1_c are kept, in BFS order."""
        Q, Y = np.asarray(Q, dtype=np.float32), np.asarray(Y, dtype=np.int64)
        last = self.layer(self.depth - 1)
        scores = np.log(Q) + self.cumulative()[last, None]                   # B^(l+1) [n_last, c]
        k = min(width, scores.size)
        chosen = np.sort(np.argsort(-scores.ravel(), kind="stable")[:k])    # D, in parent order
        S = np.zeros(scores.size, dtype=bool)
        S[chosen] = True
        S = S.reshape(scores.shape)                                          # selection mask S^(l+1)
        self.C[last] = S.sum(1)
        n = len(self)
        bottom_left = np.repeat(self.M[last], self.C[last], axis=0)          # [k, n] inherited ancestors
        self.M = np.block([[self.M, np.zeros((n, k), dtype=bool)], [bottom_left, np.eye(k, dtype=bool)]])
        self.X = np.concatenate([self.X, Y.ravel()[chosen]])
        self.P = np.concatenate([self.P, Q.ravel()[chosen]])
        self.C = np.concatenate([self.C, np.zeros(k, dtype=np.int64)])
        self.layers.append(k)

    def drop_last_layer(self) -> None:
        """Remove the newest layer (to grow it again from pruned draft outputs)."""
        n = self.layer(self.depth - 1).start
        self.X, self.P, self.C, self.M = self.X[:n], self.P[:n], self.C[:n], self.M[:n, :n]
        self.layers.pop()
        self.C[self.layer(self.depth - 1)] = 0

    def hit(self, x: int) -> int:
        """hit_index: the position of token x in the second layer, or -1 (a miss)."""
        if self.depth < 2:
            return -1
        found = np.flatnonzero(self.X[self.layer(1)] == x)
        return int(found[0]) if len(found) else -1

    def prune(self, hit_index: int) -> np.ndarray:
        """Keep the subtree of the second-layer node hit_index (it becomes the root), as
        X <- X·M_h, P <- P·M_h, C <- C·M_h, M <- M_h·M·M_h^T with M_h = M[:, 1 + hit_index].
        Returns M_h (bool [n]), with which callers prune their caches alike."""
        keep = self.M[:, self.layers[0] + hit_index].copy()
        depth_of = np.repeat(np.arange(self.depth), self.layers)
        self.layers = [int(c) for c in np.bincount(depth_of[keep], minlength=self.depth)[1:] if c > 0]
        self.X, self.P, self.C = self.X[keep], self.P[keep], self.C[keep]
        self.M = self.M[keep][:, keep]
        self.P[0] = 1.0                                  # the new root is certain
        return keep

    def to_token_tree(self) -> TokenTree:
        """The same tree as a TokenTree (for `verify`): a node's parent is its deepest proper ancestor."""
        tree = TokenTree.root(int(self.X[0]))
        sizes = self.M.sum(1).tolist()                   # ancestors incl. self = depth + 1
        for i in range(1, len(self)):
            ancestors = np.flatnonzero(self.M[i]).tolist()
            parent = max((a for a in ancestors if a != i), key=lambda a: sizes[a])
            tree.add(int(self.X[i]), parent, float(self.P[i]))
        return tree

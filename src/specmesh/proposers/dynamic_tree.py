"""PipeDec's proposals (Yin et al., §3.3): the dynamic prediction tree and the draft that grows it one
layer per timestep, with a two-level cache: committed tokens (everything before the root) and the
tree nodes it has processed (all layers but the newest, as speculative slots in BFS order, so slot i
is node i), with its top-c outputs at each.

On a hit the old root's slot 0 is committed and the kept subtree's slots and outputs stay, in order;
then, as in the paper, the newest layer is grown again from the pruned outputs (its former
competitors are gone, so more of the width goes to the surviving branch). On a miss slot 0 is
committed and the rest dropped.
"""
from __future__ import annotations

import numpy as np
import torch

from specmesh.lossless.token_tree import TokenTree
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.timing import median_ms


class DynamicTree:
    """PipeDec's dynamic prediction tree (Yin et al., §3.3), grown one layer per timestep.

    BFS arrays: tokens X [n], probabilities P [n] (of each token at its parent; the root's
    is 1), child counts C [n], and the ancestor mask M [n, n] (M[i, j]: j is i or an
    ancestor of i); `layers` holds the node count of each layer, root first. numpy arrays:
    the draft updates them every timestep, and a torch op on arrays this small costs several times numpy's.
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


class TreeDrafter:
    """The draft's side: grows a DynamicTree one layer per call, with its own two-level cache."""

    def __init__(self, model, prompt: list[int], max_len: int, width: int, children: int, window: int | None = None):
        self.model, self.width, self.children = model, width, children
        prompt = prompt[-window:] if window else prompt     # the draft reads the last `window` prompt tokens
        self.cache = KVCache.for_model(model, 1, max_len)
        model(torch.tensor([prompt], device=model.device), self.cache, Batch(last_only=True))
        self.cache.commit_all()
        self.tree: DynamicTree | None = None
        self.q = self.y = None              # top-c outputs at each processed node [processed, c]

    def start(self, root: int) -> None:
        self.tree = DynamicTree(root)
        self.q = torch.empty(0, self.children, device=self.model.device)
        self.y = torch.empty(0, self.children, dtype=torch.long, device=self.model.device)

    def reset(self, root: int) -> None:
        """A miss: the old root becomes committed, the rest is dropped, and a tree starts at `root`."""
        self.cache.commit(0, [0])
        self.start(root)

    def prune(self, hit_index: int) -> torch.Tensor:
        """A hit: the old root becomes committed; the hit child's processed subtree stays, in order,
        and the newest layer is grown again from the kept outputs. Returns the tree's M_h."""
        processed = int(self.cache.spec[0])
        keep = self.tree.prune(hit_index)
        self.cache.commit(0, [0], [i for i in np.flatnonzero(keep).tolist() if i < processed])
        kept = torch.from_numpy(keep[:processed]).to(self.q.device)
        self.q, self.y = self.q[kept], self.y[kept]
        if len(self.q) == 0:                 # only the new root is left, not processed yet
            return keep
        if len(self.tree) > len(self.q):     # an unprocessed layer survived: grow it again
            self.tree.drop_last_layer()
        newest = self.tree.layer(self.tree.depth - 1)
        self.tree.grow(self.q[newest].cpu(), self.y[newest].cpu(), self.width)
        return keep

    def grow(self) -> int:
        """Process the newest layer and add the next one; returns the processed layer's width."""
        tree, device = self.tree, self.model.device
        last = tree.layer(tree.depth - 1)
        tokens = torch.from_numpy(tree.X[last][None]).to(device)                      # [1, T]
        depths = torch.full((last.stop - last.start,), tree.depth - 1, device=device)
        logits = self.model(tokens, self.cache, Batch(depths, torch.from_numpy(tree.M[last]).to(device)))[0]
        q, y = logits.float().softmax(-1).topk(self.children, dim=-1)        # [T, c]
        self.q, self.y = torch.cat([self.q, q]), torch.cat([self.y, y])
        tree.grow(q.cpu(), y.cpu(), self.width)
        return last.stop - last.start


def draft_room(stages: int, width: int) -> int:
    """Draft cache slots beyond the tokens: the processed tree (at most stages + 1 layers of `width`)."""
    return (stages + 2) * width + 1


def grow_ms(draft, width: int, children: int, context: int = 128, reps: int = 10) -> float:
    """Median time in ms of the draft's work in one timestep: grow a layer, then prune on a hit."""
    prompt = torch.randint(draft.config.vocab_size, (context,), generator=torch.Generator().manual_seed(0)).tolist()
    drafter = TreeDrafter(draft, prompt, context + reps + 4 + draft_room(reps + 4, width), width, children)
    drafter.start(prompt[-1])

    def step():
        drafter.grow()
        drafter.prune(0)

    with torch.inference_mode():
        drafter.grow()                      # the root; from here on each timestep processes a full layer
        return median_ms(step, reps)

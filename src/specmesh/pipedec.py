"""PipeDec's algorithm (Yin et al.) in one process, timestep by timestep: what the pipeline emits and when.

A pipeline of n stages, with the draft beside it. Each timestep the draft adds one layer
to the dynamic prediction tree (DynamicTree: top-c children per node of the last layer,
the best `width` by cumulative log-probability), and every stage processes the layer it
received the timestep before. When the last stage finishes the root, the target's token
x at the root is emitted: if x is a child of the root (a hit) the tree is pruned to that
child's subtree, which is one stage behind, so the next token comes one timestep later;
otherwise (a miss) the tree restarts from x, which must cross all n stages first.

The target's decision at a root depends only on the committed prefix, so the emitted
tokens are exactly autoregressive decoding's (greedy: the argmax; sampling: a draw from
the target's distribution, a hit when it is among the children). What the tree adds is
timing: a hit costs one timestep, a miss n. This module computes tokens, hits and the
layer widths each stage processes per timestep (for the virtual clock); the distributed
runtime will produce the same tokens from the same draft trees.

The draft keeps a two-level cache: committed tokens (everything before the root), and the
tree nodes it has processed (all layers but the last, as speculative slots in BFS order,
so slot i is node i), with its top-c outputs at each. A root is always processed by the
time the last stage finishes it, so on a hit the old root's slot 0 is committed and the
kept subtree's slots and outputs stay, in order; then, as in the paper, the newest layer
is grown again from the pruned outputs (its former competitors are gone, so more of the
width goes to the surviving branch). On a miss slot 0 is committed and the rest dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specmesh.cache import KVCache
from specmesh.sampling import SamplingParams, make_generator, next_tokens
from specmesh.tree import DynamicTree


@dataclass
class Timeline:
    tokens: list[int] = field(default_factory=list)
    timesteps: int = 0                  # decoding timesteps (the prefill's pass excluded)
    outcomes: list[bool] = field(default_factory=list)       # per root the last stage finished: a hit?
    widths: list[int] = field(default_factory=list)          # per timestep: nodes of the layer the draft processed

    @property
    def hits(self) -> int:
        return sum(self.outcomes)

    @property
    def hit_rate(self) -> float:
        return self.hits / len(self.outcomes) if self.outcomes else 0.0

    @property
    def tokens_per_timestep(self) -> float:
        return len(self.tokens) / self.timesteps if self.timesteps else 0.0


class TreeDrafter:
    """The draft's side: grows a DynamicTree one layer per call, with its own two-level cache."""

    def __init__(self, model, prompt: list[int], max_len: int, width: int, children: int):
        self.model, self.width, self.children = model, width, children
        self.cache = KVCache.for_model(model, 1, max_len)
        model(torch.tensor([prompt], device=model.device), self.cache, last_only=True)
        self.cache.commit_all()
        self.tree: DynamicTree | None = None
        self.q = self.y = None              # top-c outputs at each processed node [processed, c]

    def start(self, root: int) -> None:
        self.tree = DynamicTree(root, self.model.device)
        self.q = torch.empty(0, self.children, device=self.model.device)
        self.y = torch.empty(0, self.children, dtype=torch.long, device=self.model.device)

    def reset(self, root: int) -> None:
        """A miss: the old root becomes committed, the rest is dropped, and a tree starts at `root`."""
        self.cache.commit(0, [0])
        self.start(root)

    def prune(self, hit_index: int) -> None:
        """A hit: the old root becomes committed; the hit child's processed subtree stays, in order,
        and the newest layer is grown again from the kept outputs."""
        processed = int(self.cache.spec[0])
        keep = self.tree.prune(hit_index)
        self.cache.commit(0, [0], [i for i in keep.nonzero().flatten().tolist() if i < processed])
        self.q, self.y = self.q[keep[:processed]], self.y[keep[:processed]]
        if len(self.q) == 0:                 # only the new root is left, not processed yet
            return
        if len(self.tree) > len(self.q):     # an unprocessed layer survived: grow it again
            self.tree.drop_last_layer()
        self.tree.grow(self.q[self.tree.layer(self.tree.depth - 1)], self.y[self.tree.layer(self.tree.depth - 1)],
                       self.width)

    def grow(self) -> int:
        """Process the newest layer and add the next one; returns the processed layer's width."""
        tree = self.tree
        last = tree.layer(tree.depth - 1)
        tokens = tree.X[last][None]                                           # [1, T]
        depths = torch.full((last.stop - last.start,), tree.depth - 1, device=tokens.device)
        logits = self.model(tokens, self.cache, depths=depths, tree_mask=tree.M[last])[0]   # [T, V]
        q, y = logits.float().softmax(-1).topk(self.children, dim=-1)        # [T, c]
        self.q, self.y = torch.cat([self.q, q]), torch.cat([self.y, y])
        tree.grow(q, y, self.width)
        return last.stop - last.start


def run(target, draft, prompt: list[int], params: SamplingParams, max_new_tokens: int, stages: int,
        width: int = 32, children: int = 16) -> Timeline:
    """Decode with PipeDec's schedule on a pipeline of `stages` stages (token behaviour exact)."""
    timeline = Timeline()
    generator = make_generator(params.seed, target.device)
    max_len = len(prompt) + max_new_tokens + 2
    cache = KVCache.for_model(target, 1, max_len)
    logits = target(torch.tensor([prompt], device=target.device), cache, last_only=True)[:, -1]
    cache.commit_all()
    root = int(next_tokens(logits, params, generator))
    timeline.tokens.append(root)
    drafter = TreeDrafter(draft, prompt, max_len + draft_room(stages, width), width, children)
    drafter.start(root)
    wait = stages                                   # timesteps until the last stage finishes the root
    eos = set(target.config.eos_ids)
    while len(timeline.tokens) < max_new_tokens and not (root in eos and not params.ignore_eos):
        for _ in range(wait):
            timeline.widths.append(drafter.grow())
            timeline.timesteps += 1
        logits = target(torch.tensor([[root]], device=target.device), cache)[:, -1]     # the root, finished
        cache.commit_all()
        x = int(next_tokens(logits, params, generator))
        timeline.tokens.append(x)
        hit = drafter.tree.hit(x)
        timeline.outcomes.append(hit >= 0)
        if hit >= 0:
            drafter.prune(hit)
            wait = 1
        else:
            drafter.reset(x)
            wait = stages
        root = x
    return timeline


def draft_room(stages: int, width: int) -> int:
    """Draft cache slots beyond the tokens: the processed tree (at most stages + 1 layers of `width`)."""
    return (stages + 2) * width + 1

"""PipeDec's algorithm (Yin et al.) in one process, timestep by timestep: what the pipeline emits and when.

A pipeline of n stages, with the draft S beside it. Each timestep S adds one layer to the
dynamic prediction tree (DynamicTree: top-c children per node of the newest layer, the
best `width` by cumulative log-probability) and stage 0 processes that newest layer,
while every other stage processes the layer its predecessor processed the timestep
before. When the last stage has finished the root, the target's token x there is
emitted: if x is one of the root's children in the pipeline (a hit), every rank prunes
to that child's subtree, which is one stage behind, so the next token can come one
timestep later; otherwise (a miss) the tree restarts from x, which must cross all n
stages first.

The target's decision at a root depends only on the committed prefix, so the emitted
tokens are exactly autoregressive decoding's (greedy: the argmax; sampling: a draw from
the target's distribution, a hit when it is among the children). What the tree adds is
timing. `run` computes tokens, hits and each stage's load per timestep (for the virtual
clock) exactly as the distributed runtime (methods/pipedec.py) produces them.

The draft keeps a two-level cache: committed tokens (everything before the root), and the
tree nodes it has processed (all layers but the last, as speculative slots in BFS order,
so slot i is node i), with its top-c outputs at each. On a hit the old root's slot 0 is
committed and the kept subtree's slots and outputs stay, in order; then, as in the paper,
the newest layer is grown again from the pruned outputs (its former competitors are gone,
so more of the width goes to the surviving branch). On a miss slot 0 is committed and
the rest dropped.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from specmesh.cache import KVCache
from specmesh.dist.pipeline import check_stages, stage_seed
from specmesh.sampling import SamplingParams, make_generator, next_tokens
from specmesh.timing import median_ms
from specmesh.tree import DynamicTree


@dataclass
class Timeline:
    tokens: list[int] = field(default_factory=list)
    timesteps: int = 0                  # decoding timesteps (the prefill's pass excluded)
    outcomes: list[bool] = field(default_factory=list)       # per root the last stage finished: a hit?
    widths: list[int] = field(default_factory=list)          # per timestep: nodes of the layer the draft processed
    loads: list[list[int]] = field(default_factory=list)     # per timestep: nodes each stage processed

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

    def __init__(self, model, prompt: list[int], max_len: int, width: int, children: int, window: int | None = None):
        self.model, self.width, self.children = model, width, children
        prompt = prompt[-window:] if window else prompt     # the draft reads the last `window` prompt tokens
        self.cache = KVCache.for_model(model, 1, max_len)
        model(torch.tensor([prompt], device=model.device), self.cache, last_only=True)
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
        logits = self.model(tokens, self.cache, depths=depths, tree_mask=torch.from_numpy(tree.M[last]).to(device))[0]
        q, y = logits.float().softmax(-1).topk(self.children, dim=-1)        # [T, c]
        self.q, self.y = torch.cat([self.q, q]), torch.cat([self.y, y])
        tree.grow(q.cpu(), y.cpu(), self.width)
        return last.stop - last.start


def run(target, draft, prompt: list[int], params: SamplingParams, max_new_tokens: int, stages: int,
        width: int = 32, children: int = 16, window: int | None = None) -> Timeline:
    """Decode with PipeDec on `stages` stages, timestep by timestep as the distributed runtime
    (specmesh.dist.pipeline) runs it: the tokens, hits, misses and every stage's load are its.

    `held[i]` lists the tree nodes stage i processes in the current timestep: stage 0 takes
    S's newest layer; a layer reaches the next stage one timestep later, pruned by the
    decision taken meanwhile. When the last stage holds the root, its token x is decided at
    the end of the timestep: a hit when x is among the root's children that stage n-2
    processed in that same timestep (the pipeline's layer 1; empty after a hit on a child
    whose subtree did not reach that deep, which is then a miss)."""
    check_stages(stages, stages, "pipedec")         # any depth: only time is modelled per stage
    timeline = Timeline()
    generator = make_generator(stage_seed(make_generator(params.seed, target.device)), target.device)   # as the last stage's
    max_len = len(prompt) + max_new_tokens + 2
    cache = KVCache.for_model(target, 1, max_len)
    logits = target(torch.tensor([prompt], device=target.device), cache, last_only=True)[:, -1]
    cache.commit_all()
    root = int(next_tokens(logits, params, generator))
    timeline.tokens.append(root)
    drafter = TreeDrafter(draft, prompt, max_len + draft_room(stages, width), width, children, window)
    drafter.start(root)
    held: list[list[int]] = [[] for _ in range(stages)]
    eos = set(target.config.eos_ids)
    while len(timeline.tokens) < max_new_tokens and not (root in eos and not params.ignore_eos):
        tree = drafter.tree
        held[0] = list(range(tree.layer(tree.depth - 1).start, len(tree)))
        timeline.loads.append([len(nodes) for nodes in held])
        timeline.widths.append(drafter.grow())          # S processes the layer stage 0 does
        timeline.timesteps += 1
        if held[-1] != [0]:                             # no root finished: the layers move on
            held = [[]] + held[:-1]
            continue
        logits = target(torch.tensor([[root]], device=target.device), cache)[:, -1]
        cache.commit_all()
        root = int(next_tokens(logits, params, generator))
        timeline.tokens.append(root)
        layer1 = {int(tree.X[j]): j for j in held[-2] if int(tree.M[j].sum()) == 2}    # depth-1 nodes
        timeline.outcomes.append(root in layer1)
        if root in layer1:
            keep = drafter.prune(layer1[root] - 1)
            index = (keep.cumsum(0) - 1).tolist()       # node numbers after the prune
            held = [[]] + [[index[j] for j in nodes if keep[j]] for nodes in held[:-1]]
        else:
            drafter.reset(root)
            held = [[] for _ in range(stages)]
    return timeline


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

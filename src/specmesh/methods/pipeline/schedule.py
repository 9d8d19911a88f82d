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
clock) exactly as the distributed runtime (methods/pipeline/pipedec.py) produces them.
The draft S is proposers/dynamic_tree.TreeDrafter.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specmesh.lossless.sampling import SamplingParams, make_generator, next_tokens
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.proposers.dynamic_tree import TreeDrafter, draft_room
from specmesh.runtime.pipeline import check_stages, stage_seed


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


def run(target, draft, prompt: list[int], params: SamplingParams, max_new_tokens: int, stages: int,
        width: int = 32, children: int = 16, window: int | None = None) -> Timeline:
    """Decode with PipeDec on `stages` stages, timestep by timestep as the distributed runtime
    (specmesh.runtime.pipeline) runs it: the tokens, hits, misses and every stage's load are its.

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
    logits = target(torch.tensor([prompt], device=target.device), cache, Batch(last_only=True))[:, -1]
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

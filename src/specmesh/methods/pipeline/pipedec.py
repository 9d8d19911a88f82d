"""PipeDec (Yin et al.) on the pipeline runtime: the draft S (this rank) grows the dynamic
prediction tree one layer per timestep while every target stage processes, at the same
time, the layer it received the timestep before (specmesh.methods.pipeline.schedule has the algorithm and
its one-process schedule; specmesh.runtime.pipeline the stages and the protocol).

A timestep, as S runs it: send the tree's newest layer to stage 0, grow the tree by one
layer (a draft forward over that same layer, while the stages work), then take the last
stage's decision. When the last stage finished a root, its token x is emitted: a hit when
x is one of the root's children (the tree, and every stage's predict cache and layer in
flight, keep x's subtree; the next token comes one timestep later), otherwise a miss
(everything restarts from x, which must cross all stages).
"""
from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.methods.base import MethodSpec, Models
from specmesh.methods.loop import Loop
from specmesh.methods.pipeline import stages
from specmesh.model.loader import load_model
from specmesh.proposers.dynamic_tree import TreeDrafter, draft_room, grow_ms
from specmesh.runtime.pipeline import HIT, NONE, Pipeline, balanced_layers, check_stages, tree_meta
from specmesh.timing import layer_and_head_ms, layer_ms, share_of_cores, torch_threads
from specmesh.options import PipeDecOptions



def slack(options: PipeDecOptions) -> int:
    return draft_room(options.stages, options.tree_width)


def start(models: Models, draft: Path, dtype: torch.dtype, options: PipeDecOptions) -> None:
    """Method hook (LLM): load the draft (this rank is S), measure the costs that balance the
    stages, start the stage processes."""
    models.draft = load_model(draft, dtype, models.target.device, draft=True, quant=models.target.quant)
    costs = StageCosts.measure(models, options)
    show = lambda split: ", ".join(f"{r.start}-{r.stop - 1}" for r in split)      # noqa: E731
    print(f"pipedec: target layers per stage balanced for each request's context on this machine "
          f"({show(costs.split(128))} at 128 tokens, {show(costs.split(1024))} at 1024); the draft S "
          f"{'apart' if options.draft_apart else 'beside stage 0'}", file=sys.stderr, flush=True)
    models.remote = BalancedPipeline.start(models, dtype, costs.split(128), options.timeout, stages.SERVE,
                                           draft=True, apart=options.draft_apart)
    models.remote.costs = costs


class BalancedPipeline(Pipeline):
    """The pipeline with what balances each job's split across its stages (StageCosts)."""
    costs: "StageCosts"


@dataclass
class StageCosts:
    """What balances PipeDec's stages: with one thread, as every stage has, a target layer's time over
    a tree layer (`wide`) and over a root, and the head's, each at two context lengths (attention
    grows with the context: linear in between); S's work per timestep (`draft`, 0 when S is apart)."""
    num_layers: int
    stages: int
    contexts: tuple[int, int]
    wide: tuple[float, float]
    root: tuple[float, float]
    head: tuple[float, float]
    draft: float

    @classmethod
    def measure(cls, models: Models, options: PipeDecOptions, contexts: tuple[int, int] = (64, 512)) -> "StageCosts":
        target, width, L = models.target, options.tree_width, models.target.config.num_layers
        check_stages(L, options.stages, "pipedec")
        with torch_threads(share_of_cores(options.stages + options.draft_apart)):     # as each rank runs
            wide = tuple(layer_ms(target, width, c) for c in contexts)
            root, head = zip(*(layer_and_head_ms(target, 1, c) for c in contexts))
            draft = 0.0 if options.draft_apart else grow_ms(models.draft, width, options.max_children,
                                                               options.draft_window)
        return cls(L, options.stages, contexts, wide, root, head, draft)

    def split(self, context: int) -> list[range]:
        """The balanced split for a request with `context` tokens (prompt and half the new ones)."""
        f = max(0.0, (context - self.contexts[0]) / (self.contexts[1] - self.contexts[0]))
        wide, root, head = (a + f * (b - a) for a, b in (self.wide, self.root, self.head))     # linear in context
        return balanced_layers(self.num_layers, self.stages, self.draft, wide, root, head, "pipedec")


def newest_layer(drafter: TreeDrafter) -> torch.Tensor:
    """meta of the tree's newest layer: its tokens at depth d, mask rows over every node up to it."""
    tree = drafter.tree
    layer = tree.layer(tree.depth - 1)
    X = torch.from_numpy(tree.X[layer])
    return tree_meta(X, torch.full_like(X, tree.depth - 1), torch.full_like(X, -1),
                     torch.from_numpy(tree.M[layer, :layer.stop]))


def decode(models: Models, seq: Sequence, options: PipeDecOptions) -> Iterator[list[int]]:
    pipe: BalancedPipeline = models.remote
    stats, width = seq.stats, options.tree_width
    max_len = len(seq.ids) + seq.limit + slack(options)
    pipe.begin(stages.job(seq, "pipedec"), max_len, True, draft_room(options.stages, width),
               pipe.costs.split(len(seq.ids) + seq.limit // 2))
    in_flight = False                                       # a layer was sent: its decision is still owed

    def finish():                                           # the consumer stopped: take that decision, end
        if in_flight:
            pipe.decision()
        pipe.end()

    with pipe.running(finish=finish):
        pipe.send(seq.ids)                                  # the prompt: a plain pass through the stages
        drafter = TreeDrafter(models.draft, seq.ids, max_len, width, options.max_children,
                              options.draft_window)
        x = pipe.decision().token
        stats.target_forwards += 1
        stats.draft_forwards += 1
        drafter.start(x)
        emitted = [x]
        while True:
            pipe.send(meta=newest_layer(drafter))
            if pipe.stage is None:
                pipe.flush()                                # S apart: stage 0 has it before S computes on
            in_flight = True
            pipe.checkpoint()
            if emitted:                                     # the consumer takes it while stage 0 works
                yield emitted
                emitted = []
            drafter.grow()
            decision = pipe.decision()
            in_flight = False
            stats.draft_forwards += 1
            stats.timesteps += 1
            stats.target_forwards += 1                      # every stage processed one layer
            if decision.kind == NONE:                       # the root is still on its way
                continue
            x = decision.token
            stats.decisions += 1
            if decision.kind == HIT:                        # the pipeline's layer 1 is the tree's
                if drafter.tree.hit(x) != decision.nodes[0] - 1:
                    raise RuntimeError(f"the last stage's {decision} does not match the draft's tree")
                stats.hits += 1
                drafter.prune(decision.nodes[0] - 1)
            else:                                           # (the tree may hold x in a layer not sent yet)
                drafter.reset(x)
            emitted = [x]


SPEC = MethodSpec.of("pipedec", build=lambda models, method, runner: Loop(models, decode, method.config), slack=slack,
                     start=start, logprobs=False, penalties=False)

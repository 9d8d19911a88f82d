"""STPP, PipeDec's static-tree baseline: speculative decoding through the pipeline.

Each round the draft S (this rank) grows a whole static tree below the newest token
(the `tree` method's top-k expansion, `gamma` levels of at most `tree_width` nodes), the
tree crosses every stage in one pass, and the last stage verifies it (the shared
`verify`; children are deterministic proposals, so sampling draws the target's token at
each node) and replies with the accepted path and the next token, which every stage
then commits.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.methods.base import MethodSpec, Models
from specmesh.methods.loop import Loop
from specmesh.methods.pipeline import stages
from specmesh.model.loader import load_model
from specmesh.proposers.draft_model import DraftModel
from specmesh.runtime.pipeline import Pipeline, stage_layers, tree_meta
from specmesh.options import StppOptions



def slack(options: StppOptions) -> int:
    return options.gamma * options.tree_width + 1


def start(models: Models, draft: Path, dtype: torch.dtype, options: StppOptions) -> None:
    """Method hook (LLM): load the draft (this rank is S), start the stage processes."""
    split = stage_layers(models.target.config.num_layers, options.stages, "stpp")
    models.draft = load_model(draft, dtype, models.target.device, draft=True, quant=models.target.quant)
    models.remote = Pipeline.start(models, dtype, split, options.timeout, stages.SERVE, draft=True,
                                   apart=options.draft_apart)


def whole_tree(tree: TokenTree) -> torch.Tensor:
    return tree_meta(torch.tensor(tree.tokens), tree.depth_tensor(), torch.tensor(tree.parents), tree.ancestor_mask())


def decode(models: Models, seq: Sequence, options: StppOptions) -> Iterator[list[int]]:
    pipe: Pipeline = models.remote
    stats, gamma, depth = seq.stats, options.gamma, options.stages
    max_len = len(seq.ids) + seq.limit + slack(options)
    pipe.begin(stages.job(seq, "stpp"), max_len, False, slack(options))
    with pipe.running(finish=pipe.end):
        pipe.send(seq.ids)                                  # the prompt: a plain pass through the stages
        drafter = DraftModel(models.draft, 1, max_len, options.draft_window, options.tree_width,
                             options.max_children, deterministic=True)
        drafter.admit(0, seq)
        x = pipe.decision().token
        stats.target_forwards += 1
        pipe.checkpoint()
        yield [x]
        while True:                                         # the engine has appended x to seq.tokens
            tree = drafter.propose([seq], [gamma])[0]
            pipe.send(meta=whole_tree(tree))
            decision = pipe.decision()
            x = decision.token
            verdict = Verdict(decision.nodes, [tree.tokens[i] for i in decision.nodes[1:]] + [x], x)
            drafter.accept([seq], [tree], [verdict])
            stats.target_forwards += 1
            stats.timesteps += gamma + depth               # drafting level by level, then a full pass
            stats.verifications += 1
            stats.drafted_tokens += len(tree) - 1
            stats.accepted_tokens += verdict.accepted
            pipe.checkpoint()
            yield verdict.tokens


SPEC = MethodSpec.of("stpp", build=lambda models, method, runner: Loop(models, decode, method.config),
                     slack=slack, start=start, logprobs=False, penalties=False)

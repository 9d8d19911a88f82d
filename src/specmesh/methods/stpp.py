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

from specmesh.dist.pipeline import Pipeline, stage_layers, tree_meta
from specmesh.drafters.draft_model import DraftModel
from specmesh.job import Job, Models
from specmesh.loader import load_model
from specmesh.tree import TokenTree
from specmesh.verify import Verdict

NEEDS_DRAFT = True
OPTIONS = {"stages": 2, "gamma": 4, "tree_width": 4, "max_children": 4, "draft_window": 64, "draft_apart": False,
           "timeout": 30}


def slack(gamma: int = OPTIONS["gamma"], tree_width: int = OPTIONS["tree_width"], **_) -> int:
    return gamma * tree_width + 1


def start(models: Models, draft: Path, dtype: torch.dtype, options: dict) -> None:
    """Method hook (LLM): load the draft (this rank is S), start the stage processes."""
    split = stage_layers(models.target.config.num_layers, options["stages"], "stpp")
    models.draft = load_model(draft, dtype, models.target.device, draft=True)
    models.remote = Pipeline.start(models, dtype, split, options["timeout"], draft=True, apart=options["draft_apart"])


def whole_tree(tree: TokenTree) -> torch.Tensor:
    return tree_meta(torch.tensor(tree.tokens), tree.depth_tensor(), torch.tensor(tree.parents), tree.ancestor_mask())


def decode(models: Models, job: Job, stages: int = OPTIONS["stages"], gamma: int = OPTIONS["gamma"],
           tree_width: int = OPTIONS["tree_width"], max_children: int = OPTIONS["max_children"],
           draft_window: int = OPTIONS["draft_window"], draft_apart: bool = OPTIONS["draft_apart"],
           timeout: int = OPTIONS["timeout"]) -> Iterator[list[list[int]]]:
    pipe: Pipeline = models.remote
    stats = job.stats
    pipe.begin(job, "stpp", slack(gamma, tree_width))
    with pipe.running(finish=pipe.end):
        pipe.send(job.prompt)                               # the prompt: a plain pass through the stages
        drafter = DraftModel(models.draft, job, draft_window)
        x = pipe.decision().token
        stats.target_forwards += 1
        yield [[x]]
        while True:
            tree = drafter.propose(x, gamma, tree_width, max_children, deterministic=True)
            pipe.send(meta=whole_tree(tree))
            decision = pipe.decision()
            x = decision.token
            verdict = Verdict(decision.nodes, [tree.tokens[i] for i in decision.nodes[1:]] + [x], x)
            drafter.accept(tree, verdict)
            stats.target_forwards += 1
            stats.timesteps += gamma + stages               # drafting level by level, then a full pass
            stats.verifications += 1
            stats.drafted_tokens += len(tree) - 1
            stats.accepted_tokens += verdict.accepted
            yield [verdict.tokens]

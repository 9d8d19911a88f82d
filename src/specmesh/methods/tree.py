"""Static-tree speculative decoding (SpecInfer-style; STPP on a pipeline).

The draft grows a tree level by level (top-k children per node, the `tree_width`
best by cumulative log-probability per level) and the target verifies all of it
in one forward with tree attention. Children are deterministic proposals, so
sampling stays lossless by drawing the target token at each node.
"""
from __future__ import annotations

from collections.abc import Iterator

from specmesh.job import Job, Models
from specmesh.methods.sd import speculate

NEEDS_DRAFT = True
OPTIONS = {"gamma": 5, "tree_width": 3, "max_children": 2, "draft_window": 64}


def slack(gamma: int = OPTIONS["gamma"], tree_width: int = OPTIONS["tree_width"], **_) -> int:
    return gamma * tree_width + 1


def decode(models: Models, job: Job, gamma: int = OPTIONS["gamma"], tree_width: int = OPTIONS["tree_width"],
           max_children: int = OPTIONS["max_children"],
           draft_window: int = OPTIONS["draft_window"]) -> Iterator[list[list[int]]]:
    return speculate(models, job, gamma, tree_width, max_children, draft_window)

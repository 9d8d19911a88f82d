"""Speculative decoding with a draft model (Leviathan et al.; Chen et al.).

Each step the draft proposes γ tokens below the newest token (drawn from q when
sampling, argmax when greedy), the target checks them all in one forward, and
`verify` keeps the longest acceptable prefix plus one target token. The same loop
verifies trees (method `tree`), so it is written for trees.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from specmesh.cache import KVCache
from specmesh.drafters.draft_model import DraftModel
from specmesh.job import Job, Models
from specmesh.sampling import next_tokens
from specmesh.verify import verify

NEEDS_DRAFT = True
OPTIONS = {"gamma": 4, "draft_window": 64}


def slack(gamma: int = OPTIONS["gamma"], width: int = 1, **_) -> int:
    return gamma * width + 1


def decode(models: Models, job: Job, gamma: int = OPTIONS["gamma"],
           draft_window: int = OPTIONS["draft_window"]) -> Iterator[list[list[int]]]:
    return speculate(models, job, gamma, width=1, max_children=1, draft_window=draft_window)


def speculate(models: Models, job: Job, depth: int, width: int, max_children: int,
              draft_window: int) -> Iterator[list[list[int]]]:
    target, stats = models.target, job.stats
    cache = KVCache.for_model(target, 1, job.max_len)
    drafter = DraftModel(models.draft, job, draft_window)
    logits = job.prefill(target, cache, job.prompt, "target")
    root = int(next_tokens(logits, job.params, job.generator))
    yield [[root]]
    produced = 1
    while True:
        # never draft past max_new_tokens: the last step may verify nothing
        tree = drafter.propose(root, min(depth, job.limit - produced - 1), width, max_children)
        tokens = torch.tensor([tree.tokens], device=target.device)
        if tree.is_chain():
            logits = target(tokens, cache)[0]                                    # [N, V]
        else:
            logits = target(tokens, cache, depths=tree.depth_tensor(target.device),
                            tree_mask=tree.ancestor_mask(target.device))[0]
        verdict = verify(tree, logits, job.params, job.generator)
        cache.commit(0, verdict.path)
        drafter.accept(tree, verdict)
        stats.target_forwards += 1
        stats.verifications += 1
        stats.drafted_tokens += len(tree) - 1
        stats.accepted_tokens += verdict.accepted
        produced += len(verdict.tokens)
        root = verdict.next_token
        yield [verdict.tokens]

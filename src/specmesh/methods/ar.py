"""Plain autoregressive decoding of the target: the reference every method must match."""
from __future__ import annotations

from collections.abc import Iterator

import torch

from specmesh.cache import KVCache
from specmesh.job import Job, Models
from specmesh.sampling import next_tokens

NEEDS_DRAFT = False
BATCHED = True          # decodes the n samples of a request as one batch
OPTIONS: dict = {}


def slack(**_) -> int:
    return 0


def decode(models: Models, job: Job) -> Iterator[list[list[int]]]:
    target = models.target
    cache = KVCache.for_model(target, job.rows, job.max_len)
    ids = torch.tensor([job.prompt] * job.rows, device=target.device)
    logits = target(ids, cache, last_only=True)[:, -1]         # [B, V]
    while True:
        cache.commit_all()
        job.stats.target_forwards += 1
        tokens = next_tokens(logits, job.params, job.generator)  # [B]
        yield [[t] for t in tokens.tolist()]
        logits = target(tokens[:, None], cache)[:, -1]

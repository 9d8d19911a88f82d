"""Plain autoregressive decoding of the target: the reference every method must match."""
from __future__ import annotations

from collections.abc import Iterator

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
    logits = job.prefill(target, cache, job.prompt, "target")     # [B, V]
    while True:
        tokens = next_tokens(logits, job.params, job.generator)  # [B]
        yield [[t] for t in tokens.tolist()]
        logits = target(tokens[:, None], cache)[:, -1]
        cache.commit_all()
        job.stats.target_forwards += 1

"""Plain pipeline-parallel decoding (PipeDec's baseline PP): one token per full pass.

The target is split into `stages` processes (specmesh.dist.pipeline); this rank holds the
first stage and the loop. Each token's ids go through every stage in turn; the last
stage decides the token (greedy or sampled with the request's seed) and sends it back.
"""
from __future__ import annotations

import atexit
from collections.abc import Iterator
from pathlib import Path

import torch

from specmesh.dist import pipeline
from specmesh.dist.link import connect
from specmesh.job import Job, Models

NEEDS_DRAFT = False
OPTIONS = {"stages": 2, "timeout": 30}


def slack(**_) -> int:
    return 0


class PipelinePeer:
    """Rank 0's handle on the other stages."""

    def __init__(self, link, stage: pipeline.Stage):
        self.link, self.stage = link, stage
        atexit.register(self.close)

    def close(self) -> None:
        if self.link is not None:
            self.link.shutdown()
            self.link = None


def start(models: Models, draft: Path | None, dtype: torch.dtype, options: dict) -> None:
    """Method hook (LLM): start the other stages' processes."""
    target, n = models.target, options["stages"]
    if n < 2:
        raise ValueError("pp needs at least 2 stages (1 stage is `ar`)")
    pipeline.stage_layers(target.config.num_layers, n)           # a clear error before any process starts
    config = {"serve": "specmesh.dist.pipeline:StageServer", "target": str(models.target_path),
              "dtype": str(dtype).split(".")[-1], "device": str(target.device), "timeout": options["timeout"],
              "threads": 1}
    roles = pipeline.roles(n)
    link = connect(roles, config, options["timeout"])
    models.remote = PipelinePeer(link, pipeline.Stage(target, link))


def decode(models: Models, job: Job, stages: int = OPTIONS["stages"],
           timeout: int = OPTIONS["timeout"]) -> Iterator[list[list[int]]]:
    peer: PipelinePeer = models.remote
    stage, link = peer.stage, peer.link
    p = job.params
    seed = int(torch.randint(2 ** 62, (), generator=job.generator, device=job.generator.device))
    for rank in range(1, len(link.roles)):
        link.send_obj({"max_len": job.max_len, "seed": seed,
                       "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p}}, rank)
    stage.begin(job.max_len)
    tokens = job.prompt
    try:
        while True:
            stage.send_on(stage.forward(torch.tensor([tokens], device=models.target.device)))
            token = int(link.recv(torch.zeros(1, dtype=torch.int64), len(link.roles) - 1))
            job.stats.target_forwards += 1
            yield [[token]]
            tokens = [token]
    finally:
        stage.end()

"""Plain pipeline-parallel decoding (PipeDec's baseline PP): one token per full pass.

The target is split into `stages` processes (specmesh.dist.pipeline); this rank holds the
first stage and the loop. Each token's ids go through every stage in turn; the last
stage decides the token (greedy or sampled with the request's seed) and sends it back.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from specmesh.dist.pipeline import Packet, Pipeline, stage_layers
from specmesh.job import Job, Models

NEEDS_DRAFT = False
OPTIONS = {"stages": 2, "timeout": 30}


def slack(**_) -> int:
    return 0


def start(models: Models, draft: Path | None, dtype: torch.dtype, options: dict) -> None:
    """Method hook (LLM): start the other stages' processes."""
    split = stage_layers(models.target.config.num_layers, options["stages"], "pp")
    models.remote = Pipeline.start(models, dtype, split, options["timeout"])


def decode(models: Models, job: Job, stages: int = OPTIONS["stages"],
           timeout: int = OPTIONS["timeout"]) -> Iterator[list[list[int]]]:
    pipe: Pipeline = models.remote
    stage, link = pipe.stage, pipe.link
    pipe.begin(job, "pp")
    tokens = job.prompt
    with pipe.running(finish=stage.end):
        while True:
            stage.send_on(Packet(stage.forward(Packet(torch.tensor([tokens], device=models.target.device)))))
            token = int(link.recv(torch.zeros(1, dtype=torch.int64), len(link.roles) - 1))
            job.stats.target_forwards += 1
            job.stats.timesteps += stages
            yield [[token]]
            tokens = [token]

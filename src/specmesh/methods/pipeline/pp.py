"""Plain pipeline-parallel decoding (PipeDec's baseline PP): one token per full pass.

The target is split into `stages` processes (specmesh.runtime.pipeline); this rank holds the
first stage and the loop. Each token's ids go through every stage in turn; the last
stage decides the token (greedy or sampled with the request's seed) and sends it back.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.methods.base import MethodSpec, Models
from specmesh.methods.loop import Loop
from specmesh.methods.pipeline import stages
from specmesh.runtime.pipeline import Packet, Pipeline, stage_layers
from specmesh.options import PpOptions


def start(models: Models, draft: Path | None, dtype: torch.dtype, options: PpOptions) -> None:
    """Method hook (LLM): start the other stages' processes."""
    split = stage_layers(models.target.config.num_layers, options.stages, "pp")
    models.remote = Pipeline.start(models, dtype, split, options.timeout, stages.SERVE)


def decode(models: Models, seq: Sequence, options: PpOptions) -> Iterator[list[int]]:
    pipe: Pipeline = models.remote
    pipe.begin(stages.job(seq, "pp"), len(seq.ids) + seq.limit, False)
    stage, link = pipe.stage, pipe.link                 # (after begin: it may have started the stages anew)
    tokens = seq.ids
    with pipe.running(finish=stage.end):
        while True:
            stage.send_on(Packet(stage.forward(Packet(torch.tensor([tokens], device=models.target.device)))))
            token = int(link.recv(torch.zeros(1, dtype=torch.int64), len(link.roles) - 1))
            seq.stats.target_forwards += 1
            seq.stats.timesteps += options.stages
            pipe.checkpoint()
            yield [token]
            tokens = [token]


SPEC = MethodSpec.of("pp", build=lambda models, method, runner: Loop(models, decode, method.config),
                     slack=lambda options: 0, start=start, logprobs=False, penalties=False)

"""Pipeline-parallel runtime: the target split into stages of contiguous layers, one process each.

Rank i holds stage i (`stage_layers`): rank 0 also the embedding and the decode loop, the
last rank the final norm and the LM head. Activations travel point to point, rank i to
rank i + 1: a header [T] (T = 0: the request is over) and then the hidden states
[1, T, D]. The last rank turns the last position's logits into the next token with the
request's sampling parameters and seed (the one place where tokens are decided) and
sends it to rank 0. Every wait is bounded by the link's timeout, so a dead or silent
stage is reported by name.
"""
from __future__ import annotations

from pathlib import Path

import torch

from specmesh.cache import KVCache
from specmesh.dist.link import Link
from specmesh.sampling import SamplingParams, make_generator, next_tokens


def roles(stages: int) -> list[str]:
    return [f"stage{i}" for i in range(stages)]


def stage_layers(num_layers: int, stages: int) -> list[range]:
    """Contiguous layer ranges, as even as possible (earlier stages take the extra layers)."""
    if not 1 <= stages <= num_layers:
        raise ValueError(f"cannot split {num_layers} layers into {stages} stages (1 to {num_layers})")
    base, extra = divmod(num_layers, stages)
    bounds = [0]
    for i in range(stages):
        bounds.append(bounds[-1] + base + (i < extra))
    return [range(a, b) for a, b in zip(bounds, bounds[1:])]


class Stage:
    """One stage's model part, cache and links (any rank)."""

    def __init__(self, model, link: Link):
        self.model, self.link = model, link
        self.rank, self.size = link.rank, len(link.roles)
        self.layers = stage_layers(model.config.num_layers, self.size)[self.rank]
        self.cache: KVCache | None = None

    def begin(self, max_len: int) -> None:
        self.cache = KVCache.for_model(self.model, 1, max_len, self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Ids [1, T] (rank 0) or hidden states [1, T, D] -> hidden states, or logits on the last rank."""
        out = self.model(x, self.cache, layers=self.layers, last_only=self.rank == self.size - 1)
        self.cache.commit_all()
        return out

    def send_on(self, h: torch.Tensor) -> None:
        self.link.send(torch.tensor([h.shape[1]]), self.rank + 1)
        self.link.send(h.float(), self.rank + 1)

    def receive(self) -> torch.Tensor | None:
        """Hidden states from the previous rank, or None when the request is over."""
        T = int(self.link.recv(torch.zeros(1, dtype=torch.int64), self.rank - 1))
        if T == 0:
            return None
        h = self.link.recv(torch.zeros(1, T, self.model.config.hidden_size), self.rank - 1)
        return h.to(self.model.dtype)

    def end(self) -> None:
        if self.rank + 1 < self.size:
            self.link.send(torch.tensor([0]), self.rank + 1)


class StageServer:
    """Ranks 1..n-1: load the target, keep one stage, serve requests until shutdown."""

    def __init__(self, config: dict):
        from specmesh.loader import DTYPES, load_model
        self.model = load_model(Path(config["target"]), DTYPES[config["dtype"]], torch.device(config["device"]))

    def run(self, link: Link) -> None:
        stage = Stage(self.model, link)
        with torch.inference_mode():
            while not (job := link.recv_obj(0, idle=True)).get("shutdown"):
                self.serve(stage, job)

    def serve(self, stage: Stage, job: dict) -> None:
        stage.begin(job["max_len"])
        params = SamplingParams(**job["params"])
        generator = make_generator(job["seed"], self.model.device)
        last = stage.rank == stage.size - 1
        while (h := stage.receive()) is not None:
            out = stage.forward(h)
            if last:
                stage.link.send(next_tokens(out[:, -1], params, generator).cpu(), 0)
            else:
                stage.send_on(out)
        stage.end()

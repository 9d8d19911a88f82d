"""What a decoding method gets: the models and one generation job."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from specmesh.model import Transformer
from specmesh.sampling import SamplingParams
from specmesh.stats import Stats


@dataclass
class Models:
    target: Transformer
    draft: Transformer | None = None


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    max_len: int                    # cache length: prompt + new tokens + the method's slack
    limit: int                      # tokens to generate at most (max_new_tokens within the context)
    rows: int = 1                   # independent samples decoded as one batch
    stats: Stats = field(default_factory=Stats)

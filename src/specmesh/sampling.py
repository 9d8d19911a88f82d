"""Sampling parameters and the one logits -> probabilities transform every method shares."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0        # 0 means greedy
    top_k: int = 0                  # 0: no top-k filter
    top_p: float = 1.0
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1
    ignore_eos: bool = False

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.validate()

    def validate(self) -> None:
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k!r}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n!r}")
        if any(not s for s in self.stop):
            raise ValueError("stop strings must be non-empty")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Target (or draft) distribution after temperature, top-k and top-p. logits [..., V] -> probs [..., V].

    Greedy (temperature 0) gives the one-hot of the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = logits.topk(params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    if params.top_p < 1:
        sorted_logits, order = logits.sort(dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop = cum - sorted_logits.softmax(-1) >= params.top_p     # mass before this token already >= top_p
        logits = logits.masked_fill(drop.scatter(-1, order, drop), -math.inf)
    return logits.softmax(-1)


def argmax(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., V] -> indices [...] (int64, the first maximum). On CPU through numpy: a few
    microseconds, where torch's argmax costs 15-40 for the few rows of a decoding step."""
    if logits.device.type != "cpu" or logits.dtype not in (torch.float32, torch.float64):
        return logits.argmax(-1)
    return torch.as_tensor(np.asarray(logits.detach().numpy().argmax(-1)))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from probs [B, V] -> [B]."""
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def next_tokens(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """Next token per row from logits [B, V]: argmax when greedy, else a draw from probs_from_logits."""
    if params.greedy:
        return argmax(logits)
    return sample(probs_from_logits(logits, params), generator)


def make_generator(seed: int | None, device: torch.device | str) -> torch.Generator:
    g = torch.Generator(device=device)
    if seed is None:
        g.seed()
    else:
        g.manual_seed(seed)
    return g

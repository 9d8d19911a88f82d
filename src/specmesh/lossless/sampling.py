"""Sampling parameters and the one logits -> probabilities transform every method shares."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch


MAX_LOGPROBS = 20
MAX_LOGIT_BIAS = 300        # entries of logit_bias (OpenAI's bound)
GREEDY_BELOW = 1e-5         # a temperature below it decodes greedily
NEUTRAL_PENALTIES = {"frequency_penalty": 0, "presence_penalty": 0, "repetition_penalty": 1, "logit_bias": {}}


class InvalidParameter(ValueError):
    """A sampling parameter out of range or of the wrong type; `param` names it."""

    def __init__(self, param: str, message: str):
        super().__init__(message)
        self.param = param


def _number(value, integer: bool) -> bool:
    return not isinstance(value, bool) and isinstance(value, int if integer else (int, float))


@dataclass
class SamplingParams:
    max_new_tokens: int = 128
    temperature: float = 0.0        # 0 (below GREEDY_BELOW) means greedy
    top_k: int = 0                  # 0: no top-k filter
    top_p: float = 1.0
    seed: int | None = None         # sample j of n draws with seed + j
    stop: list[str] = field(default_factory=list)
    n: int = 1
    ignore_eos: bool = False
    logprobs: int | None = None     # report each token's log-probability and this many top alternatives
    frequency_penalty: float = 0.0  # lossless/penalties.py: logit -= f * count in the generated tokens
    presence_penalty: float = 0.0   # logit -= p once a token was generated
    repetition_penalty: float = 1.0  # logits of prompt and generated tokens divided (> 0) or multiplied by it
    logit_bias: dict[int, float] = field(default_factory=dict)     # token id -> added to its logit

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        for name, value in vars(self).items():          # numpy's scalars (np.int64(5), np.float32(0.5)) as Python's
            if isinstance(value, np.generic) and not isinstance(value, np.bool_):
                setattr(self, name, value.item())
        self.validate()

    def validate(self) -> None:
        """The one check of sampling parameters (the HTTP API turns its InvalidParameter into a 400)."""
        def need(ok: bool, param: str, message: str) -> None:
            if not ok:
                raise InvalidParameter(param, message)

        need(_number(self.max_new_tokens, True) and self.max_new_tokens > 0, "max_new_tokens",
             f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        need(_number(self.temperature, False) and math.isfinite(self.temperature) and self.temperature >= 0,
             "temperature", f"temperature must be a finite number >= 0, got {self.temperature!r}")
        need(_number(self.top_p, False) and 0 < self.top_p <= 1, "top_p",
             f"top_p must be in (0, 1], got {self.top_p!r}")
        need(_number(self.top_k, True) and self.top_k >= 0, "top_k", f"top_k must be an integer >= 0, got {self.top_k!r}")
        need(_number(self.n, True) and self.n >= 1, "n", f"n must be a positive integer, got {self.n!r}")
        need(self.seed is None or _number(self.seed, True) and -2 ** 63 <= self.seed < 2 ** 63, "seed",
             f"seed must be an integer in [-2**63, 2**63), got {self.seed!r}")
        need(self.logprobs is None or _number(self.logprobs, True) and 0 <= self.logprobs <= MAX_LOGPROBS, "logprobs",
             f"logprobs must be an integer from 0 to {MAX_LOGPROBS}, got {self.logprobs!r}")
        for name in ("frequency_penalty", "presence_penalty"):
            value = getattr(self, name)
            need(_number(value, False) and -2 <= value <= 2, name, f"{name} must be in [-2, 2], got {value!r}")
        r = self.repetition_penalty
        need(_number(r, False) and 0 < r <= 10, "repetition_penalty",
             f"repetition_penalty must be in (0, 10], got {r!r}")
        bias = self.logit_bias
        need(isinstance(bias, dict), "logit_bias", f"logit_bias must map token ids to biases, got "
             f"{type(bias).__name__}")
        need(len(bias) <= MAX_LOGIT_BIAS, "logit_bias", logit_bias_count(len(bias)))
        for k, v in bias.items():
            need(_number(k, True) and k >= 0, "logit_bias", f"logit_bias keys must be token ids (integers >= 0), "
                 f"got {k!r}")
            need(_number(v, False) and -100 <= v <= 100, "logit_bias", f"logit_bias[{k}] must be a number in "
                 f"[-100, 100], got {v!r}")
        need(isinstance(self.stop, list) and all(isinstance(s, str) and s for s in self.stop), "stop",
             f"stop must be a non-empty string or a list of them, got {self.stop!r}")
        need(isinstance(self.ignore_eos, bool), "ignore_eos", f"ignore_eos must be true or false, got "
             f"{self.ignore_eos!r}")

    @property
    def greedy(self) -> bool:
        """Temperature 0, or one below GREEDY_BELOW: sampling there is the argmax but at exact ties, and dividing
        the logits by it can overflow them (vLLM's convention too)."""
        return self.temperature < GREEDY_BELOW

    def job(self) -> dict:
        """What another rank samples or drafts with, as JSON (`from_job` reads it back; logit_bias as
        [id, bias] pairs, since JSON keys are strings)."""
        return {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p,
                "frequency_penalty": self.frequency_penalty, "presence_penalty": self.presence_penalty,
                "repetition_penalty": self.repetition_penalty, "logit_bias": list(self.logit_bias.items())}

    @classmethod
    def from_job(cls, job: dict) -> "SamplingParams":
        return cls(**job | {"logit_bias": dict(job["logit_bias"])})

    @property
    def penalties(self) -> list[str]:
        """The fields asking for penalties or a logit bias, which change the target's logits (lossless/penalties.py)."""
        return [name for name, neutral in NEUTRAL_PENALTIES.items() if getattr(self, name) != neutral]


def logit_bias_count(n: int) -> str:
    """The one message for a logit_bias over its bound (the server counts the entries before converting them)."""
    return f"logit_bias must map at most {MAX_LOGIT_BIAS} token ids, got {n}"


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
    microseconds, several times less than torch's argmax for the few rows of a decoding step. 16-bit logits
    are widened first (exact, so the same maximum): torch's argmax over bf16 took 0.13 ms for 7 rows of 8192."""
    if logits.device.type != "cpu":
        return logits.argmax(-1)
    if logits.dtype not in (torch.float32, torch.float64):
        logits = logits.float()
    return torch.as_tensor(np.asarray(logits.detach().numpy().argmax(-1)))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row from probs [..., V] -> [...]: the inverse CDF at one uniform draw a row, u in [0, total),
    the first token whose cumulative probability exceeds u (a token of probability 0 never does). torch's
    multinomial draws an exponential for every token of the vocabulary instead: a cost that grows with V."""
    cdf = probs.cumsum(-1)
    u = torch.rand(probs.shape[:-1] + (1,), generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[..., -1:]
    return torch.searchsorted(cdf, u, right=True).squeeze(-1).clamp_(max=probs.shape[-1] - 1)


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

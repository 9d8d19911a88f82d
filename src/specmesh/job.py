"""What a decoding method gets: the models and one generation job."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from specmesh.cache import KVCache
from specmesh.model import Transformer
from specmesh.sampling import SamplingParams
from specmesh.stats import Stats


@dataclass
class Models:
    target: Transformer
    draft: Transformer | None = None
    target_path: Path | None = None         # the target's checkpoint folder (holds its n-gram cache)
    remote: object | None = None            # the method's other processes: pearl's DraftPeer, a Pipeline

    def close(self) -> None:
        if self.remote is not None:
            self.remote.close()
            self.remote = None


@dataclass
class Job:
    prompt: list[int]
    params: SamplingParams
    generator: torch.Generator
    max_len: int                    # cache length: prompt + new tokens + the method's slack
    limit: int                      # tokens to generate at most (max_new_tokens within the context)
    rows: int = 1                   # independent samples decoded as one batch
    stats: Stats = field(default_factory=Stats)
    prefills: dict = field(default_factory=dict)     # (id(model), prompt) -> (prompt KV, last logits)

    def prefill(self, model: Transformer, cache: KVCache, tokens: list[int], role: str) -> torch.Tensor:
        """Run `tokens` into `cache` (committed) and return the logits after the last one, [rows, V].

        Samples decoded one after another share this work: later ones copy the prompt's KV.
        `role` ("target" or "draft") says which forward counter to charge.
        """
        key = (id(model), tuple(tokens))
        if key in self.prefills:
            kv, logits = self.prefills[key]
            cache.load_prefix(kv)
            return logits
        ids = torch.tensor([tokens] * cache.batch, device=model.device)
        logits = model(ids, cache, last_only=True)[:, -1]
        cache.commit_all()
        setattr(self.stats, f"{role}_forwards", getattr(self.stats, f"{role}_forwards") + 1)
        if self.rows < self.params.n:          # rows follow one another: keep the prompt for the next
            self.prefills[key] = (cache.prefix(), logits)
        return logits

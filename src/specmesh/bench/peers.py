"""Peers measured on the same checkpoints: HuggingFace transformers' own generate."""
from __future__ import annotations

import time
from pathlib import Path

import torch

from specmesh.stats import Stats


class HFRunner:
    """transformers `generate` (greedy) on our checkpoint; counts target forwards with a hook."""

    def __init__(self, target: Path, dtype: torch.dtype, device: str):
        try:
            from transformers import AutoModelForCausalLM
            from transformers.utils import logging
            logging.disable_progress_bar()
        except ImportError:
            raise ValueError("method 'hf' needs transformers: pip install -e .[peers]") from None
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
        self.device = device
        self.eos = self.model.config.eos_token_id
        self.forwards = 0
        self.model.register_forward_hook(self._count)

    def _count(self, *_):
        self.forwards += 1

    def __call__(self, ids: list[int], max_new_tokens: int) -> tuple[list[int], Stats]:
        self.forwards = 0
        x = torch.tensor([ids], device=self.device)
        start = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                      do_sample=False, eos_token_id=self.eos, pad_token_id=self.eos)
        elapsed = time.perf_counter() - start
        tokens = out[0, len(ids):].tolist()
        return tokens, Stats(target_forwards=self.forwards, generated_tokens=len(tokens), elapsed_s=elapsed)

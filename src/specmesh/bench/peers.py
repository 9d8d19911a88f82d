"""Peers measured on the same checkpoints: HuggingFace transformers' own generate.

hf           plain greedy `generate`
hf-assisted  assisted generation with our draft as `assistant_model`
hf-pld       prompt lookup decoding (`prompt_lookup_num_tokens`)
"""
from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path

import torch
from torch.nn.attention import sdpa_kernel

from specmesh.engine.stats import Stats
from specmesh.model.gguf import is_gguf
from specmesh.model.model import CUDA_ATTENTION

PEERS = ("hf", "hf-assisted", "hf-pld")
PLD_TOKENS = 10         # transformers' documented example value


def _auto_model(path: Path, dtype: torch.dtype, device: str):
    try:
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging
    except ImportError:
        raise ValueError("the hf peers need transformers: pip install -e .[peers]") from None
    logging.disable_progress_bar()
    if is_gguf(path):                       # transformers dequantizes it as specmesh does (needs accelerate)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


class HFRunner:
    """transformers `generate` (greedy); counts target forwards with a hook."""

    def __init__(self, kind: str, target: Path, draft: Path | None, dtype: torch.dtype, device: str):
        self.model = _auto_model(target, dtype, device)
        self.extra = {}
        if kind == "hf-assisted":
            self.extra["assistant_model"] = _auto_model(draft, dtype, device)
        elif kind == "hf-pld":
            self.extra["prompt_lookup_num_tokens"] = PLD_TOKENS
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
        # on CUDA the attention backends specmesh uses, so that neither side pays cuDNN's plan per key length
        with torch.inference_mode(), sdpa_kernel(CUDA_ATTENTION) if x.is_cuda else nullcontext():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new_tokens,
                                      do_sample=False, eos_token_id=self.eos, pad_token_id=self.eos, **self.extra)
        elapsed = time.perf_counter() - start
        tokens = out[0, len(ids):].tolist()
        return tokens, Stats(target_forwards=self.forwards, generated_tokens=len(tokens), elapsed_s=elapsed)

"""Measuring on this machine: a forward's time, and running with a given torch thread count."""
from __future__ import annotations

import time
from contextlib import contextmanager

import torch

from specmesh.cache import KVCache


@contextmanager
def torch_threads(n: int):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def forward_ms(model, tokens: int = 1, context: int = 128, reps: int = 20, layers: range | None = None) -> float:
    """Median time in ms of a forward of `tokens` new tokens after `context` cached ones through
    `layers` (default: all; random ids or hidden states, fixed seed; three untimed warm-ups)."""
    layers = layers or range(model.config.num_layers)
    gen = torch.Generator().manual_seed(0)
    if layers.start == 0:
        x = torch.randint(model.config.vocab_size, (1, context + tokens), generator=gen)
    else:
        x = torch.randn(1, context + tokens, model.config.hidden_size, generator=gen).to(model.dtype)
    x = x.to(model.device)
    cache = KVCache.for_model(model, 1, context + tokens, layers)
    times = []
    with torch.inference_mode():
        model(x[:, :context], cache, layers=layers)
        cache.commit_all()
        for _ in range(reps + 3):
            start = time.perf_counter()
            model(x[:, context:], cache, layers=layers)
            if model.device.type == "cuda":
                torch.cuda.synchronize(model.device)
            times.append(time.perf_counter() - start)
            cache.rollback(0, context)
    return sorted(times[3:])[reps // 2] * 1e3

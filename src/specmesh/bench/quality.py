"""What quantization costs in quality: held-out cross-entropy of the embedded target and draft in float32, in
bfloat16 and under each `--quant`, and how often each one's greedy next token is float32's.

    python -m specmesh.bench.quality [--windows 64]

The held-out text is the standard library's held-out files (corpus.is_heldout: never trained on), tokenized
and read in `--windows` windows of 1024 tokens spread evenly over it; each model reads them whole (no cache),
through the kernels it loads with on this CPU (docs/quantization.md).
"""
from __future__ import annotations

import argparse

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from specmesh import catalog
from specmesh.model.loader import load_model, load_tokenizer
from specmesh.model.quant import QUANTS
from specmesh.options import positive_int
from specmesh.training import corpus

CONTEXT = 1024
VARIANTS = [("float32", torch.float32, None), ("bfloat16", torch.bfloat16, None)] + \
    [(f"{q} (bf16 run)", torch.bfloat16, q) for q in QUANTS] + [(f"{q} dequantized, float32", torch.float32, q)
                                                                 for q in QUANTS]


def heldout_ids(tokenizer) -> np.ndarray:
    _, held = corpus.split(corpus.stdlib_sources())
    return np.array([t for _, text in held for t in tokenizer.encode(text)], dtype=np.int64)


@torch.inference_mode()
def cross_entropy(model, ids: np.ndarray, starts: np.ndarray) -> tuple[float, torch.Tensor]:
    """Mean cross-entropy (nats/token) over the windows, and the greedy next tokens [windows * CONTEXT]."""
    total, greedy = 0.0, []
    for s in starts:
        logits = model(torch.from_numpy(ids[s:s + CONTEXT])[None])[0].float()
        total += F.cross_entropy(logits, torch.from_numpy(ids[s + 1:s + CONTEXT + 1])).item()
        greedy.append(logits.argmax(-1))
    return total / len(starts), torch.cat(greedy)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m specmesh.bench.quality", description=__doc__.split("\n\n")[0])
    p.add_argument("--windows", type=positive_int, default=64, help="windows of 1024 held-out tokens (default 64)")
    args = p.parse_args(argv)
    ids = heldout_ids(load_tokenizer(catalog.resolve("embedded", "target")))
    starts = np.linspace(0, len(ids) - CONTEXT - 2, args.windows).astype(int)
    print(f"{len(ids)} held-out tokens, {args.windows} windows of {CONTEXT}")
    print(f"{'model':8s} {'weights':28s} {'nats/token':>10s} {'greedy = float32':>17s}")
    for role in ("target", "draft"):
        path, reference = catalog.resolve("embedded", role), None
        for name, dtype, quant in tqdm(VARIANTS, desc=role, leave=False):
            ce, greedy = cross_entropy(load_model(path, dtype, quant=quant), ids, starts)
            reference = greedy if reference is None else reference
            same = "-" if dtype == torch.float32 and quant is None else f"{(greedy == reference).float().mean():.2%}"
            tqdm.write(f"{role:8s} {name:28s} {ce:10.4f} {same:>17s}")


if __name__ == "__main__":
    main()

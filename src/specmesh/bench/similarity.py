"""How fuzzy EasySpec's layer-parallel groups are (its paper's cosine table): for a group of N layers starting
at layer i, how close each later layer's exact input h_{i+j} is to the group's input h_i that the group
feeds it, and how close the attention output it then computes is to the exact one.

Measured over whole token windows in one causal forward (every position of a window fuzzy at once), the
exact forward giving the inputs; averaged over windows, positions, group starts i and offsets 1 <= j < N.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specmesh.model.model import Transformer


@torch.inference_mode()
def layer_similarity(model: Transformer, windows: torch.Tensor, sizes: list[int]) -> dict[int, dict[str, float]]:
    """windows: token ids [B, T]. Per group size N: {"hidden": mean cos(h_{i+j}, h_i), "attention": mean
    cos(A_{i+j}(h_{i+j}), A_{i+j}(h_i))}."""
    B, T = windows.shape
    blocks = [getattr(b, "block", b) for b in model.layers]            # kernels wrap a Block
    h = model.embed(windows)
    cos, sin = model.rotary(torch.arange(T).expand(B, T), h.dtype)
    inputs = []                                                         # exact inputs h_0 .. h_{L-1}
    for block in blocks:
        inputs.append(h)
        h = block(h, cos, sin, None, None)

    def attention(layer: int, x: torch.Tensor) -> torch.Tensor:
        b = blocks[layer]
        return b.attn(b.attn_norm(x), cos, sin, None, None)

    def similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.cosine_similarity(a.float(), b.float(), dim=-1).mean()

    table = {}
    for n in sizes:
        pairs = [(i, j) for i in range(len(blocks) - n + 1) for j in range(1, n)]
        if not pairs:
            continue
        hidden = [similarity(inputs[i + j], inputs[i]) for i, j in pairs]
        attn = [similarity(attention(i + j, inputs[i + j]), attention(i + j, inputs[i])) for i, j in pairs]
        table[n] = {"hidden": torch.stack(hidden).mean().item(), "attention": torch.stack(attn).mean().item()}
    return table


def similarity_table(target: str | None, draft: str | None, prompts: str | None, limit: int | None,
                     sizes: tuple[int, ...] = (2, 3, 4), window: int = 128) -> dict:
    """`specmesh bench --layer-similarity`: the table for the draft (of `target`, unless given) on the bench's
    prompts, their tokens cut into windows of `window`."""
    from specmesh import catalog
    from specmesh.bench.prompts import load_prompts
    from specmesh.model.loader import load_model, load_tokenizer
    target_path = catalog.resolve(target)
    path = catalog.resolve(draft, "draft") if draft else catalog.draft_for(target_path)
    if path is None:
        raise ValueError(f"{target_path} has no draft here: pass --draft")
    tokenizer = load_tokenizer(path)
    ids = [t for p in load_prompts(prompts, limit, tokenizer) for t in tokenizer.encode(p)]
    n = len(ids) // window
    if n == 0:
        raise ValueError(f"the prompts hold {len(ids)} tokens, fewer than one window of {window}")
    model = load_model(path, pack=False)
    table = layer_similarity(model, torch.tensor(ids[:n * window]).view(n, window), list(sizes))
    return {"draft": str(path), "layers": model.config.num_layers, "windows": n, "window": window,
            "cosine": {str(k): v for k, v in table.items()}}


def print_similarity(result: dict, file=None) -> None:
    print(f"{result['draft']} ({result['layers']} layers), {result['windows']} windows of {result['window']} "
          f"tokens: mean cosine, group input vs exact", file=file)
    print("group size  hidden  attention output", file=file)
    for n, row in result["cosine"].items():
        print(f"{n:>10}  {row['hidden']:.3f}  {row['attention']:.3f}", file=file)

"""`--quant int8` and `--quant int4`: linear weights in blocks of 32 inputs with one float32 scale each, in the
spirit of GGUF's Q8_0 and Q4_0 (which keep an fp16 scale per 32 weights). int8: q = round(w / s) with
s = max |w| / 127 over the block; int4, Q4_0's rule: s = -m / 8 for m the block's weight of largest magnitude
(sign kept), q = round(w / s) clamped to -8..7, so m itself is -8 s exactly.

Lossless is defined against the model as loaded: a quantized model's linears hold the dequantized
weights q · s, which every path computes with (GPU, PyTorch, the bf16 and float32 kernels), except
where csrc/avx512.c's q8_linear / q4_linear run (kernels.Q8Linear: AVX512-VNNI without AMX): they keep the
quantized weights and their scales and quantize the activations to 8 bits per block of 32, as llama.cpp
computes Q8_0 and Q4_0 on CPU (docs/quantization.md). Either way every method of a run computes the same model.
The embedding table stays as it is (a lookup reads one row); the LM head is quantized (untied from the embedding
when they were one tensor). `keep_blocks`: a GGUF file's own Q8_0 / Q4_0 / Q4_1 blocks, taken as they are.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from specmesh.options import QUANTS  # noqa: F401  (name -> bits: declared with the CLI's options)

BLOCK = 32


def quantize_q8(weight: torch.Tensor, bits: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> q [N, K] (int8 holding -127..127, or -8..7 for 4 bits) and float32 scales [N, ceil(K / 32)]
    (K padded with zeros to whole blocks)."""
    N, K = weight.shape
    KB = -(-K // BLOCK)
    w = F.pad(weight.detach().float(), (0, KB * BLOCK - K)).view(N, KB, BLOCK)
    tiny = torch.finfo(torch.float32).tiny
    if bits == 8:
        scale = (w.abs().amax(-1) / 127).clamp_min(tiny)
        q = torch.round(w / scale[..., None]).clamp(-127, 127)
    else:
        extreme = w.gather(-1, w.abs().argmax(-1, keepdim=True))[..., 0]             # signed
        scale = torch.where(extreme.abs() < tiny, torch.full_like(extreme, tiny), -extreme / 8)
        q = torch.round(w / scale[..., None]).clamp(-8, 7)
    return q.to(torch.int8).view(N, KB * BLOCK)[:, :K].contiguous(), scale


def dequantize_q8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] and scales [N, KB] -> float32 [N, K]: q · s."""
    N, K = q.shape
    w = F.pad(q.float(), (0, scale.shape[1] * BLOCK - K)).view(N, -1, BLOCK) * scale[..., None]
    return w.view(N, -1)[:, :K]


def quantize_model(model: nn.Module, quant: str) -> None:
    """Quantize every linear of `model` in place: its weight becomes q · s (float32) and `linear.quantized`
    keeps (q, s, bits, offset) for the kernels (offset: a GGUF Q4_1 file's per-block term, keep_blocks; None here)."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join(QUANTS)}")
    for linear in (m for m in model.modules() if isinstance(m, nn.Linear)):
        q, scale = quantize_q8(linear.weight, QUANTS[quant])
        linear.weight = nn.Parameter(dequantize_q8(q, scale), requires_grad=False)   # unties a tied head
        linear.quantized = (q, scale, QUANTS[quant], None)


def keep_blocks(model: nn.Module, names: dict[str, list[str]], blocks: dict) -> None:
    """A GGUF file's Q8_0 / Q4_0 / Q4_1 matrices as they are (gguf.Blocks, by HF name), for the kernels that multiply
    them (kernels.Q8Linear): each linear's `quantized` from its parts' blocks (`names`: the loader's name_map, ours
    -> HF parts; a tied head reads the embedding's). The caller has checked that the layers' matrices are all of one
    format (loader.runs_blocks: the C forward runs a layer's products in one kind); the head keeps its blocks where
    it has some (of any of them) that cover it. Their weights are already those blocks dequantized
    (gguf.read_weights)."""
    parts_of = names | ({"lm_head.weight": names["embed.weight"]} if "lm_head.weight" not in names else {})
    for module_name, linear in model.named_modules():
        got = [blocks.get(p) for p in parts_of.get(f"{module_name}.weight", [])]
        if not isinstance(linear, nn.Linear) or not got or any(b is None for b in got) \
                or len({b.kind for b in got}) > 1 or sum(b.q.shape[0] for b in got) != linear.weight.shape[0]:
            continue
        offset = None if got[0].m is None else torch.cat([b.m for b in got])
        linear.quantized = (torch.cat([b.q for b in got]), torch.cat([b.d for b in got]), got[0].bits, offset)

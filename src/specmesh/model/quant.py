"""`--quant int8`: linear weights in blocks of 32 inputs with one float32 scale each, in the spirit of
GGUF's Q8_0 (which keeps an fp16 scale per 32 weights): q = round(w / s), s = max |w| / 127 over the block.

Lossless is defined against the model as loaded: a quantized model's linears hold the dequantized
weights q · s, which every path computes with (GPU, PyTorch, the bf16 and float32 kernels), except
where csrc/avx512.c's q8_linear runs (kernels.Q8Linear: AVX512-VNNI without AMX): it keeps the int8
weights and their scales and quantizes the activations the same way, as llama.cpp computes Q8_0 on
CPU (docs/quantization.md). Either way every method of a run computes the same model. The embedding
table stays as it is (a lookup reads one row); the LM head is quantized (untied from the embedding
when they were one tensor).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

BLOCK = 32
QUANTS = ("int8",)


def quantize_q8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] -> int8 q [N, K] and float32 scales [N, ceil(K / 32)] (K padded with zeros to whole blocks)."""
    N, K = weight.shape
    KB = -(-K // BLOCK)
    w = F.pad(weight.detach().float(), (0, KB * BLOCK - K)).view(N, KB, BLOCK)
    scale = (w.abs().amax(-1) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.round(w / scale[..., None]).clamp(-127, 127).to(torch.int8)
    return q.view(N, KB * BLOCK)[:, :K].contiguous(), scale


def dequantize_q8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """int8 [N, K] and scales [N, KB] -> float32 [N, K]: q · s."""
    N, K = q.shape
    w = F.pad(q.float(), (0, scale.shape[1] * BLOCK - K)).view(N, -1, BLOCK) * scale[..., None]
    return w.view(N, -1)[:, :K]


def quantize_model(model: nn.Module, quant: str) -> None:
    """Quantize every linear of `model` in place: its weight becomes q · s (float32) and `linear.q8` keeps
    (q, s) for the kernels."""
    if quant not in QUANTS:
        raise ValueError(f"unknown quantization {quant!r}; choose from {', '.join(QUANTS)}")
    for linear in (m for m in model.modules() if isinstance(m, nn.Linear)):
        q, scale = quantize_q8(linear.weight)
        linear.weight = nn.Parameter(dequantize_q8(q, scale), requires_grad=False)   # unties a tied head
        linear.q8 = (q, scale)

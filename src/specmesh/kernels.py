"""CPU kernel choices.

On x86 CPUs with AVX-512 bf16 / AMX, oneDNN's linear with a weight pre-packed into
its blocked layout runs a bfloat16 matrix-vector product about 1.5-2x faster than
the default bf16 path, and wide (tree) inputs cost little more than one row. Plain
decoding is memory-bound, so this is where small models win time. Packing changes
only the kernel, not the math; float32 keeps the default kernels (bit-exact
reference).

Attention is the other way round: the CPU flash-attention kernel in bfloat16 is 2-5x
slower than in float32 for the few-query shapes of decoding and verification (151 vs
35 us for one query over 210 keys), so on CPU a bfloat16 model keeps its KV cache,
and attends, in float32.
"""
from __future__ import annotations

import torch
from torch import nn


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    return (device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()
            and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def cache_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The KV cache (and attention) dtype for a model of `dtype` on `device`."""
    return torch.float32 if device.type == "cpu" and dtype == torch.bfloat16 else dtype


class PackedLinear(nn.Module):
    """nn.Linear with its weight reordered once for oneDNN (CPU, bfloat16, inference only)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), 1),
                             persistent=False)
        self.bias = None if linear.bias is None else linear.bias.detach()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(-1, self.in_features), self.packed, self.bias,
                                                 "none", [], "")
        return out.view(*x.shape[:-1], self.out_features)


def pack_linears(model: nn.Module) -> nn.Module:
    """Replace every nn.Linear in `model` by a PackedLinear (in place)."""
    for name, child in model.named_children():
        if isinstance(child, nn.Linear):
            setattr(model, name, PackedLinear(child))
        else:
            pack_linears(child)
    return model

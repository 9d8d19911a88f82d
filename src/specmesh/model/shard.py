"""A model's tensor-parallel shard (Megatron-LM's split, Shoeybi et al. 2019): rank r of `world` keeps the
attention heads [r H/w, (r+1) H/w) with their kv heads, the matching columns of the output projection, and
the MLP's intermediate columns [r I/w, (r+1) I/w) of gate and up with the matching columns of down. A
shard's attention and MLP then give its part of the output, and the parts summed over the ranks are the
whole (Block.all_reduce, runtime/tensor_parallel.py): one sum after the attention, one after the MLP.
Output biases stay on rank 0, so they are added once; norms and the embedding are whole on every rank;
the LM head only on rank 0 (the others keep one row: the C forward's shape, at no cost).
"""
from __future__ import annotations

import dataclasses

import torch
from torch import nn

from specmesh.model.model import ModelConfig, Transformer


def check_shards(cfg: ModelConfig, world: int) -> None:
    """A clear error before any process starts when the model does not split `world` ways."""
    if world < 1:
        raise ValueError(f"--tp must be a positive number of processes, got {world}")
    sizes = {"attention heads": cfg.num_heads, "kv heads": cfg.num_kv_heads, "MLP width": cfg.intermediate_size}
    bad = [f"{n} {name}" for name, n in sizes.items() if n % world]
    if bad:
        raise ValueError(f"cannot split the model over {world} tensor-parallel ranks: {', '.join(bad)} "
                         f"do not divide by {world}")


def shard(model: Transformer, rank: int, world: int) -> Transformer:
    """Keep rank's shard of `model` (in place, on plain nn.Linear layers: before kernels or quantization);
    model.config then describes the shard (its heads and MLP width)."""
    cfg = model.config
    check_shards(cfg, world)
    H, Hkv, hd, I = cfg.num_heads // world, cfg.num_kv_heads // world, cfg.head_dim, cfg.intermediate_size // world
    q = torch.arange(rank * H * hd, (rank + 1) * H * hd)                  # this rank's rows of each part
    kv = torch.arange(rank * Hkv * hd, (rank + 1) * Hkv * hd)
    mlp = torch.arange(rank * I, (rank + 1) * I)
    qkv_rows = torch.cat([q, cfg.num_heads * hd + kv, (cfg.num_heads + cfg.num_kv_heads) * hd + kv])
    for block in model.layers:
        attn, ffn = block.attn, block.mlp
        keep_rows(attn.qkv, qkv_rows)
        keep_columns(attn.o, q, rank)
        keep_rows(ffn.gate_up, torch.cat([mlp, cfg.intermediate_size + mlp]))
        keep_columns(ffn.down, mlp, rank)
        attn.h, attn.hkv = H, Hkv
    if rank > 0:
        drop_head(model)
    model.config = dataclasses.replace(cfg, num_heads=H, num_kv_heads=Hkv, intermediate_size=I)
    return model


def drop_head(model: Transformer) -> Transformer:
    """Keep one row of the LM head, for a rank other than 0 (rank 0 alone computes logits): the forward keeps
    its shape and costs nothing more."""
    head = nn.Linear(model.config.hidden_size, 1, bias=False, device=model.device, dtype=model.dtype)
    head.weight = nn.Parameter(model.lm_head.weight.detach()[:1].clone())
    model.lm_head, model.head_ids = head, None
    return model


def keep_rows(linear: nn.Linear, rows: torch.Tensor) -> None:
    """Output features `rows` of a linear (and of its bias)."""
    linear.weight = nn.Parameter(linear.weight.detach()[rows].clone())
    if linear.bias is not None:
        linear.bias = nn.Parameter(linear.bias.detach()[rows].clone())
    linear.out_features = len(rows)


def keep_columns(linear: nn.Linear, columns: torch.Tensor, rank: int) -> None:
    """Input features `columns` of a linear; its bias on rank 0 only (the parts are summed)."""
    linear.weight = nn.Parameter(linear.weight.detach()[:, columns].clone())
    if linear.bias is not None and rank > 0:
        linear.bias = None
    linear.in_features = len(columns)

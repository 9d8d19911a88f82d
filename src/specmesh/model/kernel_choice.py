"""Which kernels a loaded model runs: chosen in one place (select_kernels), when a model is loaded, the same
for `LLM` and the server."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from specmesh.kernels.build import LayerWeights, amx_lib, kernel_lib, avx512_on, dp_lib, fma_lib, native_bf16, q8_lib
from specmesh.kernels.linears import (AMXLinear, BF16Linear, DPLinear, F32Linear, FMALinear, Int8Linear, PackedLinear,
                                      Q8Linear, can_pack, glu_order)
from specmesh.model.c_forward import CBlock, CForward, CRMSNorm
from specmesh.model.graph_forward import GraphForward
from specmesh.model.model import MLP, Block, RMSNorm, Transformer
from specmesh.model.pages import on_huge_pages
from specmesh.settings import settings


def use_cpu_kernels(model: nn.Module, draft: bool = False) -> nn.Module:
    """Put this CPU's bf16 kernels in place (in place): ours wherever csrc/avx2.c builds, else
    oneDNN's pre-packed bf16 linears on CPUs with native bf16, else BF16Linear's PyTorch paths."""
    if kernel_lib() is None and native_bf16():
        _replace(model, nn.Linear, PackedLinear)
        return model
    # a draft's int8 weights halve one row's bytes, but its bf16 weights fit in the L3 anyway, and on the bf16 dot
    # product (DPLinear) or on FMA over the same layout (FMALinear) its 3-8 rows (tree levels, catch-up reads) cost
    # a half to two thirds of Int8Linear's, and one row the same or less (docs/kernels.md)
    return use_c_kernels(model, int8=draft and dp_lib() is None and fma_lib() is None)


def bf16_products() -> str:
    """What multiplies a bf16 model's linears on this CPU (use_c_kernels' choice), for benchmark reports."""
    if amx_lib() is not None:
        return "AMX tiles"
    if dp_lib() is not None:
        return "the AVX512-BF16 dot product"
    if (fma := fma_lib()) is not None:
        return "512-bit FMA" if avx512_on(fma) else "256-bit FMA"
    return "PyTorch (oneDNN)" if native_bf16() else "PyTorch"


def draft_quant(dtype: torch.dtype, device: torch.device | str) -> str | None:
    """How a draft is held on this machine where the caller quantizes nothing: in Q4_0 blocks (`--quant int4`,
    Q8Linear's products) on CPUs without AMX (AVX2, or AVX512-VNNI beside the bf16 dot product). A draft's forward
    streams its weights (the target's forward between two steps pushes them out of the cache), so a quarter of the
    bytes cut `sd`'s drafting for the same τ (docs/kernels.md); a draft's guesses need not be exact. With AMX
    as loaded."""
    return "int4" if dtype == torch.bfloat16 and torch.device(device).type == "cpu" and q8_lib() is not None else None


def use_c_kernels(model: nn.Module, int8: bool = False, glu: bool = True) -> nn.Module:
    """bf16 linear weights (int8 with `int8`: draft models), float32 everywhere else, C norms
    and blocks where they build (in place); without AMX, products on the AVX512-BF16 dot product where the
    CPU has it, else on FMA over the same layout (`--quant` models: Q8_0 / Q4_0 / Q4_1 products on AVX512-VNNI
    or AVX2, Q8Linear; a GGUF file's such blocks too, on VNNI: loader.runs_blocks). With AMX, MLPs whose width is
    a multiple of 32 apply SwiGLU in the gate/up product (amx_glu; `glu=False`: product, then SwiGLU: the same
    values)."""
    if (amx := amx_lib()) is not None and not int8:
        for mlp in (m for m in model.modules() if glu and isinstance(m, MLP) and isinstance(m.gate_up, nn.Linear)
                    and m.down.in_features % 32 == 0):      # (a GGUF file's matrices stay as they are)
            mlp.gate_up = AMXLinear(mlp.gate_up.weight, mlp.gate_up.bias, amx, glu_order(mlp.down.in_features))
        _replace(model, nn.Linear, lambda linear: AMXLinear(linear.weight, linear.bias, amx))
    else:
        _replace(model, nn.Linear, BF16Linear)
    model.float()                               # the linears' bf16 weights are no parameters: they stay
    if (lib := kernel_lib()) is not None:
        dp, fma, q8 = dp_lib(), fma_lib(), q8_lib()
        bf16 = (lambda linear: DPLinear(linear, dp)) if dp is not None else \
            (lambda linear: FMALinear(linear, fma)) if fma is not None else (lambda linear: linear)
        if q8 is not None and any(m.quantized is not None for m in model.modules() if isinstance(m, BF16Linear)):
            # --quant int8 / int4, a GGUF file's blocks (a head without them: in bf16)
            _replace(model, BF16Linear, lambda linear: Q8Linear(linear, q8) if linear.quantized is not None else bf16(linear))
        elif int8:
            _replace(model, BF16Linear, lambda linear: Int8Linear(linear, lib))
        else:
            _replace(model, BF16Linear, bf16)
        on_huge_pages(model)                    # before the C blocks take the weights' addresses
        _replace(model, RMSNorm, lambda norm: CRMSNorm(norm, lib))
        if runs_whole_in_c(model):
            _replace(model, Block, lambda block: CBlock(block, getattr(model, "config", None)))
            if isinstance(model, Transformer):     # (not a bare module of linears)
                # the cache in bf16, half the bytes for a batch's attention to read (CForward reads it)
                model.run_on(replace(model.execution, kv_dtype=torch.bfloat16))
                model.run_on(replace(model.execution, fast=CForward(model, lib)))
    if native_bf16():                           # prefills attend in bf16, faster (docs/kernels.md)
        for attn in (m for m in model.modules() if hasattr(m, "prefill_dtype")):
            attn.prefill_dtype = torch.bfloat16
    return model


def use_batch_invariant_kernels(model: nn.Module) -> bool:
    """float32 models on x86 CPUs: few-row forwards (decode steps of up to SMALL_ROWS sequences) through
    csrc/avx2.c, so a sequence's logits do not depend on what else is in its batch (the server).
    Returns whether the kernels could be put in place."""
    lib = kernel_lib()
    already = any(isinstance(m, (BF16Linear, DPLinear, PackedLinear, CBlock)) for m in model.modules())   # a bf16 model
    if lib is None or already or model.dtype != torch.float32 or model.device.type != "cpu":
        return False
    _replace(model, nn.Linear, lambda linear: F32Linear(linear, lib))
    on_huge_pages(model)
    _replace(model, RMSNorm, lambda norm: CRMSNorm(norm, lib))
    if runs_whole_in_c(model):
        _replace(model, Block, lambda block: CBlock(block, getattr(model, "config", None)))
        model.run_on(replace(model.execution, fast=CForward(model, lib)))
    return True


def runs_whole_in_c(model: nn.Module) -> bool:
    """Whether csrc/ runs the model's blocks and forward whole (CBlock, CForward): the Llama block, and what Qwen3
    and Gemma 3 add to it (q/k norms, (1 + w) norms, post-norms, a GELU gate, scaled embeddings, sliding layers);
    not an attention scale other than 1 / sqrt(head_dim) or soft-capped logits, whose blocks run in PyTorch around
    the kernels' linears."""
    cfg = getattr(model, "config", None)
    return cfg is None or cfg.plain_block or (cfg.query_pre_attn_scalar in (None, cfg.head_dim)
                                              and cfg.final_logit_softcapping is None
                                              and cfg.hidden_act in LayerWeights.ACTIVATIONS)


def select_kernels(model: nn.Module, draft: bool = False) -> nn.Module:
    """The one place kernels are chosen for a loaded model (in place): on CPU, bf16 models get this CPU's
    bf16 kernels (use_cpu_kernels) and float32 ones the batch-invariant float32 kernels, so that a
    sequence's logits do not depend on the other rows of its batch (use_batch_invariant_kernels). On CUDA, with
    SPECMESH_KERNELS=cuda-graphs, forwards of decoding's and verification's widths replay CUDA graphs
    (GraphForward: not yet the default, docs/gpu.md)."""
    if model.device.type == "cuda" and settings().kernel("cuda-graphs"):
        model.run_on(replace(model.execution, fast=GraphForward(model)))
    if model.device.type != "cpu":
        return model
    if can_pack(model.dtype, model.device):
        return use_cpu_kernels(model, draft)
    use_batch_invariant_kernels(model)
    return model


def _replace(module: nn.Module, kind: type[nn.Module], make) -> None:
    for name, child in module.named_children():
        if isinstance(child, kind):
            setattr(module, name, make(child))
        else:
            _replace(child, kind, make)

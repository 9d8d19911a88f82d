"""CPU kernel choices for bfloat16 models.

A small model's decode step on CPU is mostly per-op overhead and weight traffic, and
PyTorch's bf16 product on CPUs without native bf16 costs a full pass over the weights per
input row (a 5-token verification 4.6x one token). So wherever gcc can build csrc/ (x86 with
AVX2) specmesh runs its own kernels:

* csrc/avx2.c: a bf16 product that reads the weights once for up to 6 rows (BF16Linear;
  int8 weights with a scale per row for drafts, Int8Linear), RMSNorm (CRMSNorm), and a whole
  small forward in one call (CForward: embedding, rotary angles, every decoder layer, final
  norm and head for up to SMALL_ROWS new tokens), which cut a draft forward from 2.9 to 0.7 ms
  on an AVX2 machine.
* csrc/avx512.c, where the CPU has AVX-512: attention and int8 products twice as wide; and
  where it also has AMX (Intel Sapphire Rapids on): AMXLinear, a bf16 tile product for every
  linear, in which 1 to 16 rows cost one pass over the weights (target forward over 300
  cached tokens: 1.5 ms for 1 new token, 1.6 for 5, 2.2 for 16, where the AVX2 kernel took
  2.1, 4.2 and 12.3), and a prefill's causal attention on the tiles (amx_attention).
* longer forwards (prefills) run each layer's products, norms, rotary and cache writes in C
  too (CForward._long), with PyTorch's flash attention or amx_attention between them: a
  380-token prefill 26 -> 15-16 ms (with SwiGLU in the gate/up product: amx_glu).
* elsewhere, CPUs with native bf16 use oneDNN's linear with the bf16 weight pre-packed
  (PackedLinear), and the rest BF16Linear's PyTorch paths.

Such a model keeps only its linear weights in bf16 (int8 for drafts) and computes in float32
between them (embedding, norms, residual stream, attention: the CPU flash-attention kernel in
bf16 is 2-5x slower than in float32 for decoding's few queries; prefills of more than 64
tokens attend in bf16 where the CPU has it, 2-3x faster). Its KV cache holds bf16 where the C
forward runs (keys and values rounded to nearest even as they are written, widened exactly
as they are read): a batch of 8 sequences' decode step reads as many bytes of cache as of
weights, and half as many in bf16. Every kernel computes a row the same way whatever the
number of rows, and the attention depends only on the keys a query
sees (not on where masked keys sit), so a token's logits are bit for bit the same in a
1-token `ar` step, in a 5-token verification and as a node of a tree (tests/test_kernels.py):
that is why the bf16 outputs of every method equal `ar`'s. Draft models (load_model(...,
draft=True)) hold int8 weights: half the bytes, and a draft's guesses need not be exact.

float32 models keep PyTorch's default kernels (the bit-exact reference), except in the
server, which puts float32 versions of the C kernels in place for batch invariance.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


SMALL_ROWS = 16     # AVX2: up to this many rows the C kernel beats the packed float32 copy
GEMV_ROWS = 3       # without the C kernel: up to this many rows PyTorch's bf16 product beats it
SOURCE = Path(__file__).parent / "csrc" / "avx2.c"
AVX512_SOURCE = Path(__file__).parent / "csrc" / "avx512.c"


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


def native_bf16() -> bool:
    return torch.ops.mkldnn._is_mkldnn_bf16_supported()


def cache_dtype(model: nn.Module) -> torch.dtype:
    """The KV cache dtype of a model: set by use_avx2_kernels (kv_dtype), else float32 for a bf16
    model on CPU (PyTorch's attention), else the model's."""
    if getattr(model, "kv_dtype", None) is not None:
        return model.kv_dtype
    return torch.float32 if model.device.type == "cpu" and model.dtype == torch.bfloat16 else model.dtype


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


@functools.cache
def avx2_lib() -> ctypes.CDLL | None:
    """csrc/avx2.c (and csrc/avx512.c where gcc can build it) compiled for this machine (cached by
    source hash), or None where it cannot be. Where the CPU has AVX-512 its attention and int8
    products are switched on from the start (SPECMESH_AVX512=0 keeps AVX2's, to compare), so a
    process computes every forward the same way.

    It links PyTorch's own libgomp, so the kernel shares PyTorch's OpenMP threads
    (torch.set_num_threads applies to it)."""
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512") or shutil.which("gcc") is None:
        return None
    sources = [SOURCE.read_bytes(), AVX512_SOURCE.read_bytes()]
    cache = Path(os.environ.get("SPECMESH_CACHE", Path.home() / ".cache" / "specmesh"))
    lib = cache / f"avx2-{hashlib.sha256(b''.join(sources)).hexdigest()[:16]}.so"
    if not lib.exists():
        torch_lib = Path(torch.__file__).parent / "lib"
        omp = ["-fopenmp", f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}", "-lgomp"] \
            if (torch_lib / "libgomp.so.1").exists() else []
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            out = Path(tmp) / lib.name
            for files in ([SOURCE, AVX512_SOURCE], [SOURCE]):    # without avx512.c where gcc is too old for it
                build = subprocess.run(["gcc", "-O3", "-mavx2", "-mfma", "-shared", "-fPIC", *map(str, files),
                                        "-o", str(out), *omp, "-lm"], capture_output=True, text=True)
                if build.returncode == 0:
                    break
            else:
                warnings.warn(f"could not build the AVX2 kernels, using PyTorch's: {build.stderr[-500:]}")
                return None
            out.replace(lib)                        # atomic: concurrent processes never see half a file
    kernel = ctypes.CDLL(str(lib))
    kernel.bf16_linear.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                                   ctypes.c_void_p, ctypes.c_void_p]
    kernel.bf16_linear.restype = None
    kernel.i8_linear.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                 ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    kernel.i8_linear.restype = None
    kernel.rms_norm.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_float,
                                ctypes.c_void_p]
    kernel.rms_norm.restype = None
    kernel.f32_linear.argtypes = kernel.bf16_linear.argtypes
    kernel.f32_linear.restype = None
    kernel.model_forward.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int64, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    kernel.model_forward.restype = None
    kernel.block_qkv.argtypes = [ctypes.POINTER(LayerWeights), ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                 ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int64,
                                 ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p]
    kernel.block_qkv.restype = None
    kernel.block_out.argtypes = [ctypes.POINTER(LayerWeights), ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
    kernel.block_out.restype = None
    kernel.rotary_tables.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
                                     ctypes.c_void_p]
    kernel.rotary_tables.restype = None
    if hasattr(kernel, "amx_init"):
        kernel.amx_linear.argtypes = kernel.bf16_linear.argtypes
        kernel.amx_linear.restype = None
        kernel.amx_attention.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + \
            [ctypes.c_int] * 5 + [ctypes.c_void_p]
        kernel.amx_attention.restype = None
        if AVX512 <= cpu_flags() and os.environ.get("SPECMESH_AVX512", "1") != "0":
            kernel.use_avx512(1)
    return kernel


AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl"}
AMX = AVX512 | {"amx_tile", "amx_bf16", "avx512_bf16"}


@functools.cache
def cpu_flags() -> set[str]:
    """The CPU's feature flags (Linux), or none where they cannot be read."""
    try:
        return set(Path("/proc/cpuinfo").read_text().split())
    except OSError:
        return set()


@functools.cache
def amx_lib() -> ctypes.CDLL | None:
    """The kernel library where this CPU has AMX with bf16 tiles (and AVX-512) and Linux lends the
    tile registers to this process, else None. SPECMESH_AMX=0 turns it off (to compare)."""
    lib = avx2_lib()
    if lib is None or not hasattr(lib, "amx_init") or os.environ.get("SPECMESH_AMX", "1") == "0" \
            or os.environ.get("SPECMESH_AVX512", "1") == "0" or not AMX <= cpu_flags():
        return None
    return lib if lib.amx_init() == 0 else None


class LayerWeights(ctypes.Structure):
    """csrc/avx2.c's Layer: a decoder layer's sizes and weight pointers."""
    _fields_ = [(n, ctypes.c_int) for n in ("D", "H", "Hkv", "hd", "I", "kind", "glu")] + [("eps", ctypes.c_float)] + [
        (n, ctypes.c_void_p) for n in ("attn_norm", "mlp_norm", "qkv", "o", "gate_up", "down",
                                       "qkv_s", "o_s", "gate_up_s", "down_s", "qkv_b", "o_b", "gate_up_b", "down_b")]


class BF16Linear(nn.Module):
    """A bf16 nn.Linear computing in float32, few rows through csrc/avx2.c (see the module docstring)."""
    KIND = 0                                    # csrc/avx2.c's weight kind

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach().contiguous()                     # [N, K] bf16
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.bias32 = None if self.bias is None else self.bias.float()
        self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(self.weight.float(), 1),
                             persistent=False)
        self.kernel = avx2_lib()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.kernel is None and rows <= GEMV_ROWS:                          # PyTorch's bf16 gemv
            return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)
        flat = x.reshape(rows, self.in_features).float()
        out = self._small(flat) if self.kernel is not None and rows <= SMALL_ROWS else self._large(flat)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _large(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias32, "none", [], "")

    def _small(self, x: torch.Tensor) -> torch.Tensor:
        """[M, K] float32 -> [M, N] float32 through the C kernel (which reads x densely)."""
        x = x.contiguous()
        y = torch.empty(x.shape[0], self.out_features)
        self.kernel.bf16_linear(x.data_ptr(), x.shape[0], self.in_features, self.weight.data_ptr(),
                                self.out_features, None if self.bias32 is None else self.bias32.data_ptr(),
                                y.data_ptr())
        return y


class Int8Linear(BF16Linear):
    """A linear with int8 weights and a float32 scale per output row (symmetric, rounded to
    nearest): half the bytes of BF16Linear, for draft models, whose guesses need not be exact.
    Up to SMALL_ROWS rows go through the C kernel, more (a prefill) through the dequantized weight:
    in bf16 tiles where the CPU has AMX, else in float32."""
    KIND = 1

    def __init__(self, linear: BF16Linear, kernel: ctypes.CDLL):
        nn.Module.__init__(self)
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        w = linear.weight.float()
        self.scale = (w.abs().amax(1) / 127).clamp_min(torch.finfo(torch.float32).tiny)        # [N]
        self.weight = torch.round(w / self.scale[:, None]).to(torch.int8).contiguous()         # [N, K]
        self.bias, self.bias32 = linear.bias, linear.bias32
        dequantized = self.weight.float() * self.scale[:, None]
        amx = amx_lib()
        self.tiles = None if amx is None else AMXLinear(dequantized, self.bias32, amx)
        if amx is None:
            self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(dequantized, 1), persistent=False)

    def _large(self, x: torch.Tensor) -> torch.Tensor:
        return super()._large(x) if self.tiles is None else self.tiles(x)

    def _small(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty(x.shape[0], self.out_features)
        self.kernel.i8_linear(x.data_ptr(), x.shape[0], self.in_features, self.weight.data_ptr(), self.scale.data_ptr(),
                              self.out_features, None if self.bias32 is None else self.bias32.data_ptr(), y.data_ptr())
        return y


def amx_pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] weight -> bf16 tiles for csrc/avx512.c: [G, KB, 4, 16, 16, 2], padded with zeros to
    G = ceil(N / 64) groups of 64 output columns and KB = ceil(K / 32) blocks of 32 inputs; tile
    (g, kb, c) row r holds w[64 g + 16 c + j, 32 kb + 2 r + e] at [j, e]."""
    N, K = weight.shape
    G, KB = -(-N // 64), -(-K // 32)
    w = F.pad(weight.to(torch.bfloat16), (0, KB * 32 - K, 0, G * 64 - N))
    return w.view(G, 4, 16, KB, 16, 2).permute(0, 3, 1, 4, 2, 5).contiguous()


def glu_order(I: int) -> torch.Tensor:
    """Rows of a [gate | up] weight (2I rows) in the order csrc/avx512.c's amx_glu reads them: per
    group of 64, 32 gate rows and then the 32 matching up rows."""
    gate = torch.arange(I).view(I // 32, 32)
    return torch.cat([gate, gate + I], 1).flatten()


class AMXLinear(nn.Module):
    """A bf16 nn.Linear through csrc/avx512.c's tile product for every row count: 1 to 16 rows cost one
    pass over the weights, and a row's result does not depend on the others. `order`: the weight's
    rows are packed in this order (glu_order); forward returns the columns in their own order."""
    KIND = 3                                    # csrc/avx2.c's weight kind

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, kernel: ctypes.CDLL,
                 order: torch.Tensor | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.kernel = kernel
        weight, bias = weight.detach(), None if bias is None else bias.detach().float()
        if order is not None:
            weight, bias = weight[order], None if bias is None else bias[order]
        self.order = None if order is None else torch.argsort(order)     # packed column -> own column
        self.weight, self.bias32 = amx_pack(weight), bias

    @property
    def glu(self) -> bool:
        """Packed for csrc/avx512.c's amx_glu (glu_order)."""
        return self.order is not None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        flat = x.reshape(rows, self.in_features).float().contiguous()
        y = torch.empty(rows, self.out_features)
        self.kernel.amx_linear(flat.data_ptr(), rows, self.in_features, self.weight.data_ptr(), self.out_features,
                               _ptr(self.bias32), y.data_ptr())
        if self.order is not None:
            y = y[:, self.order]
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)


class F32Linear(nn.Module):
    """A float32 nn.Linear whose few-row products (up to SMALL_ROWS) go through csrc/avx2.c, where a
    row's result does not depend on how many rows share the product (BLAS's does, in the last
    bits): for batch-invariant serving. More rows (a prefill, which runs alone) go through BLAS."""
    KIND = 2

    def __init__(self, linear: nn.Linear, kernel: ctypes.CDLL):
        super().__init__()
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        self.weight = linear.weight.detach().float().contiguous()                  # [N, K]
        self.bias32 = None if linear.bias is None else linear.bias.detach().float()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > SMALL_ROWS:
            return F.linear(x, self.weight, self.bias32)
        flat = x.reshape(rows, self.in_features).float().contiguous()
        y = torch.empty(rows, self.out_features)
        self.kernel.f32_linear(flat.data_ptr(), rows, self.in_features, self.weight.data_ptr(), self.out_features,
                               None if self.bias32 is None else self.bias32.data_ptr(), y.data_ptr())
        return y.view(*x.shape[:-1], self.out_features)


class CRMSNorm(nn.Module):
    """model.RMSNorm on float32 activations through the C kernel."""

    def __init__(self, norm: nn.Module, kernel: ctypes.CDLL):
        super().__init__()
        self.weight, self.eps, self.kernel = norm.weight, float(norm.eps), kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty_like(x)
        self.kernel.rms_norm(x.data_ptr(), x.numel() // x.shape[-1], x.shape[-1], self.weight.data_ptr(), self.eps,
                             y.data_ptr())
        return y


class CBlock(nn.Module):
    """model.Block with its weights described for csrc/avx2.c (LayerWeights): CForward runs small
    forwards through every layer in one C call; other shapes (prefill, training) go through the
    block itself. The C attention runs row by row, so a sequence's result does not depend on the
    others in the batch."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block
        attn, mlp = block.attn, block.mlp
        linears = (attn.qkv, attn.o, mlp.gate_up, mlp.down)
        self.weights = LayerWeights(
            attn.o.out_features, attn.h, attn.hkv, attn.hd, mlp.down.in_features, attn.qkv.KIND,
            getattr(mlp.gate_up, "glu", False), block.attn_norm.eps,
            _ptr(block.attn_norm.weight), _ptr(block.mlp_norm.weight), *(_ptr(lin.weight) for lin in linears),
            *(_ptr(getattr(lin, "scale", None)) for lin in linears), *(_ptr(lin.bias32) for lin in linears))

    def forward(self, x, cos, sin, cache, mask):
        return self.block(x, cos, sin, cache, mask)


class ModelEnds(ctypes.Structure):
    """csrc/avx2.c's Ends: a model's embedding, rotary frequencies, final norm and head."""
    _fields_ = [(n, ctypes.c_int) for n in ("D", "V", "hd", "kind")] + [("eps", ctypes.c_float)] + [
        (n, ctypes.c_void_p) for n in ("embed", "inv_freq", "norm", "head", "head_s", "head_b")]


class CForward:
    """model.fast_forward for a model whose blocks are CBlocks: forwards with a cache on CPU.
    Up to SMALL_ROWS new tokens go through one C call (model_forward): embedding, rotary angles,
    the layers of the range, final norm and head. A small model's decode step was half Python
    around the kernels (a draft forward 0.37 -> 0.28 ms). Where the linears run on the tile unit
    (fast for any number of rows), longer forwards (prefills) run each layer's products, norms,
    rotary and cache writes in C too, with amx_attention or PyTorch's flash attention between
    them: a 380-token prefill 26 -> 15-16 ms. Other forwards return None: the model's own path
    (PyTorch's products are the faster ones for many rows of bf16 or float32 weights without AMX)."""

    def __init__(self, model: nn.Module, kernel: ctypes.CDLL):
        self.model, self.kernel = model, kernel
        head, norm, cfg = model.lm_head, model.norm, model.config
        self.ends = ModelEnds(cfg.hidden_size, cfg.vocab_size, cfg.head_dim, head.KIND, norm.eps,
                              model.embed.weight.data_ptr(), model.inv_freq.data_ptr(), norm.weight.data_ptr(),
                              head.weight.data_ptr(), _ptr(getattr(head, "scale", None)), _ptr(head.bias32))
        self.layers = [ctypes.pointer(b.weights) for b in model.layers]
        self.amx = amx_lib() if model.layers[0].weights.kind == AMXLinear.KIND else None
        # prefills (no tree) attend on the tile unit too, for head dim 64 and a bf16 cache
        self.tile_attention = self.amx is not None and model.config.head_dim == 64 \
            and cache_dtype(model) == torch.bfloat16

    def __call__(self, x: torch.Tensor, cache, depths, tree_mask, layers: range, last_only: bool):
        B, T = x.shape[:2]
        if cache is None or x.device.type != "cpu":
            return None
        if B * T > SMALL_ROWS:
            return None if self.amx is None else self._long(x, cache, depths, tree_mask, layers, last_only)
        positions = cache.slots(T, depths)                                        # [B, T] int64
        mask = None if tree_mask is None else cache.mask(T, tree_mask).contiguous()   # [B, 1, T, kv_len]
        n, first, L = len(layers), cache.first_layer, self.model.config.num_layers
        weights = (ctypes.POINTER(LayerWeights) * n)(*self.layers[layers.start:layers.stop])
        kc = (ctypes.c_void_p * n)(*(cache.k[i - first].data_ptr() for i in layers))   # each [B, Hkv, max_len, hd]
        vc = (ctypes.c_void_p * n)(*(cache.v[i - first].data_ptr() for i in layers))
        h = self._hidden(x, layers)
        tail = 0 if layers.stop < L else 1 if last_only else T
        logits = torch.empty(B, tail, self.ends.V)
        self.kernel.model_forward(ctypes.byref(self.ends), weights, n, _ptr(x.contiguous() if layers.start == 0 else None),
                                  h.data_ptr(), B, T, positions.ctypes.data, kc, vc, cache.k[0].dtype == torch.bfloat16,
                                  cache.k[0].stride(0), cache.max_len, self._starts(cache).ctypes.data, _ptr(mask),
                                  cache._kv_len, tail, logits.data_ptr())
        cache.advance(T)
        return logits if tail else h

    def _long(self, x: torch.Tensor, cache, depths, tree_mask, layers: range, last_only: bool):
        from specmesh.model import PREFILL_TOKENS, attention    # not at the top: model imports cache imports this module
        B, T = x.shape[:2]
        cfg, first = self.model.config, cache.first_layer
        H, Q, hd = cfg.num_heads, (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.head_dim
        tiles = self.tile_attention and T > PREFILL_TOKENS and tree_mask is None and cache.k[0].dtype == torch.bfloat16
        if tiles:
            positions, mask = torch.from_numpy(cache.slots(T, depths)), None
        else:
            positions, mask = cache.prepare(T, depths, tree_mask)                # [B, T]; [B, 1, T, kv_len] or None
        cos, sin = torch.empty(B * T, hd), torch.empty(B * T, hd)
        self.kernel.rotary_tables(self.ends.inv_freq, positions.contiguous().data_ptr(), B * T, hd, cos.data_ptr(),
                                  sin.data_ptr())
        h = self.model.embed(x).contiguous() if layers.start == 0 else self._hidden(x, layers)   # [B, T, D]
        qkv = torch.empty(B, T, Q)
        starts = self._starts(cache)
        for i in layers:
            kc, vc = cache.k[i - first], cache.v[i - first]                       # [B, Hkv, max_len, hd]
            self.kernel.block_qkv(self.layers[i], h.data_ptr(), B, T, cos.data_ptr(), sin.data_ptr(), kc.data_ptr(),
                                  vc.data_ptr(), kc.dtype == torch.bfloat16, kc.stride(0), cache.max_len,
                                  starts.ctypes.data, qkv.data_ptr())
            if tiles:
                out = torch.empty(B, T, H * hd)
                for b, start in enumerate(cache._starts):
                    self.amx.amx_attention(qkv[b].data_ptr(), Q, kc[b].data_ptr(), vc[b].data_ptr(), cache.max_len,
                                           start, T, H, cfg.num_kv_heads, out[b].data_ptr())
            else:
                q = qkv[..., :H * hd].view(B, T, H, hd).transpose(1, 2)
                out = attention(q, kc[:, :, :cache._kv_len], vc[:, :, :cache._kv_len], mask,
                                self.model.layers[i].block.attn.prefill_dtype).contiguous()     # [B, T, H*hd]
            self.kernel.block_out(self.layers[i], h.data_ptr(), B * T, out.data_ptr())
        cache.advance(T)
        if layers.stop < cfg.num_layers:
            return h
        return self.model.lm_head(self.model.norm(h[:, -1:] if last_only else h)).float()

    def _hidden(self, x: torch.Tensor, layers: range) -> torch.Tensor:
        """The residual stream [B, T, D] the C code updates in place: empty where it embeds x itself,
        else a float32 copy of the hidden states x."""
        if layers.start == 0:
            return torch.empty(*x.shape[:2], self.ends.D)
        return x.float().clone(memory_format=torch.contiguous_format)

    @staticmethod
    def _starts(cache) -> np.ndarray:
        return np.asarray(cache._starts, dtype=np.int32)        # each row's first new slot


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def use_cpu_kernels(model: nn.Module, draft: bool = False) -> nn.Module:
    """Put this CPU's bf16 kernels in place (in place): ours wherever csrc/avx2.c builds, else
    oneDNN's pre-packed bf16 linears on CPUs with native bf16, else BF16Linear's PyTorch paths."""
    if avx2_lib() is None and native_bf16():
        _replace(model, nn.Linear, PackedLinear)
        return model
    return use_avx2_kernels(model, int8=draft)


def use_avx2_kernels(model: nn.Module, int8: bool = False, glu: bool = True) -> nn.Module:
    """bf16 linear weights (int8 with `int8`: draft models), float32 everywhere else, C norms
    and blocks where they build (in place). With AMX, MLPs whose width is a multiple of 32 apply
    SwiGLU in the gate/up product (amx_glu; `glu=False`: product, then SwiGLU: the same values)."""
    from specmesh.model import MLP, Block, RMSNorm   # not at the top: model imports cache imports this module
    if (amx := amx_lib()) is not None and not int8:
        for mlp in (m for m in model.modules() if glu and isinstance(m, MLP) and m.down.in_features % 32 == 0):
            mlp.gate_up = AMXLinear(mlp.gate_up.weight, mlp.gate_up.bias, amx, glu_order(mlp.down.in_features))
        _replace(model, nn.Linear, lambda linear: AMXLinear(linear.weight, linear.bias, amx))
    else:
        _replace(model, nn.Linear, BF16Linear)
    model.float()                               # the linears' bf16 weights are no parameters: they stay
    if (lib := avx2_lib()) is not None:
        if int8:
            _replace(model, BF16Linear, lambda linear: Int8Linear(linear, lib))
        _replace(model, RMSNorm, lambda norm: CRMSNorm(norm, lib))
        _replace(model, Block, CBlock)
        if hasattr(model, "fast_forward"):     # a Transformer (not a bare module of linears)
            model.kv_dtype = torch.bfloat16     # half the bytes for a batch's attention to read
            model.fast_forward = CForward(model, lib)
    if native_bf16():                           # prefills attend in bf16: 2-3x faster (400 tokens: 2.0 -> 0.7 ms)
        for attn in (m for m in model.modules() if hasattr(m, "prefill_dtype")):
            attn.prefill_dtype = torch.bfloat16
    return model


def use_batch_invariant_kernels(model: nn.Module) -> bool:
    """float32 models on x86 CPUs: few-row forwards (decode steps of up to SMALL_ROWS sequences) through
    csrc/avx2.c, so a sequence's logits do not depend on what else is in its batch (the server).
    Returns whether the kernels could be put in place."""
    from specmesh.model import Block, RMSNorm
    lib = avx2_lib()
    already = any(isinstance(m, (BF16Linear, PackedLinear, CBlock)) for m in model.modules())   # a bf16 model
    if lib is None or already or model.dtype != torch.float32 or model.device.type != "cpu":
        return False
    _replace(model, nn.Linear, lambda linear: F32Linear(linear, lib))
    _replace(model, RMSNorm, lambda norm: CRMSNorm(norm, lib))
    _replace(model, Block, CBlock)
    model.fast_forward = CForward(model, lib)
    return True


def _replace(module: nn.Module, kind: type[nn.Module], make) -> None:
    for name, child in module.named_children():
        if isinstance(child, kind):
            setattr(module, name, make(child))
        else:
            _replace(child, kind, make)

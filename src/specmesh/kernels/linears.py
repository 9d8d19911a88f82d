"""The linear layers that replace nn.Linear (docs/kernels.md): bf16 weights read once for several rows
(BF16Linear), int8 drafts (Int8Linear), AMX tiles (AMXLinear), bf16 dot products (DPLinear) and FMA over their
layout (FMALinear), quantized blocks (Q8Linear), a GGUF file's blocks as they are (GGUFLinear, GGUFEmbedding),
batch-invariant float32 (F32Linear), oneDNN's pre-packed bf16 (PackedLinear)."""
from __future__ import annotations

import ctypes
import mmap

import torch
import torch.nn.functional as F
from torch import nn

import numpy as np

from specmesh.kernels.build import Matrix, amx_lib, kernel_lib
from specmesh.kernels.grids import hand_grid

SMALL_ROWS = 16     # AVX2: up to this many rows the C kernel beats the packed float32 copy
GEMV_ROWS = 3       # without the C kernel: up to this many rows PyTorch's bf16 product beats it
PACK_GROUPS = 2048  # GGUFLinear packs this many groups of 8 rows at a time (a 2048-wide Q6_K: 28 MB)


def can_pack(dtype: torch.dtype, device: torch.device) -> bool:
    return device.type == "cpu" and dtype == torch.bfloat16 and torch.backends.mkldnn.is_available()


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


class BF16Linear(nn.Module):
    """A bf16 nn.Linear computing in float32, few rows through csrc/avx2.c (see the module docstring)."""
    KIND = 0                                    # csrc/avx2.c's weight kind

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight.detach().contiguous()                     # [N, K] bf16
        self.bias = None if linear.bias is None else linear.bias.detach()
        self.bias32 = None if self.bias is None else self.bias.float()
        self._packed: torch.Tensor | None = None      # oneDNN's layout, for many rows: made on first use (_large)
        self.kernel = kernel_lib()
        self.quantized = getattr(linear, "quantized", None)       # --quant, GGUF blocks: (q, scales, bits, offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if self.kernel is None and rows <= GEMV_ROWS:                          # PyTorch's bf16 gemv
            return F.linear(x.to(self.weight.dtype), self.weight, self.bias).to(x.dtype)
        flat = x.reshape(rows, self.in_features).float()
        out = self._small(flat) if self.kernel is not None and rows <= SMALL_ROWS else self._large(flat)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)

    def _large(self, x: torch.Tensor) -> torch.Tensor:
        if self._packed is None:        # most BF16Linears become other kernels' linears before they run
            self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.float(), 1)
        return torch.ops.mkldnn._linear_pointwise(x, self._packed, self.bias32, "none", [], "")

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
            self._packed = torch.ops.mkldnn._reorder_linear_weight(dequantized, 1)

    def _large(self, x: torch.Tensor) -> torch.Tensor:
        return super()._large(x) if self.tiles is None else self.tiles(x)

    def _small(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        y = torch.empty(x.shape[0], self.out_features)
        self.kernel.i8_linear(x.data_ptr(), x.shape[0], self.in_features, self.weight.data_ptr(), self.scale.data_ptr(),
                              self.out_features, None if self.bias32 is None else self.bias32.data_ptr(), y.data_ptr())
        return y


class DPLinear(nn.Module):
    """A bf16 linear through csrc/avx512.c's dp_linear (AVX512-BF16's dot product, CPUs without AMX) for
    every row count: a step over 64 columns' weights serves 6 rows of x (rounded to bf16), and a prefill
    runs on the dot product too, twice as fast as oneDNN's float32 product here."""
    KIND = 4                                    # csrc/avx2.c's weight kind

    def __init__(self, linear: BF16Linear, kernel: ctypes.CDLL):
        super().__init__()
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        self.bias, self.bias32 = linear.bias, linear.bias32
        self.weight = dp_pack(linear.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_product(self.kernel.dp_linear, self, x)


class FMALinear(DPLinear):
    """A bf16 linear through csrc/avx2.c's fma_linear (CPUs with AVX2 but without AVX512-BF16) for every row count:
    dp_pack's weights, 8 columns per FMA, a row's x[k] broadcast to them, up to 6 rows per pass; one FMA chain over
    K per output, so a row's result does not depend on the others."""
    KIND = 8                                    # csrc/avx2.c's weight kind

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_product(self.kernel.fma_linear, self, x)


class Q8Linear(nn.Module):
    """A `--quant int8` or `int4` linear, or a GGUF file's Q8_0 / Q4_0 / Q4_1 matrix as it is (model/quant.py), through
    q8_linear / q4_linear / q41_linear (csrc/avx512.c's on AVX512-VNNI, else csrc/avx2.c's: the same values): the
    weights times rows of x quantized to 8 bits per block of 32, in int32 (as llama.cpp computes them on CPU): a half
    or a quarter of bf16's bytes (plus the scales) and no widening; a row's result does not depend on the others."""
    KINDS = {(8, False): (5, "q8_linear"), (4, False): (6, "q4_linear"), (4, True): (7, "q41_linear")}
    # (bits, offset) -> csrc/avx2.c's weight kind and the product

    def __init__(self, linear: BF16Linear, kernel: ctypes.CDLL):
        super().__init__()
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        self.bias, self.bias32 = linear.bias, linear.bias32
        q, scale, bits, offset = linear.quantized
        self.KIND, product = self.KINDS[bits, offset is not None]
        self.product = getattr(kernel, product)
        self.weight, self.scale = q8_pack(q, scale, bits, offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        def product(x, m, k, w, n, bias, y):
            self.product(x, m, k, w, self.scale.data_ptr(), n, bias, y)
        return packed_product(product, self, x)


class GGUFLinear(nn.Module):
    """A GGUF file's matrix multiplied as it is, from the file's memory-mapped pages (csrc/blocks.c's gguf_linear):
    Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, IQ4_XS, the K-quants Q2_K ... Q6_K and the IQ1 ... IQ3 kinds, each
    part of a fused projection of its own type. `parts`: (rows, type, map) for each part in output order, rows a
    uint8 [N_p, bytes per row] view of the file, map (or None) the file row each output row reads (int32 [N_p]).
    Holds the views: the file stays mapped while the model lives. `packed`: the parts are re-laid once, 8 rows
    interleaved (csrc/blocks.h: the same bytes, the K-quants up to 3% more, the IQ kinds as 4-bit levels with a
    float32 scale per 32 or 16), into memory of their own, and the file's pages of them are let go; without it (an
    embedding table's lookups alone) they have no product."""
    KIND = 9                                    # csrc/avx2.c's weight kind

    def __init__(self, parts: list[tuple[np.ndarray, int, np.ndarray | None]], in_features: int,
                 bias: torch.Tensor | None, kernel: ctypes.CDLL, packed: bool = True):
        super().__init__()
        if not 0 < len(parts) <= Matrix.MAX_PARTS:
            raise ValueError(f"a GGUF matrix of {len(parts)} parts (1 to {Matrix.MAX_PARTS})")
        self.in_features, self.kernel = in_features, kernel
        for _, kind, _ in parts:
            hand_grid(kernel, kind)
        self.out_features = sum(rows.shape[0] for rows, _, _ in parts)
        self.held = [(np.ascontiguousarray(rows), None if rows_map is None else np.ascontiguousarray(rows_map, np.int32))
                     for rows, _, rows_map in parts]      # numpy, not tensors: on_huge_pages must not move them
        self.matrix = Matrix(len(parts))
        for p, ((rows, rows_map), (_, kind, _)) in zip(self.matrix.part, zip(self.held, parts)):
            p.type, p.rows, p.stride, p.data = kind, rows.shape[0], rows.shape[1], rows.ctypes.data
            p.map = None if rows_map is None else rows_map.ctypes.data
        self.packed = [self._pack(i) if packed else None for i in range(len(parts))]
        self.bias = None if bias is None else bias.detach()
        self.bias32 = None if bias is None else bias.detach().float().contiguous()
        self.address = ctypes.addressof(self.matrix)       # what csrc/avx2.c's Layer and Ends point to

    def _pack(self, i: int) -> np.ndarray | None:
        """Part i's rows packed (csrc/blocks.c's gguf_pack), or None where its type has no packed kernel."""
        part = self.matrix.part[i]
        nbytes = self.kernel.gguf_packed_bytes(part.type, part.rows, self.in_features)
        if not nbytes:
            return None
        out, (rows, rows_map) = anonymous(nbytes), self.held[i]
        groups = -(-part.rows // 8)
        for g0 in range(0, groups, PACK_GROUPS):             # the file's pages let go as they are read
            g1 = min(g0 + PACK_GROUPS, groups)
            self.kernel.gguf_pack(ctypes.byref(self.matrix), i, self.in_features, g0, g1, out.ctypes.data)
            if rows_map is None:
                let_go(rows[8 * g0:8 * g1])
        let_go(rows)
        part.packed = out.ctypes.data
        return out

    @property
    def nbytes(self) -> int:
        """The bytes a product reads."""
        return sum(rows.nbytes if packed is None else packed.nbytes for (rows, _), packed in zip(self.held, self.packed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if any(p is None for p in self.packed):
            raise RuntimeError("this GGUF matrix was built as a lookup table (packed=False): its rows have no product "
                               "kernel until packed")
        rows = x.numel() // self.in_features
        flat = x.reshape(rows, self.in_features).float().contiguous()
        y = torch.empty(rows, self.out_features)
        self.kernel.gguf_linear(flat.data_ptr(), rows, self.in_features, ctypes.byref(self.matrix), self.out_features,
                                _ptr(self.bias32), y.data_ptr())
        return y.to(x.dtype).view(*x.shape[:-1], self.out_features)


class GGUFEmbedding(nn.Module):
    """An embedding table that stays in a GGUF file as it is: a lookup dequantizes the rows it reads (float32)."""
    KIND = GGUFLinear.KIND

    def __init__(self, table: GGUFLinear):
        super().__init__()
        self.table = table                      # [V, D] blocks: shared with a tied head
        self.embedding_dim = table.in_features
        # what Transformer.dtype and .device read: no weights of its own in PyTorch
        self.weight = nn.Parameter(torch.empty(0, table.in_features), requires_grad=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).to(torch.int64).contiguous()
        out = torch.empty(flat.numel(), self.embedding_dim)
        self.table.kernel.gguf_rows(ctypes.byref(self.table.matrix), self.embedding_dim, flat.data_ptr(), flat.numel(),
                                    out.data_ptr())
        return out.to(self.weight.dtype).view(*ids.shape, self.embedding_dim)

    @property
    def address(self) -> int:
        return self.table.address


def anonymous(nbytes: int) -> np.ndarray:
    """uint8 [nbytes] of zeros in a private anonymous mapping, advised for huge pages where Linux gives them (a product
    streams it: on 4 KiB pages the page walks cost), held by the array (on_huge_pages moves tensors, not these)."""
    buf = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        buf.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(buf, np.uint8)


def let_go(rows: np.ndarray) -> None:
    """Drop a memory-mapped file's pages under `rows` from this process (madvise DONTNEED): they stay in the page
    cache, and a later read (an embedding's lookup) maps them again. Arrays not over a mapped file are left as they
    are (on anonymous memory DONTNEED would zero them)."""
    base = rows
    while base is not None and not isinstance(base, np.memmap):
        base = base.base
    if base is None or not rows.nbytes:
        return
    page = mmap.PAGESIZE
    start = rows.ctypes.data // page * page
    LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(rows.ctypes.data + rows.nbytes - start), mmap.MADV_DONTNEED)


LIBC = ctypes.CDLL(None, use_errno=True)


def q8_pack(q: torch.Tensor, scale: torch.Tensor, bits: int = 8, offset: torch.Tensor | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """int8 [N, K] and scales [N, KB] -> csrc/avx512.c's q8_linear layout, padded with zeros to NB = ceil(N / 16)
    blocks of 16 columns and KB blocks of 32 of K: weights [NB, KB * 8, 16, 4] ([nb, kq, j, e] = q[16 nb + j,
    4 kq + e]) and per block of 16 columns and 32 of K 32 words [NB, KB, 32]: the 16 column scales, then
    -128 * the columns' sums of q as int32 (what the unsigned x bytes, q_x + 128, add). 4 bits (q4_linear): the
    weights as bytes [NB, KB * 4, 16, 4] holding quad 2p's q + 8 in the low nibble and quad 2p + 1's in the high.
    `offset` [N, KB] (GGUF Q4_1, q41_linear): 16 more words per block, the columns' offsets (w = s q + offset)."""
    N, K = q.shape
    NB, KB = -(-N // 16), scale.shape[1]
    w = F.pad(q, (0, KB * 32 - K, 0, NB * 16 - N))                                      # [NB * 16, KB * 32]
    packed = w.view(NB, 16, KB * 8, 4).permute(0, 2, 1, 3).contiguous()
    if bits == 4:
        nibbles = (packed.view(NB, KB * 4, 2, 16, 4).to(torch.int16) + 8).to(torch.uint8)
        packed = (nibbles[:, :, 0] | (nibbles[:, :, 1] << 4)).view(torch.int8).contiguous()
    sums = -128 * w.view(NB, 16, KB, 32).sum(-1, dtype=torch.int32).permute(0, 2, 1)    # [NB, KB, 16]
    per_block = lambda t: F.pad(t.float(), (0, 0, 0, NB * 16 - N)).view(NB, 16, KB).permute(0, 2, 1)   # [NB, KB, 16]
    words = [per_block(scale), sums.int().view(torch.float32)] + ([] if offset is None else [per_block(offset)])
    return packed, torch.cat(words, -1).contiguous()


def dp_pack(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] weight -> bf16 [NB, KP, 16, 2] for csrc/avx512.c's dp_linear, padded with zeros to NB =
    ceil(N / 16) blocks of 16 output columns and KP = ceil(K / 2) pairs: [nb, kp, j, e] = w[16 nb + j, 2 kp + e]."""
    N, K = weight.shape
    NB, KP = -(-N // 16), -(-K // 2)
    w = F.pad(weight.to(torch.bfloat16), (0, KP * 2 - K, 0, NB * 16 - N))
    return w.view(NB, 16, KP, 2).permute(0, 2, 1, 3).contiguous()


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
        return packed_product(self.kernel.amx_linear, self, x, self.order)


class F32Linear(nn.Module):
    """A float32 nn.Linear whose few-row products (up to SMALL_ROWS) go through csrc/avx2.c, where a
    row's result does not depend on how many rows share the product (BLAS's does, in the last
    bits): for batch-invariant serving. More rows (a prefill, which runs alone) go through BLAS."""
    KIND = 2

    def __init__(self, linear: nn.Linear, kernel: ctypes.CDLL):
        super().__init__()
        self.in_features, self.out_features, self.kernel = linear.in_features, linear.out_features, kernel
        self.weight, self.bias = linear.weight, linear.bias                        # [N, K], [N] float32 (saved)
        self.bias32 = self.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // self.in_features
        if rows > SMALL_ROWS:
            return F.linear(x, self.weight, self.bias32)
        flat = x.reshape(rows, self.in_features).float().contiguous()
        y = torch.empty(rows, self.out_features)
        self.kernel.f32_linear(flat.data_ptr(), rows, self.in_features, self.weight.data_ptr(), self.out_features,
                               None if self.bias32 is None else self.bias32.data_ptr(), y.data_ptr())
        return y.view(*x.shape[:-1], self.out_features)


def packed_product(product, linear: nn.Module, x: torch.Tensor, order: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] -> [..., N] in x's dtype through a C product over pre-packed weights (amx_linear, dp_linear:
    float32 rows in, float32 rows out); `order`: the packed columns back in their own order."""
    rows = x.numel() // linear.in_features
    flat = x.reshape(rows, linear.in_features).float().contiguous()
    y = torch.empty(rows, linear.out_features)
    product(flat.data_ptr(), rows, linear.in_features, linear.weight.data_ptr(), linear.out_features,
            _ptr(linear.bias32), y.data_ptr())
    if order is not None:
        y = y[:, order]
    return y.to(x.dtype).view(*x.shape[:-1], linear.out_features)


def _ptr(t: torch.Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()

"""The IQ kinds' grids, the `gguf` package's own, handed to csrc/grids.c once a kind and process: what its
dequantization (gguf_dequantize, gguf_rows) and its packing of them as levels read."""
from __future__ import annotations

import ctypes
import functools

import numpy as np

GRIDS = {16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 21: "IQ3_S", 22: "IQ2_S", 29: "IQ1_M"}


@functools.cache
def grid_tables(kind: int) -> tuple[np.ndarray, np.ndarray]:
    """An IQ kind's grid (float32 [entries, width]) and IQ2_XXS's ksigns (uint8 [128]: 7 bits of sign index -> 8
    signs), as csrc/grids.c reads them; kept alive here for as long as the kernels may read them."""
    import gguf
    cls = getattr(gguf.quants, GRIDS[kind])
    cls.init_grid()
    return np.ascontiguousarray(cls.grid, np.float32), np.frombuffer(gguf.quants.IQ2_XXS.ksigns, np.uint8)


@functools.cache
def hand_grid(kernel: ctypes.CDLL, kind: int) -> None:
    """Hand `kind`'s grid to the kernels, where it is an IQ kind of a grid (else nothing): before a matrix of it is
    dequantized, looked up, asked about (gguf_kernel) or packed."""
    if kind in GRIDS:
        grid, ksigns = grid_tables(kind)
        kernel.gguf_grid(kind, grid.ctypes.data, grid.size, ksigns.ctypes.data)

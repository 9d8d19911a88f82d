"""The CPU bf16 kernels compute what nn.Linear computes on the same bf16 weights."""
import shutil

import pytest
import torch
from torch import nn

from specmesh import kernels
from specmesh.model import RMSNorm

ROWS = (1, 2, 3, 5, 8, 9, 16, 17, 40)       # every path: gemv, C kernel blocks, packed float32


def check(fast: nn.Module, linear: nn.Linear) -> None:
    for rows in ROWS:
        x = torch.randn(1, rows, linear.in_features).bfloat16()
        out = fast(x)
        assert out.shape == (1, rows, linear.out_features) and out.dtype == torch.bfloat16
        b = None if linear.bias is None else linear.bias.double()
        exact = nn.functional.linear(x[0].double(), linear.weight.double(), b)
        # float32 accumulation, then one bf16 rounding of the result
        assert torch.allclose(out[0].double(), exact, rtol=2 ** -7, atol=1e-3), (type(fast).__name__, rows)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("with_c_kernel", [True, False])
def test_bf16_linear_matches_exact_product(with_c_kernel, bias):
    torch.manual_seed(0)
    linear = nn.Linear(100, 37, bias=bias).bfloat16()      # K not a multiple of 8: the kernel's tail loop
    fast = kernels.BF16Linear(linear)
    if not with_c_kernel:
        fast.kernel = None                                 # the PyTorch fallback
    check(fast, linear)


def test_bf16_linear_reads_strided_inputs():
    """The last position of a batch (h[:, -1:]) is a strided view; the C kernel must not read it densely."""
    torch.manual_seed(2)
    linear = nn.Linear(64, 40).bfloat16()
    fast = kernels.BF16Linear(linear)
    h = torch.randn(4, 7, 64)
    last = h[:, -1:]
    assert not last.is_contiguous()
    exact = nn.functional.linear(last.double(), linear.weight.double(), linear.bias.double())
    assert torch.allclose(fast(last).double(), exact, rtol=1e-5, atol=1e-4)


def test_use_cpu_kernels_picks_a_linear_that_matches():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(64, 48, bias=True), nn.Linear(48, 8192, bias=False)).bfloat16()
    originals = list(model)
    kernels.use_cpu_kernels(model)
    expected = kernels.PackedLinear if kernels.native_bf16() else kernels.BF16Linear
    for fast, linear in zip(model, originals):
        assert isinstance(fast, expected)
        check(fast, linear)


def test_c_rms_norm_matches_the_model_norm():
    lib = kernels.avx2_lib()
    assert lib is not None, "needs the AVX2 kernels (x86 CPU with AVX2 and gcc)"
    torch.manual_seed(3)
    norm = RMSNorm(100, 1e-5)                  # D not a multiple of 8: the tail loop
    norm.weight.data = torch.randn(100)
    fast = kernels.CRMSNorm(norm, lib)
    for rows in (1, 5, 17):
        x = torch.randn(2, rows, 100) * 3
        assert torch.allclose(fast(x), norm(x), rtol=1e-5, atol=1e-6)
        assert torch.equal(fast(x[:, :1]), fast(x)[:, :1])   # a row's result does not depend on the batch


def test_avx2_kernels_build_where_they_apply():
    """On an x86 CPU with AVX2 and gcc the C kernel must build (else bf16 verification is 2-5x slower)."""
    applies = torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512") and shutil.which("gcc") is not None
    assert (kernels.avx2_lib() is not None) == applies

"""CPU kernels (docs/kernels.md), chosen once when a model is loaded (model/kernel_choice.py), the same for
`LLM` and the server:

* build.py: csrc/ compiled with gcc for this machine (x86 with AVX2; avx512.c where the CPU has AVX-512,
  with AMX tile products where it has AMX), its ctypes signatures, the CPU's flags;
* linears.py: the layers that replace nn.Linear: bf16 weights read once for several rows (BF16Linear),
  int8 drafts (Int8Linear), AMX tiles (AMXLinear), AVX512-BF16 dot products (DPLinear), AVX2 FMA over the same
  layout (FMALinear), Q8_0 / Q4_0 / Q4_1 products on AVX512-VNNI or AVX2 for `--quant int8` / `int4` (and
  GGUF blocks on VNNI: Q8Linear), batch-invariant
  float32 (F32Linear), oneDNN's pre-packed bf16 (PackedLinear);
The model puts them in place: model/kernel_choice.py chooses which a loaded model gets, model/c_forward.py runs
a whole forward of up to SMALL_ROWS new tokens in one C call.

Every kernel computes a row the same way whatever the number of rows, and the attention depends only on
the keys a query sees, so a token's logits are bit for bit the same in a 1-token `ar` step, in a
verification, as a node of a tree and among other sequences of a batch (tests/kernels/test_kernels.py).
"""
from specmesh.kernels.build import (AMX, AVX512, DP, Q8, amx_lib, kernel_lib, cache_dir, cpu_flags, cpu_info, cpu_model,
                                    cpu_name, dp_lib, fma_lib, kernel_version, native_bf16, q8_lib, vector_units)
from specmesh.kernels.linears import (GEMV_ROWS, SMALL_ROWS, AMXLinear, BF16Linear, DPLinear, F32Linear, FMALinear,
                                      Int8Linear, PackedLinear, Q8Linear, amx_pack, can_pack, dp_pack, glu_order)

__all__ = ["AMX", "AVX512", "DP", "Q8", "amx_lib", "kernel_lib", "cache_dir", "cpu_flags", "cpu_info", "cpu_model",
           "cpu_name", "dp_lib", "fma_lib", "q8_lib", "kernel_version", "native_bf16", "vector_units", "GEMV_ROWS",
           "SMALL_ROWS", "AMXLinear", "BF16Linear", "DPLinear", "F32Linear", "FMALinear", "Int8Linear", "PackedLinear",
           "Q8Linear", "amx_pack", "can_pack", "dp_pack", "glu_order"]

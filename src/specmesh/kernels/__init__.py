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
from specmesh.kernels.build import AMX, AVX512, amx_lib, avx2_lib, cpu_flags, native_bf16
from specmesh.kernels.forward import CBlock, CForward, CRMSNorm
from specmesh.kernels.linears import (GEMV_ROWS, SMALL_ROWS, AMXLinear, BF16Linear, F32Linear, Int8Linear,
                                      PackedLinear, amx_pack, can_pack, glu_order)
from specmesh.kernels.select import (select_kernels, use_avx2_kernels, use_batch_invariant_kernels,
                                     use_cpu_kernels)

__all__ = ["AMX", "AVX512", "amx_lib", "avx2_lib", "cpu_flags", "native_bf16", "CBlock", "CForward", "CRMSNorm",
           "GEMV_ROWS", "SMALL_ROWS", "AMXLinear", "BF16Linear", "F32Linear", "Int8Linear", "PackedLinear",
           "amx_pack", "can_pack", "glu_order", "select_kernels", "use_avx2_kernels", "use_batch_invariant_kernels",
           "use_cpu_kernels"]

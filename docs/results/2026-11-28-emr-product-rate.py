"""One bf16 product alone through the C kernels (FMALinear's fma_linear, or DPLinear's dp_linear with DP=1 in the
environment), median of 15 calls, in GMAC/s for a few shapes of the embedded target and row counts: usage
python THIS.py. The two cores' peaks come from kernels.build.best_rate (csrc/avx512.c's mac_rate)."""
import os
import statistics
import time

import torch
from torch import nn

from specmesh import kernels
from specmesh.kernels.build import best_rate

torch.set_num_threads(2)
lib = kernels.avx2_lib()
dot = os.environ.get("DP") == "1"
make, product = (kernels.DPLinear, lib.dp_linear) if dot else (kernels.FMALinear, lib.fma_linear)
print(f"{'dp_linear' if dot else 'fma_linear'}; one core's peak: dot product {best_rate(lib, 1):.1f}, "
      f"512-bit FMA {best_rate(lib, 0):.1f} multiply-adds a ns")
torch.manual_seed(0)
shapes = [(K, N, make(kernels.BF16Linear(nn.Linear(K, N, bias=False).bfloat16()), lib).weight)
          for K, N in ((512, 2816), (1408, 512), (512, 1536))]
for warm in (True, False):                      # the first round warms the threads and the clock: not printed
    for K, N, weight in shapes:
        cells = []
        for M in (1, 6, 12, 16, 64, 384):
            x, y = torch.randn(M, K), torch.empty(M, N)
            times = []
            for _ in range(15):
                t0 = time.perf_counter()
                product(x.data_ptr(), M, K, weight.data_ptr(), N, None, y.data_ptr())
                times.append(time.perf_counter() - t0)
            cells.append(f"M {M}: {M * K * N / statistics.median(times) / 1e9:.0f}")
        if not warm:
            print(f"K {K} N {N}: " + ", ".join(cells) + " GMAC/s")

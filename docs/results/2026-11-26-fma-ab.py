"""A/B of fma_linear in two builds (argv[1], argv[2]), interleaved, each linear shape of the embedded target x3 per
call, fastest of 30 rounds; outputs compared bit for bit. argv[3]: threads."""
import ctypes, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
from specmesh.kernels.linears import dp_pack
P = ctypes.c_void_p
libs = [ctypes.CDLL(x) for x in sys.argv[1:3]]
fns = [l.fma_linear for l in libs]
for f in fns: f.argtypes = [P, ctypes.c_int, ctypes.c_int, P, ctypes.c_int, P, P]
shapes = [(512, 1024), (512, 512), (512, 2816), (1408, 512)] * 8 + [(512, 8192)]   # the model's 55.6 MB: past the L3
g = torch.Generator().manual_seed(0)
def padded(w):   # 16 elements before the packed weights (a kernel may read 2 bytes before)
    b = torch.zeros(w.numel() + 16, dtype=w.dtype); b[16:] = w.flatten(); return b[16:]
ws = [(padded(dp_pack(torch.randn(N, K, generator=g).to(torch.bfloat16))), K, N) for K, N in shapes]
import os
for M in [int(v) for v in os.environ.get("MS", "1,2,4,8,16,64").split(",")]:
    data = [(torch.randn(M, K, generator=g), w, torch.empty(M, N), torch.empty(M, N), K, N) for w, K, N in ws]
    times = [[], []]
    for rep in range(int(sys.argv[4]) if len(sys.argv) > 4 else 40):
        for v in ((0, 1) if rep % 2 else (1, 0)):
            t = time.perf_counter()
            for x, w, y0, y1, K, N in data:
                for _ in range(1):
                    fns[v](x.data_ptr(), M, K, w.data_ptr(), N, None, (y0, y1)[v].data_ptr())
            times[v].append(time.perf_counter() - t)
    same = all(torch.equal(d[2], d[3]) for d in data)
    macs = M * sum(K * N for K, N in shapes)
    old, new = (min(t) for t in times)
    print(f"M={M:3d}: {macs / old / 1e9:5.1f} -> {macs / new / 1e9:5.1f} GMAC/s ({old / new:.2f}x) same={same}", flush=True)

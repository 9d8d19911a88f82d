"""A/B of the VNNI quantized products (q8_linear512, q4_linear512) in two builds (argv[1] old, argv[2] new), interleaved,
the embedded target's linear shapes (every layer's, past the L3), fastest of 30 rounds; outputs compared bit for bit.
argv[3]: threads."""
import ctypes, os, sys, time
import torch
torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else 2)
from specmesh.kernels.linears import q8_pack
from specmesh.model.quant import quantize_q8
P = ctypes.c_void_p
libs = [ctypes.CDLL(x) for x in sys.argv[1:3]]
shapes = [(512, 1024), (512, 512), (512, 2816), (1408, 512)] * 8 + [(512, 8192)]
g = torch.Generator().manual_seed(0)
for bits, name in ((8, "q8_linear512"), (4, "q4_linear512")):
    fns = [getattr(l, name) for l in libs]
    for f in fns: f.argtypes = [P, ctypes.c_int, ctypes.c_int, P, P, ctypes.c_int, P, P]
    ws = []
    for K, N in shapes:
        q, scale = quantize_q8(torch.randn(N, K, generator=g), bits)
        w, s = q8_pack(q, scale, bits)
        ws.append((w, s, K, N))
    for M in [int(v) for v in os.environ.get("MS", "1,2,4,8,16").split(",")]:
        data = [(torch.randn(M, K, generator=g), w, s, torch.empty(M, N), torch.empty(M, N), K, N) for w, s, K, N in ws]
        times = [[], []]
        for rep in range(30):
            for v in ((0, 1) if rep % 2 else (1, 0)):
                t = time.perf_counter()
                for x, w, s, y0, y1, K, N in data:
                    fns[v](x.data_ptr(), M, K, w.data_ptr(), s.data_ptr(), N, None, (y0, y1)[v].data_ptr())
                times[v].append(time.perf_counter() - t)
        same = all(torch.equal(d[3], d[4]) for d in data)
        macs = M * sum(K * N for K, N in shapes)
        old, new = (min(t) for t in times)
        print(f"{name} M={M:3d}: {macs / old / 1e9:6.1f} -> {macs / new / 1e9:6.1f} GMAC/s ({old / new:.2f}x) same={same}",
              flush=True)

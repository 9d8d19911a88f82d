import ctypes, sys, time
import torch
torch.set_num_threads(2)
P = ctypes.c_void_p
libs = [ctypes.CDLL(x) for x in sys.argv[1:]]
for lib in libs:
    lib.attend.argtypes = [P, ctypes.c_int, P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P]
H, Hkv, hd, max_len, T = 8, 4, 64, 1024, 390
g = torch.Generator().manual_seed(0)
kc = torch.randn(Hkv, max_len, hd, generator=g).to(torch.bfloat16)
vc = torch.randn(Hkv, max_len, hd, generator=g).to(torch.bfloat16)
q = torch.randn(T, H * hd, generator=g)
outs = [torch.empty(T, H * hd) for _ in libs]
ts = [[] for _ in libs]
for rep in range(30):
    for i, lib in enumerate(libs):
        t = time.perf_counter()
        lib.attend(q.data_ptr(), H * hd, kc.data_ptr(), vc.data_ptr(), 1, max_len, 0, T, None, T, T, H, Hkv, hd, outs[i].data_ptr())
        ts[i].append(time.perf_counter() - t)
print([f"{min(t)*1e3:.2f} ms" for t in ts], all(torch.equal(outs[0], o) for o in outs))
from specmesh.model.model import attention
qq = q.view(1, T, H, hd).transpose(1, 2)
k = kc[:, :T].unsqueeze(0); v = vc[:, :T].unsqueeze(0)
t = time.perf_counter()
for _ in range(10): ref = attention(qq, k, v, None)
print(f"sdpa {(time.perf_counter()-t)/10*1e3:.2f} ms; max diff vs C {(ref.view(T, -1) - outs[-1]).abs().max():.2e}")

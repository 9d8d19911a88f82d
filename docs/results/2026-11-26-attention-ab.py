"""A/B of lib.attend in two builds (argv[1], argv[2]), interleaved; outputs compared bit for bit.
Embedded target's heads (8 / 4 of 64), bf16 cache; causal and random tree masks."""
import ctypes, sys, time
import torch
torch.set_num_threads(2)
P = ctypes.c_void_p
libs = [ctypes.CDLL(x) for x in sys.argv[1:3]]
for lib in libs:
    lib.attend.argtypes = [P, ctypes.c_int, P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, ctypes.c_int,
                           ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P]
H, Hkv, hd, max_len = 8, 4, 64, 1024
g = torch.Generator().manual_seed(0)
kc = torch.randn(Hkv, max_len, hd, generator=g).to(torch.bfloat16)
vc = torch.randn(Hkv, max_len, hd, generator=g).to(torch.bfloat16)
for ctx in (128, 400):
    for T in (1, 2, 5, 16):
        for tree in (False, True):
            kv = ctx + T
            q = torch.randn(T, H * hd, generator=g)
            mask = None
            if tree:
                mask = torch.ones(T, kv, dtype=torch.uint8)
                mask[:, ctx:] = (torch.rand(T, T, generator=g) < 0.5).to(torch.uint8).tril()
                mask[:, ctx:].fill_diagonal_(1)
            outs = [torch.empty(T, H * hd) for _ in libs]
            times = [[], []]
            for rep in range(400):
                for v in ((0, 1) if rep % 2 else (1, 0)):
                    t = time.perf_counter()
                    libs[v].attend(q.data_ptr(), H * hd, kc.data_ptr(), vc.data_ptr(), 1, max_len, ctx, kv,
                                   None if mask is None else mask.data_ptr(), kv, T, H, Hkv, hd, outs[v].data_ptr())
                    times[v].append(time.perf_counter() - t)
            same = torch.equal(outs[0], outs[1])
            a, b = (sorted(t)[len(t) // 2] * 1e6 for t in times)
            print(f"ctx {ctx:3d} T {T:2d} {'tree ' if tree else 'causal'}: {a:7.1f} -> {b:7.1f} us ({a / b:.2f}x)  same={same}", flush=True)

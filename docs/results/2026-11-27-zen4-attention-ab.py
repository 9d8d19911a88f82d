"""attend512 (all kv heads, all rows in one task per head) of two builds, alternating call by call, one thread."""
import ctypes, statistics, sys, time, torch
libs = {name: ctypes.CDLL(path) for name, path in (a.split("=") for a in sys.argv[1:3])}
for lib in libs.values():
    lib.attend512.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 4 + \
        [ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_void_p]
    lib.use_avx512(1)
H, Hkv, hd, max_len = int(sys.argv[3]), int(sys.argv[4]), 64, 2048
torch.manual_seed(0)
kc, vc = (torch.randn(Hkv, max_len, hd).bfloat16() for _ in "kv")
for kv_len in (128, 400, 800):
    for T in (1, 2, 5, 16):
        q = torch.randn(T, H * hd)
        outs, times = {}, {n: [] for n in libs}
        for rep in range(300):
            for name, lib in libs.items():
                out = torch.empty(T, H * hd)
                t0 = time.perf_counter()
                lib.attend512(q.data_ptr(), H * hd, kc.data_ptr(), vc.data_ptr(), 1, max_len, kv_len - T, kv_len,
                              None, 0, T, H, Hkv, hd, out.data_ptr())
                times[name].append((time.perf_counter() - t0) * 1e6)
                outs[name] = out
        o, n = statistics.median(times["old"]), statistics.median(times["new"])
        print(f"kv {kv_len} T {T}: old {o:.0f} us, new {n:.0f} us ({o / n:.2f}x), same bits {torch.equal(outs['old'], outs['new'])}")

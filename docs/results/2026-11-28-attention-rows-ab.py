"""attend512 (csrc/avx512.c) of two builds, alternating call by call, one thread, one task a kv head: a prefill of 380
tokens and verifications of 2-16 tokens, the embedded target's 8 query heads over 4 kv heads of 64, bf16 cache.
Usage: python THIS.py old=OLD.so new=NEW.so (each built as kernels.build builds csrc/: gcc -O3 -mavx2 -mfma -shared
-fPIC avx2.c avx512.c pool.c -fopenmp -lgomp -lm -lpthread). Prints the median of each and whether the bits agree."""
import ctypes, statistics, sys, time, torch
torch.set_num_threads(1)
libs = {name: ctypes.CDLL(path) for name, path in (a.split("=") for a in sys.argv[1:3])}
for lib in libs.values():
    lib.attend512.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int] * 4 + \
        [ctypes.c_void_p] + [ctypes.c_int] * 5 + [ctypes.c_void_p]
    lib.use_avx512(1)
H, Hkv, hd, max_len = 8, 4, 64, 2048
torch.manual_seed(0)
kc, vc = (torch.randn(Hkv, max_len, hd).bfloat16() for _ in "kv")
cases = [(380, 380), (128, 16), (400, 16), (400, 8), (400, 5), (400, 3), (400, 2)]
for kv_len, T in cases:
    q = torch.randn(T, H * hd)
    outs, times = {}, {n: [] for n in libs}
    reps = 30 if T > 100 else 300
    for rep in range(reps):
        for name, lib in libs.items():
            out = torch.empty(T, H * hd)
            t0 = time.perf_counter()
            lib.attend512(q.data_ptr(), H * hd, kc.data_ptr(), vc.data_ptr(), 1, max_len, kv_len - T, kv_len,
                          None, 0, T, H, Hkv, hd, out.data_ptr())
            times[name].append((time.perf_counter() - t0) * 1e6)
            outs[name] = out
    o, n = statistics.median(times["old"]), statistics.median(times["new"])
    print(f"kv {kv_len} T {T}: old {o:.0f} us, new {n:.0f} us ({o / n:.2f}x), same bits {torch.equal(outs['old'], outs['new'])}")

"""Where a T-token forward of the embedded target goes (bf16, 128 cached): the whole forward, each linear alone
(through its module), attention alone (lib.attend, causal and with a tree mask), fastest-of medians."""
import ctypes, sys, time
import torch
torch.set_num_threads(2)
from specmesh import embedded
from specmesh.model.loader import load_model
from specmesh.timing import forward_ms, median_ms
from specmesh.kernels.build import avx2_lib

T = int(sys.argv[1]) if len(sys.argv) > 1 else 16
m = load_model(embedded.path("target"), torch.bfloat16)
lib = avx2_lib()
blk = m.layers[0].block
lins = {"qkv": blk.attn.qkv, "o": blk.attn.o, "gate_up": blk.mlp.gate_up, "down": blk.mlp.down}
L = m.config.num_layers
H, Hkv, hd, ctx = 8, 4, 64, 128
kv = ctx + T
max_len = 1024
kc = torch.randn(Hkv, max_len, hd).to(torch.bfloat16)
vc = torch.randn(Hkv, max_len, hd).to(torch.bfloat16)
q = torch.randn(T, H * hd)
out = torch.empty(T, H * hd)
tree = torch.ones(T, kv, dtype=torch.uint8)
tree[:, ctx:] = torch.tril(torch.ones(T, T, dtype=torch.uint8))
P = ctypes.c_void_p
lib.attend.argtypes = [P, ctypes.c_int, P, P, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P, ctypes.c_int,
                       ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, P]
def att(mask):
    lib.attend(q.data_ptr(), H * hd, kc.data_ptr(), vc.data_ptr(), 1, max_len, ctx, kv,
               None if mask is None else mask.data_ptr(), kv, T, H, Hkv, hd, out.data_ptr())
res = {}
with torch.inference_mode():
    for rnd in range(3):
        r = {"forward": forward_ms(m, T, ctx, reps=40)}
        for name, lin in lins.items():
            x = torch.randn(T, lin.in_features)
            r[name] = L * median_ms(lambda: lin(x), 40)
        x = torch.randn(T, m.config.hidden_size)
        r["head"] = median_ms(lambda: m.lm_head(x), 40)
        r["attend causal"] = L * median_ms(lambda: att(None), 40)
        r["attend tree"] = L * median_ms(lambda: att(tree), 40)
        for k, v in r.items(): res.setdefault(k, []).append(v)
for k, v in res.items(): print(f"{k:14s} {min(v):6.3f} ms  ({' '.join(f'{x:.3f}' for x in v)})")
lin_sum = sum(min(res[k]) for k in ("qkv", "o", "gate_up", "down", "head"))
print(f"linears sum {lin_sum:.3f} ms; + attention {lin_sum + min(res['attend causal']):.3f}; rest {min(res['forward']) - lin_sum - min(res['attend causal']):.3f}")

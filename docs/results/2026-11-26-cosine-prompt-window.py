"""Offline, as the engine would: drafters read only the last WIN prompt tokens (draft_window); the target's logits
over the same positions with its full context; KL(target || drafter) averaged over the window's last positions
(skipping the first S). How often the own-domain drafter has the smaller KL."""
import json, sys
import torch, torch.nn.functional as F
from specmesh.model.loader import load_model, load_tokenizer
from specmesh import catalog
torch.set_num_threads(2)
WIN = int(sys.argv[1]); rows = [json.loads(l) for l in open(sys.argv[2])]
domain = lambda src: "tests" if any(p in ("test", "tests", "idle_test") or p.startswith("test_") for p in src.split("/")) else "lib"
names = ["specmesh-drafter-tests", "specmesh-drafter-lib"]
models = [load_model(catalog.resolve(n, "draft"), torch.float32, pack=False).eval() for n in names]
target = load_model(catalog.resolve("embedded", "target"), torch.float32, pack=False).eval()
tok = load_tokenizer(catalog.resolve("embedded"))
skips = [0, 8, 16, 32]
wins = {s: 0 for s in skips}
for r in rows:
    x = torch.tensor([tok.encode(r["prompt"])])
    with torch.no_grad():
        tl = F.log_softmax(target(x)[0, -WIN:].float(), -1)
        kls = []
        for m in models:
            lp = F.log_softmax(m(x[:, -WIN:])[0].float(), -1)
            kls.append((tl.exp() * (tl - lp)).sum(-1))
    own = 0 if domain(r["source"]) == "tests" else 1
    for s in skips:
        wins[s] += float(kls[own][s:].mean()) < float(kls[1 - own][s:].mean())
print(f"window {WIN}:", {f"skip {s}": f"{v}/{len(rows)}" for s, v in wins.items()})

"""Offline: which prompt-based signal tells the specialised drafters apart: agreement with the text, log-likelihood
of the text, agreement with the target's greedy tokens, the paper's round score on the prompt."""
import json, sys
import torch, torch.nn.functional as F
from specmesh.model.loader import load_model, load_tokenizer
from specmesh import catalog
torch.set_num_threads(2)
W = int(sys.argv[1])
rows = [json.loads(l) for l in open(sys.argv[2] if len(sys.argv) > 2 else "/tmp/mixed40.jsonl")]
domain = lambda src: "tests" if any(p in ("test", "tests", "idle_test") or p.startswith("test_") for p in src.split("/")) else "lib"
names = ["specmesh-drafter-tests", "specmesh-drafter-lib"]
models = [load_model(catalog.resolve(n, "draft"), torch.float32, pack=False).eval() for n in names]
target = load_model(catalog.resolve("embedded", "target"), torch.float32, pack=False).eval()
emb = target.embed_tokens.weight if hasattr(target, "embed_tokens") else None
tok = load_tokenizer(catalog.resolve("embedded"))
wins = {k: 0 for k in ("text_agree", "loglik", "target_agree", "target_kl", "paper")}
for r in rows:
    ids = tok.encode(r["prompt"])
    x = torch.tensor([ids])
    with torch.no_grad():
        tl = target(x)[0, :-1][-W:].float()
        tgt = tl.argmax(-1)
        nxt = x[0, 1:][-W:]
        s = {k: [] for k in wins}
        for m in models:
            lg = m(x)[0, :-1][-W:].float()
            lp = F.log_softmax(lg, -1)
            p, a = lp.exp().max(-1)
            s["text_agree"].append(float((a == nxt).float().mean()))
            s["loglik"].append(float(lp.gather(-1, nxt[:, None]).mean()))
            s["target_agree"].append(float((a == tgt).float().mean()))
            E = target.embed.weight.float() if hasattr(target, "embed") else None
            d = F.cosine_similarity(E[a], E[tgt], dim=-1).clamp(0, 1)
            ag, dis = p * d, (1 - p) * (1 - d)
            s["paper"].append(float(torch.where(ag + dis > 0, ag / (ag + dis), torch.zeros_like(ag)).mean()))
            s["target_kl"].append(-float(F.kl_div(lp, F.log_softmax(tl, -1), log_target=True, reduction="batchmean")))
    d = domain(r["source"])
    own = 0 if d == "tests" else 1
    for k in ("text_agree", "loglik", "target_agree", "target_kl", "paper"):
        wins[k] += s[k][own] > s[k][1 - own]
    print(d, len(ids), {k: [round(v, 3) for v in s[k]] for k in s if s[k]})
print(f"W={W}:", {k: f"{v}/{len(rows)}" for k, v in wins.items() })

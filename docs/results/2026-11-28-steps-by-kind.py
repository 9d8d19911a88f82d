"""The steps of `sd` or `cosine` by kind at one client: tokens, verified width and ms a step, and each kind's share of
the decoding time. Usage: python THIS.py sd|cosine (the first 20 of /tmp/s14/mixed40.jsonl: cpu-kind-check.sh's
mixed40.jsonl; 128 new tokens, bf16, 2 threads). `sd`'s kinds: lookup (its prompt lookup proposed) and model (the
draft); `cosine`'s: sure and guess (the context drafter alone, by its cap) and model (a model drafter routed). The
step is Speculative.step's, timed in parts (draft+rest: proposing, verify(), accepting)."""
import collections, sys, time, torch
torch.set_num_threads(2)
from specmesh import LLM, SamplingParams
from specmesh.bench.prompts import load_prompts
from specmesh.methods import speculative as S
prompts = load_prompts("/tmp/s14/mixed40.jsonl", 20)
stats = collections.defaultdict(lambda: [0, 0, 0, 0.0, 0.0])   # kind -> steps, tokens, width, draft s, verify s
orig = S.Speculative.step
def step(self, seqs):
    t0 = time.perf_counter()
    budgets = self.policy.budgets(seqs)
    trees = self.proposer.propose(seqs, budgets)
    t1 = time.perf_counter()
    # classify
    p = self.proposer
    if hasattr(p, "caps"):
        cap = p.caps[0]; kind = "sure" if cap == p.solo_budget else "guess" if cap == p.guess_budget else "model"
    elif hasattr(p, "looked"):
        kind = "lookup" if p.looked[0] else "model"
    else:
        kind = "model"
    logits = self.runner.forward_trees(trees)
    t2 = time.perf_counter()
    self._k = (kind, len(trees[0]), t1 - t0, t2 - t1)
    # redo the rest of step exactly (copied)
    from specmesh.spec.verify import verify
    verdicts = []
    for b, (seq, tree) in enumerate(zip(seqs, trees)):
        seq.stats.draft_s += t1 - t0; seq.stats.verify_s += t2 - t1
        verdict = verify(tree, logits[b, :len(tree)], seq.params, seq.generator, seq.penalty)
        self.runner.cache.commit(b, verdict.path)
        seq.score(logits[b], verdict.path[:len(verdict.tokens)])
        s = seq.stats; s.target_forwards += 1; s.verifications += 1; s.drafted_tokens += len(tree) - 1; s.accepted_tokens += verdict.accepted
        verdicts.append(verdict)
    self.policy.observe(t1 - t0, t2 - t1, [(d, len(t), v.accepted) for d, t, v in zip(budgets, trees, verdicts)])
    self.proposer.accept(seqs, trees, verdicts, logits)
    t3 = time.perf_counter()
    st = stats[(sys.argv[1], kind)]
    st[0] += 1; st[1] += len(verdicts[0].tokens); st[2] += len(trees[0]); st[3] += t1 - t0 + (t3 - t2); st[4] += t2 - t1
    return [v.tokens for v in verdicts]
S.Speculative.step = step
llm = LLM("embedded", method=sys.argv[1], dtype="bfloat16")
for p in prompts[:3]: llm.generate(p, SamplingParams(max_new_tokens=128))
stats.clear()
for p in prompts: llm.generate(p, SamplingParams(max_new_tokens=128))
tot_t = sum(v[3] + v[4] for v in stats.values()); tot_n = sum(v[1] for v in stats.values())
for (m, k), (n, tok, w, d, v) in sorted(stats.items()):
    print(f"{m:7s} {k:6s}: {n:4d} steps, {tok/n:5.2f} tokens a step, width {w/n:5.1f}, draft+rest {d/n*1e3:.2f} ms, verify {v/n*1e3:.2f} ms, {(d+v)/tok*1e3:.3f} ms a token, {100*(d+v)/tot_t:.0f}% of time, {100*tok/tot_n:.0f}% of tokens")
print(f"{sys.argv[1]}: decode {tot_t/tot_n*1e3:.3f} ms a token")

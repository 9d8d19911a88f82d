"""`specmesh simulate --method cosine|sd|tree --concurrency N`: CoSine's cluster on a virtual clock (simulated):
drafters on nodes of their own around a verification server, larger than this machine.

The real methods run here (greedy) on the prompts given, N at a time in one engine of N rows (a request that
finishes hands its row to the next prompt, as N clients in a closed loop would), so every step's batch,
tree sizes and draft levels are the real algorithm's (`Speculative.trace`: rows, tokens verified, draft
forwards one after another, per step: a chain that stopped early and cosine's context drafter, which runs no
forward, cost no level). Only time is modelled, per step, from the profile:

* cosine: each draft level costs a drafter forward on its node (the drafters work at the same time) and a
  round trip to the central node (the fused token out, the candidates back); then the batch's trees go to
  the verification server (a hop) and are verified. Shown twice: coupled (drafting, then verifying), and
  `cosine pipelined`, the paper's collaborative pipeline: two halves of the batch in flight, the drafters
  drafting one while the server verifies the other (each half-step the slower of the two);
* sd and tree (the paper's coupled baselines, Vanilla and SpecInfer): the draft runs on the verification
  server, one draft forward per level, then the verification, with no hop.

A verification of Γ tokens costs base_ms + per_token_ms * max(0, Γ - flat_tokens) (memory-bound up to
flat_tokens). CLUSTER's figures are assumptions stated here, not measurements, for the paper's Qwen pair
(a 32B target on 4 A100s, 0.5B drafters on RTX 3090 nodes, 10 Gbps Ethernet "with sub-1ms latency"): a
verification 30 ms (64 GB of bf16 weights read at ~4 x 1.5 TB/s is 11 ms, plus the launches of 64 layers
under tensor and pipeline parallelism) and 0.02 ms per token past 128; a drafter forward 6 ms on its 3090
(1 GB of weights is 1.1 ms; 24 layers of eager kernel launches the rest), 4 ms for the same draft on an
A100 beside the target; a hop 0.5 ms. A JSON file of this shape replaces it (`--profile`).
"""
from __future__ import annotations

from dataclasses import dataclass

from specmesh.simulator.split_target import load_profile

CLUSTER = {"name": "gpu-cluster", "verify_base_ms": 30.0, "verify_per_token_ms": 0.02, "flat_tokens": 128,
           "drafter_ms": 6.0, "server_draft_ms": 4.0, "hop_ms": 0.5}
METHODS = ("cosine", "sd", "tree")
SD_GAMMA = 4


@dataclass
class ClusterProfile:
    name: str
    verify_base_ms: float
    verify_per_token_ms: float
    flat_tokens: int
    drafter_ms: float           # a drafter forward on its own node
    server_draft_ms: float      # the baselines' draft forward on the verification server
    hop_ms: float               # one way between nodes

    @classmethod
    def load(cls, spec: str) -> "ClusterProfile":
        return load_profile(cls, spec, CLUSTER)

    def verify_ms(self, tokens: int) -> float:
        return self.verify_base_ms + self.verify_per_token_ms * max(0, tokens - self.flat_tokens)

    def step_ms(self, method: str, tokens: int, levels: int, pipelined: bool = False) -> float:
        """One engine step: `levels` draft levels, then one verification of `tokens` tokens. `pipelined`
        (cosine's collaborative pipeline): two halves of the batch in flight, the drafter nodes drafting one
        while the server verifies the other, so a step costs the slower of the two (each on half the rows)."""
        if method != "cosine":
            return levels * self.server_draft_ms + self.verify_ms(tokens)
        draft = levels * (self.drafter_ms + 2 * self.hop_ms) + self.hop_ms
        if pipelined:
            return 2 * max(draft, self.verify_ms(tokens // 2))      # two half-steps make one step of every row
        return draft + self.verify_ms(tokens)


def run_traced(method: str, prompts: list[str], concurrency: int, max_new_tokens: int, profile: ClusterProfile,
               target: str | None, draft: str | None = None, drafters: str | None = None) -> dict:
    """The real method on the prompts, `concurrency` at a time (one engine of that many rows): its per-step trace
    and token counts.
    sd drafts SD_GAMMA tokens whatever the batch (as the paper's Vanilla; specmesh's default stops drafting in a
    wide batch, a rule measured on CPUs); cosine's scheduler plans on the profile's costs, not this machine's,
    with the server's flat_tokens as its token budget Γ_max."""
    from specmesh import LLM, SamplingParams
    from specmesh.methods.cosine_schedule import Scheduled
    if method == "cosine":          # the verification server takes flat_tokens a step at the cost of one
        options = {"token_budget": profile.flat_tokens} | ({"drafters": drafters} if drafters else {})
    else:
        options = {"draft": draft} | ({"gamma": SD_GAMMA} if method == "sd" else {})
    llm = LLM(target=target, method=method, max_batch=concurrency, **options)
    params = SamplingParams(max_new_tokens=max_new_tokens)
    ids = [llm.encode(p) for p in prompts]
    engine = llm.engine_for(llm.method)
    engine.method.trace = []
    if isinstance(engine.method.policy, Scheduled):        # cosine's scheduler: a level on the drafter nodes
        engine.method.policy.costs = (profile.verify_base_ms, profile.verify_per_token_ms,
                                      profile.drafter_ms + 2 * profile.hop_ms)
    seqs = [s for i in ids for s in engine.sequences(i, params)]
    engine.complete([seqs])
    llm.close()
    return {"trace": engine.method.trace, "tokens": sum(len(s.tokens) for s in seqs)}


def simulate_cluster(methods: list[str], concurrency: int, profile: ClusterProfile, prompts: list[str],
                     max_new_tokens: int, target: str | None = None, draft: str | None = None,
                     drafters: str | None = None) -> dict:
    """Each method's simulated throughput with `concurrency` requests in flight (all the prompts, each admitted as a
    row frees), and ratios to sd's."""
    if len(prompts) < concurrency:
        raise ValueError(f"--concurrency {concurrency} needs as many prompts, got {len(prompts)}")
    rows = {}
    for method in methods:
        run = run_traced(method, prompts, concurrency, max_new_tokens, profile, target, draft, drafters)
        steps = len(run["trace"])
        for label, pipelined in ([(f"{method} pipelined", True)] if method == "cosine" else []) + [(method, False)]:
            ms = sum(profile.step_ms(method, tokens, levels, pipelined) for _, tokens, levels in run["trace"])
            rows[label] = {"tokens": run["tokens"], "steps": steps, "ms": ms,
                           "tokens_per_s": 1000 * run["tokens"] / ms,
                           "tokens_per_step": run["tokens"] / steps if steps else None,
                           "most_rows": max((n for n, _, _ in run["trace"]), default=0)}
    if "sd" in rows:
        for row in rows.values():
            row["vs_sd"] = row["tokens_per_s"] / rows["sd"]["tokens_per_s"]
    return {"simulated": True, "profile": profile.name, "concurrency": concurrency, "requests": len(prompts),
            "max_new_tokens": max_new_tokens, "methods": rows}


def print_cluster(result: dict, file) -> None:
    print(f"[simulated, profile {result['profile']}] {result['requests']} requests, {result['concurrency']} at once",
          file=file)
    for method, row in result["methods"].items():
        ratio = f", {row['vs_sd']:.2f}x sd" if "vs_sd" in row else ""
        print(f"  {method:17} {row['tokens_per_s']:8.1f} tokens/s ({row['tokens_per_step']:.2f} tokens a step, "
              f"{row['steps']} steps{ratio})", file=file)

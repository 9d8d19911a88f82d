"""`specmesh simulate`: PipeDec, PP and STPP on a virtual clock, for more pipeline stages than exist.

The real algorithms run in one process with the real models, so every emitted token,
hit and miss is what the pipeline would produce (pipedec: specmesh.pipedec; pp: `ar`;
stpp: the `tree` method's static trees); only time is modelled, per stage, from a cost
profile. Results say "simulated".

Clock, per method (n stages):
* pp: each token is one pass, n x (stage(1) + hop).
* pipedec: each timestep costs max(draft(layer), stage(tokens in flight)) + hop + broadcast,
  where a stage's tokens are the widest of the last n drafted layers (an upper bound:
  pruning only removes nodes in flight); a hit makes the next token wait 1 timestep, a
  miss n (pipedec.run counts them).
* stpp: each round drafts its whole tree (one draft step per level), then one pass of the
  tree through all stages: depth x draft(width) + n x (stage(tree size) + hop) + broadcast.

Profiles: `gpu-cluster` models the paper's setting (a stage step 10 ms for up to 64 tokens
plus 0.1 ms per token beyond, a hop 0.5 ms, the draft 4 ms per tree layer, the hit
broadcast 0.5 ms); `local` is measured on this machine (`specmesh simulate --calibrate`,
shipped as models/profile-local.json): the whole target's forward time per token count,
split evenly over the stages (the stage count need not divide the layers), the draft's per
layer width, and a gloo round trip for hops and broadcasts; or a JSON file of either shape.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from specmesh import embedded

METHODS = ("pipedec", "pp", "stpp")
GPU_CLUSTER = {"name": "gpu-cluster", "stage": {"base_ms": 10.0, "flat_tokens": 64, "per_token_ms": 0.1},
               "draft": {"per_layer_ms": 4.0}, "hop_ms": 0.5, "broadcast_ms": 0.5}
LOCAL = embedded.ROOT / "models" / "profile-local.json"


@dataclass
class Profile:
    name: str
    stage: dict
    draft: dict
    hop_ms: float
    broadcast_ms: float

    @classmethod
    def load(cls, spec: str) -> "Profile":
        if spec == "gpu-cluster":
            return cls(**GPU_CLUSTER)
        path = LOCAL if spec == "local" else Path(spec)
        if not path.is_file():
            hint = " (run `specmesh simulate --calibrate` to measure it)" if spec == "local" else ""
            raise FileNotFoundError(f"profile not found: {path}{hint}")
        return cls(**json.loads(path.read_text()))

    def stage_ms(self, tokens: int, stages: int) -> float:
        s = self.stage
        if "tokens" in s:                                   # measured: the whole model, split evenly
            return float(np.interp(tokens, s["tokens"], s["ms"])) / stages
        return s["base_ms"] + s["per_token_ms"] * max(0, tokens - s["flat_tokens"])

    def draft_ms(self, tokens: int) -> float:
        d = self.draft
        return float(np.interp(tokens, d["tokens"], d["ms"])) if "tokens" in d else d["per_layer_ms"]


@dataclass
class SimConfig:
    method: str
    stages: int
    profile: Profile
    max_new_tokens: int = 128
    tree_width: int = 32            # pipedec: w; stpp: nodes kept per level
    max_children: int = 16          # pipedec: c; stpp: children per node
    depth: int = 5                  # stpp: levels of its static tree
    target: str | None = None
    draft: str | None = None


@dataclass
class Result:
    tokens: list[int]
    ms: float                       # simulated time of the decoding
    timesteps: int
    hits: int = 0
    decisions: int = 0


class Simulator:
    """The models once, then one simulated run per prompt."""

    def __init__(self, cfg: SimConfig):
        from specmesh import LLM
        from specmesh.loader import load_model
        self.cfg = cfg
        if cfg.method == "stpp":
            self.llm = LLM(target=cfg.target, draft=cfg.draft, method="tree", gamma=cfg.depth,
                           tree_width=cfg.tree_width, max_children=cfg.max_children)
        else:
            self.llm = LLM(target=cfg.target)
        self.draft = None
        if cfg.method == "pipedec":
            self.draft = load_model(Path(cfg.draft) if cfg.draft else embedded.path("draft"), torch.float32, "cpu")

    def __call__(self, ids: list[int]) -> Result:
        from specmesh import pipedec
        from specmesh.sampling import SamplingParams
        cfg, p, n = self.cfg, self.cfg.profile, self.cfg.stages
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens)
        if cfg.method == "pipedec":
            with torch.inference_mode():
                tl = pipedec.run(self.llm.models.target, self.draft, ids, params, cfg.max_new_tokens, n,
                                 cfg.tree_width, cfg.max_children)
            ms = sum(max(p.draft_ms(width), p.stage_ms(max(tl.widths[max(0, t - n + 1):t + 1]), n))
                     + p.hop_ms + p.broadcast_ms for t, width in enumerate(tl.widths))
            return Result(tl.tokens, ms, tl.timesteps, tl.hits, len(tl.outcomes))
        out = self.llm.generate(ids, params)
        if cfg.method == "pp":                              # one full pass per token
            return Result(out.tokens, len(out.tokens) * n * (p.stage_ms(1, n) + p.hop_ms), len(out.tokens) * n)
        rounds = max(1, out.stats.verifications)            # stpp: draft the whole tree, then one pass
        size = 1 + out.stats.drafted_tokens / rounds
        per_round = (cfg.depth * p.draft_ms(cfg.tree_width) + n * (p.stage_ms(round(size), n) + p.hop_ms)
                     + p.broadcast_ms)
        return Result(out.tokens, rounds * per_round, rounds * (cfg.depth + n))


def simulate(cfg: SimConfig, prompts: list[str]) -> dict:
    """The JSON of `specmesh simulate`, aggregated over the prompts (`tokens`: the first prompt's)."""
    from tqdm import tqdm
    sim = Simulator(cfg)
    results = [sim(sim.llm.encode(p)) for p in tqdm(prompts, desc=f"simulate {cfg.method}", unit="prompt")]
    tokens = sum(len(r.tokens) for r in results)
    ms = sum(r.ms for r in results)
    decisions = sum(r.decisions for r in results)
    return {"method": cfg.method, "stages": cfg.stages, "simulated": True, "profile": cfg.profile.name,
            "ms_per_token": ms / tokens, "tokens_per_s": 1000 * tokens / ms,
            "tokens_per_timestep": tokens / sum(r.timesteps for r in results),
            "hit_rate": sum(r.hits for r in results) / decisions if decisions else None,
            "tokens": results[0].tokens}


def calibrate(out: Path, counts=(1, 2, 4, 8, 16, 32, 64, 128), context: int = 256) -> dict:
    """Measure this machine's costs (bf16, all threads) and write the `local` profile."""
    from specmesh.loader import load_model
    from specmesh.timing import forward_ms

    with torch.inference_mode():
        target = load_model(embedded.path("target"), torch.bfloat16, "cpu")
        draft = load_model(embedded.path("draft"), torch.bfloat16, "cpu", draft=True)
        stage = [forward_ms(target, T, context, reps=7) for T in counts]
        drafts = [forward_ms(draft, T, context, reps=7) for T in counts]
    hop = gloo_one_way_ms(target.config.hidden_size)
    profile = {"name": "local", "stage": {"tokens": list(counts), "ms": stage, "whole_model": True},
               "draft": {"tokens": list(counts), "ms": drafts}, "hop_ms": hop, "broadcast_ms": hop}
    out.write_text(json.dumps(profile, indent=2) + "\n")
    return profile


def gloo_one_way_ms(hidden: int, tokens: int = 32, reps: int = 50) -> float:
    """Half a gloo round trip of a [tokens, hidden] activation between two ranks (threads) here."""
    import datetime
    import threading
    import torch.distributed as dist
    store = dist.HashStore()
    groups = [None, None]

    def make(rank):
        groups[rank] = dist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=30))

    threads = [threading.Thread(target=make, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    x = torch.randn(tokens, hidden)

    def echo():
        y = torch.empty_like(x)
        for _ in range(reps + 5):
            groups[1].recv([y], 0, 0).wait()
            groups[1].send([y], 0, 0).wait()

    t = threading.Thread(target=echo)
    t.start()
    y = torch.empty_like(x)
    times = []
    for _ in range(reps + 5):
        start = time.perf_counter()
        groups[0].send([x], 1, 0).wait()
        groups[0].recv([y], 1, 0).wait()
        times.append(time.perf_counter() - start)
    t.join()
    return float(np.median(times[5:])) * 1e3 / 2


def sweep_plot(base: SimConfig, prompts: list[str], path: str, depths=(7, 14, 21)) -> dict:
    """Simulated ms per token against pipeline depth for the three methods, drawn to `path`."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install -e .[plot]") from None
    table = {m: [simulate(SimConfig(m, n, base.profile, base.max_new_tokens, base.tree_width, base.max_children,
                                    base.depth, base.target, base.draft), prompts)["ms_per_token"]
                 for n in depths] for m in METHODS}
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for m, ms in table.items():
        ax.plot(depths, ms, marker="o", label=m)
    ax.set_xlabel("pipeline stages")
    ax.set_ylabel("ms per token (simulated)")
    ax.set_xticks(list(depths))
    ax.set_title(f"simulated, profile {base.profile.name}: w={base.tree_width}, c={base.max_children}", fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return {"simulated": True, "profile": base.profile.name, "stages": list(depths), "ms_per_token": table}

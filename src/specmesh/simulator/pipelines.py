"""`specmesh simulate`: PipeDec, PP and STPP on a virtual clock, for more pipeline stages than exist.

The real algorithms run in one process with the real models, so every emitted token,
hit and miss is what the pipeline would produce (pipedec: specmesh.methods.pipeline.schedule.run, which
follows the distributed runtime timestep by timestep; pp: `ar`; stpp: the `tree`
method's static trees); only time is modelled, per stage, from a cost profile. Results
say "simulated".

Clock, per method (n stages holding `layers[i]` target layers each):
* pp: each token is one pass: the sum of the stages' steps on 1 token, plus n hops.
* pipedec: each timestep costs the slowest rank's work plus a hop and the decision's
  broadcast: stage i's step on the nodes it processes in that timestep (pipedec.run
  reports them), S's step on the layer it grows (added to stage 0's when S shares its
  process, as on this machine).
* stpp: each round drafts its whole tree (S's time per level of that width), then one pass of
  the tree through all stages (each layer's step on tree nodes, which see their ancestors
  only), plus the decision's broadcast.

Profiles: `gpu-cluster` models the paper's setting (a stage step 10 ms for up to 64 tokens
plus 0.1 ms per token beyond, a hop 0.5 ms, the draft 4 ms per tree layer, the broadcast
0.5 ms, S on a node of its own); `local` is measured on this machine with one thread per
process, as the real pipelines run (`specmesh simulate --calibrate`, shipped as
models/profile-local.json): a target layer's and the head's time per token count (a chain's and a
tree's), S's work per pipedec timestep and per stpp level by width, a hop between processes through the
runtime's link; stages hold the layers
the real runtime gives them (pipedec: the split balanced for its steady state), or an
equal share of them when there are more stages than layers. Or a JSON file of either shape.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from specmesh import embedded
from specmesh.runtime.pipeline import balanced_layers, stage_layers
from specmesh.simulator.split_target import load_profile

METHODS = ("pipedec", "pp", "stpp")
GPU_CLUSTER = {"name": "gpu-cluster", "stage": {"base_ms": 10.0, "flat_tokens": 64, "per_token_ms": 0.1},
               "draft": {"per_layer_ms": 4.0}, "hop_ms": 0.5, "broadcast_ms": 0.5, "draft_beside_stage0": False}
LOCAL = embedded.ROOT / "models" / "profile-local.json"


@dataclass
class Profile:
    name: str
    stage: dict
    draft: dict
    hop_ms: float
    broadcast_ms: float
    draft_beside_stage0: bool = False       # S shares stage 0's process (its work adds to stage 0's)
    link_ms: float | None = None            # one way between two hosts (`--calibrate --hosts`; None: not measured)
    link_gbit: float | None = None          # every rank on a host of its own, links of this rate (simulate --link)
    # the real runtime's own work beyond the modelled costs (calibrate measures it): per pipedec timestep, per pp
    # pass, per stpp round
    timestep_ms: float = 0.0
    pass_ms: float = 0.0
    round_ms: float = 0.0
    split: dict | None = None               # `sd --tp 2`'s costs (simulator/split_hosts.py)
    drafters: dict | None = None            # cosine's drafters' costs (simulator/drafter_hosts.py)

    def hop(self, nbytes: int = 0) -> float:
        """One message of `nbytes` between ranks: `hop_ms` within a host; across hosts (link_gbit set) the measured
        latency plus the bytes at the link's rate."""
        if self.link_gbit is None:
            return self.hop_ms
        if self.link_ms is None:
            raise ValueError("--link needs the profile's latency between hosts: run `specmesh simulate --calibrate "
                             "--hosts` (root) first")
        return self.link_ms + nbytes * 8 / (self.link_gbit * 1e6)

    def broadcast(self) -> float:
        """A decision from the last stage to every other rank (across hosts: one small message each, at once)."""
        return self.broadcast_ms if self.link_gbit is None else self.hop()

    @classmethod
    def load(cls, spec: str) -> "Profile":
        return load_profile(cls, spec, GPU_CLUSTER, LOCAL)

    @property
    def per_layer(self) -> bool:
        return "layer_ms" in self.stage

    def stage_ms(self, tokens: int, layers: float = 1.0, last: bool = False, tree: bool = False) -> float:
        """A stage's step on `tokens` new tokens (0: idle), holding `layers` layers (and the head if `last`);
        `tree`: the tokens are a whole tree's nodes, each seeing its ancestors (stpp), where the profile
        measured those (`tree_layer_ms`), else as a chain."""
        s = self.stage
        if tokens == 0:
            return 0.0
        if not self.per_layer:                              # a fixed cost per stage step
            return s["base_ms"] + s["per_token_ms"] * max(0, tokens - s["flat_tokens"])
        kind = "tree_" if tree and "tree_layer_ms" in s else ""
        head = float(np.interp(tokens, s["tokens"], s[kind + "head_ms"])) if last else 0.0
        return layers * float(np.interp(tokens, s["tokens"], s[kind + "layer_ms"])) + head

    def draft_ms(self, tokens: int) -> float:
        """S's work in a pipedec timestep growing a layer of `tokens` nodes."""
        d = self.draft
        return float(np.interp(tokens, d["tokens"], d["ms"])) if "tokens" in d else d["per_layer_ms"]

    def level_ms(self, width: int) -> float:
        """A level of stpp's static tree of `width` nodes a level, drafted (`level_ms` where measured, else as a
        pipedec layer)."""
        d = self.draft
        return float(np.interp(width, d["tokens"], d["level_ms"])) if "level_ms" in d else self.draft_ms(width)

    def layers(self, method: str, stages: int, num_layers: int, width: int) -> list[float]:
        """Target layers per stage: the real runtime's split, or equal shares for more stages than layers."""
        if not self.per_layer or stages > num_layers:
            return [num_layers / stages] * stages
        if method != "pipedec":
            return [len(r) for r in stage_layers(num_layers, stages)]
        first = self.draft_ms(width) if self.draft_beside_stage0 else 0.0
        split = balanced_layers(num_layers, stages, first, self.stage_ms(width), self.stage_ms(1),
                                self.stage_ms(1, 0, last=True))
        return [len(r) for r in split]


@dataclass
class SimConfig:
    method: str
    stages: int
    profile: Profile
    max_new_tokens: int = 128
    tree_width: int = 32            # pipedec: w; stpp: nodes kept per level
    max_children: int = 16          # pipedec: c; stpp: children per node
    depth: int = 5                  # stpp: levels of its static tree
    draft_window: int = 64          # prompt tokens the draft reads
    target: str | None = None
    draft: str | None = None


@dataclass
class Result:
    tokens: list[int]
    ms: float                       # simulated time of the prompt's pass and the decoding
    timesteps: int
    hits: int = 0
    decisions: int = 0
    steps: int = 0                  # pipedec timesteps, pp passes or stpp rounds (the runtime's own work is by them)


class Simulator:
    """The models once, then one simulated run per prompt."""

    def __init__(self, cfg: SimConfig):
        from specmesh import LLM, catalog
        from specmesh.llm import check_vocabularies
        from specmesh.model.loader import load_model
        self.cfg = cfg
        if cfg.method == "stpp":
            self.llm = LLM(target=cfg.target, draft=cfg.draft, method="tree", gamma=cfg.depth,
                           tree_width=cfg.tree_width, max_children=cfg.max_children, draft_window=cfg.draft_window,
                           min_prob=0.0, lookup=0)                # STPP's static tree, whatever the draft's options
        else:
            self.llm = LLM(target=cfg.target, method="ar")         # the target alone: nothing for auto to measure
        self.draft = None
        if cfg.method == "pipedec":
            target = catalog.resolve(cfg.target)
            draft = catalog.required_draft(target, cfg.draft, "pipedec")
            check_vocabularies(target, draft)
            self.draft = load_model(draft, torch.float32, "cpu")
        self.layers = cfg.profile.layers(cfg.method, cfg.stages, self.llm.models.target.config.num_layers,
                                         cfg.tree_width)

    def packet_bytes(self, tokens: int) -> int:
        """A packet between stages: its hidden states in float32 and a tree's meta rows (runtime/pipeline.py)."""
        return tokens * (4 * self.llm.models.target.config.hidden_size + 8 * (3 + tokens))

    def pass_ms(self, tokens: int, tree: bool = False) -> float:
        """One packet of `tokens` through every stage in turn (the last hop: the token or decision back)."""
        p, n = self.cfg.profile, self.cfg.stages
        hops = (n - 1) * p.hop(self.packet_bytes(tokens)) + p.hop()
        return sum(p.stage_ms(tokens, k, i == n - 1, tree) for i, k in enumerate(self.layers)) + hops

    def timestep_ms(self, loads: list[int], width: int) -> float:
        """PipeDec: every rank works at once; the slowest sets the pace."""
        p, n = self.cfg.profile, self.cfg.stages
        work = [p.stage_ms(t, k, i == n - 1) for i, (t, k) in enumerate(zip(loads, self.layers))]
        if p.draft_beside_stage0:
            work[0] += p.draft_ms(width)
        else:
            work.append(p.draft_ms(width))
        return max(work) + p.hop(self.packet_bytes(width)) + p.broadcast() + p.timestep_ms

    def __call__(self, ids: list[int]) -> Result:
        from specmesh.methods.pipeline import schedule as pipedec
        from specmesh.lossless.sampling import SamplingParams
        cfg, p = self.cfg, self.cfg.profile
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens)
        prompt = self.pass_ms(len(ids))                     # the prompt's pass, which gives the first token
        if cfg.method == "pipedec":
            with torch.inference_mode():
                tl = pipedec.run(self.llm.models.target, self.draft, ids, params, cfg.max_new_tokens, cfg.stages,
                                 cfg.tree_width, cfg.max_children, cfg.draft_window)
            ms = sum(self.timestep_ms(loads, width) for loads, width in zip(tl.loads, tl.widths))
            return Result(tl.tokens, prompt + ms, tl.timesteps, tl.hits, len(tl.outcomes), tl.timesteps)
        out = self.llm.generate(ids, params)
        if cfg.method == "pp":                              # then one full pass per token
            passes = len(out.tokens) - 1
            return Result(out.tokens, prompt + passes * (self.pass_ms(1) + p.pass_ms), len(out.tokens) * cfg.stages,
                          steps=passes)
        rounds = max(1, out.stats.verifications)            # stpp: draft the whole tree, then one pass
        size = 1 + out.stats.drafted_tokens / rounds
        per_round = cfg.depth * p.level_ms(cfg.tree_width) + self.pass_ms(round(size), tree=True) + p.broadcast() \
            + p.round_ms
        return Result(out.tokens, prompt + rounds * per_round, rounds * (cfg.depth + cfg.stages), steps=rounds)


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


def sweep_plot(base: SimConfig, prompts: list[str], path: str, depths=(7, 14, 21)) -> dict:
    """Simulated ms per token against pipeline depth for the three methods, drawn to `path`."""
    from specmesh.bench.report import pyplot
    plt = pyplot()
    table = {m: [simulate(dataclasses.replace(base, method=m, stages=n), prompts)["ms_per_token"] for n in depths]
             for m in METHODS}
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

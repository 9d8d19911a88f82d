"""`specmesh simulate --method sd --tp N --link RATE`: `sd` with its target split over N ranks (runtime/
tensor_parallel.py), every rank on a host of its own, on a virtual clock from costs measured on this machine.

The real `sd` runs here in one process (greedy, the same options), so every round, draft and verification is the
algorithm's; as in pearl's simulation (simulator/parallel_draft.py), rank 0's own work (the engine, drafting's
bookkeeping, verification) is timed as this process runs it, and each model forward is priced from the profile's
`split` entry (`specmesh simulate --calibrate`: one thread a rank, as on hosts of one core) instead:

    a target forward of w tokens = rank 0's shard on w tokens (its part of every layer, and the head)
                                   + 2 L sums, each a hop of w x hidden float32 (every rank sends its part to
                                     the others at once) + the forward's message to the other ranks (a hop)
                                   + the split runtime's own work a forward (`forward_ms`)
    a draft forward of w tokens  = the whole draft's on w tokens (rank 0 holds it)

A hop is `Profile.hop`: the latency between hosts plus the bytes at the link's rate (`--link`), or a message
between processes of one host without it. `forward_ms` (the sums' and messages' handling in Python, the other
ranks' repeats of rank 0's cache changes) is calibrated: the real `sd --tp N` on one host less the same run
simulated, per target forward.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from specmesh.simulator.pipelines import Profile

WIDTHS = (1, 2, 4, 8, 16, 32, 64)       # the forward widths the profile measures
WORLD = 2                               # ranks the profile's shard is of
GAMMA = 4                               # sd's draft length, as calibrated


@dataclass
class Split:
    world: int
    layers: int
    hidden: int
    tokens: list
    shard_ms: list              # rank 0's forward of each width: its shard of every layer and the head, no sums
    draft_ms: list              # the whole draft's forward of each width
    forward_ms: float = 0.0     # the split runtime's own work a target forward beyond these (calibrated)

    def target_ms(self, tokens: int, p: Profile) -> float:
        """A target forward of `tokens` over the ranks (module docstring)."""
        shard = float(np.interp(tokens, self.tokens, self.shard_ms))
        return shard + 2 * self.layers * p.hop(4 * tokens * self.hidden) + p.hop() + self.forward_ms

    def draft_step_ms(self, tokens: int) -> float:
        return float(np.interp(tokens, self.tokens, self.draft_ms))


def measure(target, draft, widths=WIDTHS) -> list[float]:
    """One round of the split's costs: rank 0's shard (`target`, loaded with part=(0, WORLD)) and the draft by
    width (the shard's and the draft's figures for each width in turn, each the median of a few runs)."""
    from specmesh.timing import widths_ms
    shard, whole = widths_ms(target, widths, reps=5), widths_ms(draft, widths, reps=5)
    return [ms for w in widths for ms in (shard[w], whole[w])]


def entry(fastest: list[float], target, widths=WIDTHS) -> dict:
    """The profile's `split` entry from each cost's fastest over the rounds of `measure`."""
    cfg = target.config
    return {"world": WORLD, "layers": cfg.num_layers, "hidden": cfg.hidden_size, "tokens": list(widths),
            "shard_ms": fastest[0::2], "draft_ms": fastest[1::2]}


class Priced:
    """A model's forwards as this process runs them (`real_ms`) and as the profile prices them (`ms`, by the
    forward's tokens): forward hooks on the module."""

    def __init__(self, model, price):
        self.price, self.real_ms, self.ms, self.forwards, self.began = price, 0.0, 0.0, 0, 0.0
        model.register_forward_pre_hook(self._begin)
        model.register_forward_hook(self._end)

    def _begin(self, _, args) -> None:
        self.began = time.perf_counter()

    def _end(self, _, args, out) -> None:
        self.real_ms += 1e3 * (time.perf_counter() - self.began)
        self.ms += self.price(args[0].shape[1])                # x: ids [B, T] (or hidden [B, T, D])
        self.forwards += 1


class Simulator:
    """The real `sd` in this process, its forwards priced: `__call__(ids)` -> (answer, simulated ms, target
    forwards)."""

    def __init__(self, profile: Profile, max_new_tokens: int, gamma: int, target: str | None = None,
                 draft: str | None = None, forward_ms: float | None = None):
        from specmesh import LLM, SamplingParams
        if profile.split is None:
            raise ValueError(f"profile {profile.name} has no costs of a split target: run `specmesh simulate "
                             "--calibrate --hosts` (root) first")
        self.split = Split(**profile.split)
        if forward_ms is not None:
            self.split.forward_ms = forward_ms
        self.params = SamplingParams(max_new_tokens=max_new_tokens)
        self.llm = LLM(target=target, draft=draft, method="sd", gamma=gamma)
        self.llm.generate(self.llm.encode("def f():"), SamplingParams(max_new_tokens=4))    # a warm-up, untimed
        self.target = Priced(self.llm.models.target, lambda w: self.split.target_ms(w, profile))
        self.draft = Priced(self.llm.models.draft, self.split.draft_step_ms)

    def __call__(self, ids: list[int]):
        from specmesh.timing import torch_threads
        spent = [(p.real_ms, p.ms, p.forwards) for p in (self.target, self.draft)]
        with torch_threads(1):                              # rank 0's, as on a host of one core
            began = time.perf_counter()
            answer = self.llm.generate(ids, self.params)
            own = 1e3 * (time.perf_counter() - began)
        (t_real, t_ms, forwards), (d_real, d_ms, _) = ((p.real_ms - r, p.ms - m, p.forwards - n)
                                                        for p, (r, m, n) in zip((self.target, self.draft), spent))
        return answer, own - t_real - d_real + t_ms + d_ms, forwards

    def close(self) -> None:
        self.llm.close()


def own_work_ms(real_ms: float, sim, ids: list[int], runs: int = 3) -> float:
    """A runtime's own work per unit the simulator `sim` counts (split_hosts': target forwards; drafter_hosts':
    reads): a real answer to `ids` on one host (`real_ms`, the fastest of its runs) less the same answer simulated
    without that work (the fastest of `runs`). Closes `sim`."""
    try:
        modelled, units = min(sim(ids)[1:] for _ in range(runs))
    finally:
        sim.close()
    return max(0.0, (real_ms - modelled) / max(1, units))


def simulate(profile: Profile, world: int, prompts: list[str], max_new_tokens: int, gamma: int,
             target: str | None = None, draft: str | None = None) -> dict:
    """The JSON of `specmesh simulate --method sd --tp N`, aggregated over the prompts (`tokens`: the first's)."""
    if profile.split is not None and world != profile.split["world"]:
        raise ValueError(f"the profile's split target is measured over {profile.split['world']} ranks, not {world}: "
                         f"--tp {profile.split['world']}")
    sim = Simulator(profile, max_new_tokens, gamma, target, draft)
    return {"method": "sd", "tp": world, "gamma": gamma} | answered(sim, prompts, profile)


def answered(sim, prompts: list[str], profile: Profile) -> dict:
    """A simulator's (split_hosts', drafter_hosts') answers to `prompts`, aggregated: the JSON's common part
    (`tokens`: the first prompt's). Closes `sim`."""
    try:
        runs = [sim(ids)[:2] for ids in map(sim.llm.encode, prompts)]
    finally:
        sim.close()
    tokens, ms = sum(len(a.tokens) for a, _ in runs), sum(ms for _, ms in runs)
    rounds = sum(a.stats.verifications for a, _ in runs)
    return {"simulated": True, "profile": profile.name, "ms_per_token": ms / tokens, "tokens_per_s": 1000 * tokens / ms,
            "tokens_per_round": tokens / rounds, "tokens": runs[0][0].tokens}

"""`specmesh simulate --method sd --tp N --link RATE`: `sd` with its target split over N ranks (runtime/
tensor_parallel.py), every rank on a host of its own, on a virtual clock from costs measured on this machine.

The tokens and rounds are the real algorithm's: `sd` runs here in one process (greedy) with the same options, and
its counts (rounds, draft forwards, tokens drafted) set the clock. Time is modelled from the profile's `split`
entry (`specmesh simulate --calibrate`: one thread a rank, as on hosts of one core):

    a target forward of w tokens = rank 0's shard on w tokens (its part of every layer, and the head)
                                   + 2 L sums, each a hop of w x hidden float32 (every rank sends its part to
                                     the others at once) + the forward's message to the other ranks (a hop)
    a round   = its draft forwards (the draft whole on rank 0) + a forward of 1 + its drafts + the runtime's
                own work a round (`round_ms`: the real `sd --tp N` on one host less the same run modelled)
    the prompt = a forward of its tokens and the draft's pass over them

A hop is `Profile.hop`: the latency between hosts plus the bytes at the link's rate (`--link`), or a message
between processes of one host without it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specmesh.simulator.pipelines import Profile

WIDTHS = (1, 2, 4, 8, 16, 32, 64)       # the forward widths the profile measures
WORLD = 2                               # ranks the profile's shard is of


@dataclass
class Split:
    world: int
    layers: int
    hidden: int
    tokens: list
    shard_ms: list              # rank 0's forward of each width: its shard of every layer and the head, no sums
    draft_ms: list              # the whole draft's forward of each width
    round_ms: float = 0.0       # the real runtime's own work a round beyond these (calibrated)

    def forward_ms(self, tokens: int, p: Profile) -> float:
        """A target forward of `tokens` over the ranks (module docstring)."""
        shard = float(np.interp(tokens, self.tokens, self.shard_ms))
        return shard + 2 * self.layers * p.hop(4 * tokens * self.hidden) + p.hop()

    def draft_step_ms(self, tokens: int = 1) -> float:
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


def counts(ids: list[int], answer) -> dict:
    """What the clock needs of an answer to the prompt `ids`."""
    s = answer.stats
    return {"prompt": len(ids), "tokens": len(answer.tokens), "rounds": s.verifications,
            "draft_forwards": s.draft_forwards, "drafted": s.drafted_tokens, "answer": answer.tokens}


def clock(c: dict, split: Split, p: Profile, round_ms: float | None = None) -> float:
    """A run's simulated time in ms from its `counts` (`round_ms`: the runtime's own work a round, default the
    profile's)."""
    rounds = max(1, c["rounds"])
    width = round(1 + c["drafted"] / rounds)
    work = split.round_ms if round_ms is None else round_ms
    prompt = split.forward_ms(c["prompt"], p) + split.draft_step_ms(c["prompt"])
    return prompt + c["draft_forwards"] * split.draft_step_ms() + rounds * (split.forward_ms(width, p) + work)


def work_ms(fastest_ms: float, c: dict, profile: Profile) -> float:
    """The runtime's own work a round: a real run on one host (`fastest_ms`, its `counts` c) less the same run
    modelled without it."""
    return max(0.0, (fastest_ms - clock(c, Split(**profile.split), profile, round_ms=0.0)) / max(1, c["rounds"]))


def simulate(profile: Profile, world: int, prompts: list[str], max_new_tokens: int, gamma: int,
             target: str | None = None, draft: str | None = None) -> dict:
    """The JSON of `specmesh simulate --method sd --tp N`, aggregated over the prompts (`tokens`: the first's)."""
    if profile.split is None:
        raise ValueError(f"profile {profile.name} has no costs of a split target: run `specmesh simulate "
                         "--calibrate --hosts` (root) first")
    split = Split(**profile.split)
    if world != split.world:
        raise ValueError(f"the profile's split target is measured over {split.world} ranks, not {world}: "
                         f"--tp {split.world}")
    from specmesh import LLM, SamplingParams
    params = SamplingParams(max_new_tokens=max_new_tokens)
    with LLM(target=target, draft=draft, method="sd", gamma=gamma) as llm:         # the real sd, one process
        runs = [counts(ids, llm.generate(ids, params)) for ids in map(llm.encode, prompts)]
    tokens, ms = sum(r["tokens"] for r in runs), sum(clock(r, split, profile) for r in runs)
    rounds = sum(r["rounds"] for r in runs)
    return {"method": "sd", "tp": world, "simulated": True, "profile": profile.name, "gamma": gamma,
            "ms_per_token": ms / tokens, "tokens_per_s": 1000 * tokens / ms, "tokens_per_round": tokens / rounds,
            "tokens": runs[0]["answer"]}

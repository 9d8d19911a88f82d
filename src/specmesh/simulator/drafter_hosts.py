"""`specmesh simulate --method cosine --link RATE`: `cosine --drafter-processes` with each model drafter on a host of
its own around the verifier's, on a virtual clock from costs measured on this machine.

The real `cosine` runs here in one process (greedy, the same options, its drafters in this process), so every
route, level, fused tree and verification is the algorithm's; as in the other simulations of hosts
(simulator/split_hosts.py), rank 0's own work (routing, fusion, the context drafter, verification) is timed as
this process runs it, and the rest is priced instead:

    a read (each routed drafter reads its next level, or up to the root) = a hop to the drafters, the slowest
        drafter's part (its own work as timed here, its forward priced by the profile's `drafters` entry), a hop
        back, and the protocol's own work a read (`read_ms`, calibrated)
    a drafter's other calls (begin, finish, admit): messages rank 0 sends on without waiting: nothing
    the target's forward of w tokens = the profile's stages' costs of every layer and the head (host 0's one core)

`read_ms` is the real `cosine --drafter-processes` on one host less the same answer simulated, per read.
"""
from __future__ import annotations

import time

import numpy as np

from specmesh.simulator.pipelines import Profile
from specmesh.simulator.split_hosts import Priced, answered

WIDTHS = (1, 2, 4, 8, 16, 32)           # the drafters' forward widths the profile measures
DRAFTERS = "specmesh-drafter-lib,context"   # the embedded target's: a model drafter (a host of its own) and the context
GAMMA = 4                               # the depth, fixed: the scheduler chooses by wall-clock costs (--no-scheduler)


def measure(drafters: dict, widths=WIDTHS) -> list[float]:
    """One round of the drafters' costs: each drafter's forward by width (one thread), drafter by drafter."""
    from specmesh.timing import widths_ms
    return [ms for model in drafters.values() for ms in widths_ms(model, widths, context=64, reps=5).values()]


def entry(fastest: list[float], names: list[str], widths=WIDTHS) -> dict:
    """The profile's `drafters` entry from each cost's fastest over the rounds of `measure`."""
    n = len(widths)
    return {"tokens": list(widths), "ms": {name: fastest[i * n:(i + 1) * n] for i, name in enumerate(names)}}


class Reads:
    """FusedDrafters' calls on its model drafters, timed and priced (module docstring): `real_ms` what they took
    here, `ms` what they cost on hosts of their own, `reads` how many waited for answers."""

    def __init__(self, proposer, priced: dict[int, Priced], profile: Profile, read_ms: float):
        self.real_ms = self.ms = 0.0
        self.reads = 0
        inner = proposer._each

        def each(call, drafters=None) -> None:
            spans, forwards = {}, {n: (p.real_ms, p.ms, p.forwards) for n, p in priced.items()}

            def timed(n, d) -> None:
                began = time.perf_counter()
                call(n, d)
                spans[n] = 1e3 * (time.perf_counter() - began)
            inner(timed, drafters)
            remote = {n: span for n, span in spans.items() if n in priced}
            self.real_ms += sum(remote.values())
            parts = [span - (priced[n].real_ms - forwards[n][0]) + (priced[n].ms - forwards[n][1])
                     for n, span in remote.items() if priced[n].forwards > forwards[n][2]]
            if parts:                                   # a read: rank 0 waits for the slowest answer
                self.ms += max(parts) + 2 * profile.hop() + read_ms
                self.reads += 1
        proposer._each = each


class Simulator:
    """The real `cosine` in this process, its drafters priced as on hosts of their own: `__call__(ids)` ->
    (answer, simulated ms, reads)."""

    def __init__(self, profile: Profile, max_new_tokens: int, target: str | None = None, drafters: str = DRAFTERS,
                 read_ms: float | None = None):
        from specmesh import LLM, SamplingParams
        if not profile.drafters:
            raise ValueError(f"profile {profile.name} has no costs of cosine's drafters: run `specmesh simulate "
                             "--calibrate --hosts` (root) first")
        self.params = SamplingParams(max_new_tokens=max_new_tokens)
        self.llm = LLM(target=target, method="cosine", drafters=drafters, gamma=GAMMA, no_scheduler=True)
        self.llm.generate(self.llm.encode("def f():"), SamplingParams(max_new_tokens=4))    # a warm-up, untimed
        names, costs = self.llm.models.drafter_names, profile.drafters
        missing = [name for name in names if name != "context" and name not in costs["ms"]]
        if missing:
            raise ValueError(f"profile {profile.name} has no costs of drafter {', '.join(missing)}")
        cfg = self.llm.models.target.config
        self.target = Priced(self.llm.models.target, lambda w: profile.stage_ms(w, cfg.num_layers, last=True))
        proposer = self.llm.engine_for(self.llm.method).method.proposer
        self.priced = {n: Priced(d.draft.model, lambda w, ms=costs["ms"][names[n]]: float(np.interp(w, costs["tokens"],
                                                                                                   ms)))
                       for n, d in enumerate(proposer.drafters) if not d.free}
        self.reads = Reads(proposer, self.priced, profile, costs.get("read_ms", 0.0) if read_ms is None else read_ms)

    def __call__(self, ids: list[int]):
        from specmesh.timing import torch_threads
        before = (self.target.real_ms, self.target.ms, self.reads.real_ms, self.reads.ms, self.reads.reads)
        with torch_threads(1):                              # rank 0's, as on a host of one core
            began = time.perf_counter()
            answer = self.llm.generate(ids, self.params)
            own = 1e3 * (time.perf_counter() - began)
        t_real, t_ms, r_real, r_ms, reads = (now - then for now, then in zip(
            (self.target.real_ms, self.target.ms, self.reads.real_ms, self.reads.ms, self.reads.reads), before))
        return answer, own - t_real - r_real + t_ms + r_ms, reads

    def close(self) -> None:
        self.llm.close()


def simulate(profile: Profile, prompts: list[str], max_new_tokens: int, target: str | None = None,
             drafters: str = DRAFTERS) -> dict:
    """The JSON of `specmesh simulate --method cosine --link RATE`, aggregated over the prompts (`tokens`: the
    first's)."""
    sim = Simulator(profile, max_new_tokens, target, drafters)
    return {"method": "cosine", "drafters": drafters, "gamma": GAMMA} | answered(sim, prompts, profile)

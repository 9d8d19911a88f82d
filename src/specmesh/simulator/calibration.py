"""`specmesh simulate --calibrate`: this machine's costs measured into a profile (simulator/pipelines.py's `local`
shape, with `link_ms` between two hosts made here and the `split` entry of simulator/split_hosts.py).

Each rank of the real methods runs one thread (as on hosts of one core), so each cost is measured on one thread:
a target layer's and the head's time by token count (a chain's and STPP's tree's), the draft's pipedec timestep
and STPP level by width, rank 0's shard of `sd --tp 2` and the draft by width, a message between two processes
through the runtime's link, and what each real runtime spends beyond those costs (its fastest answer less the
same answer simulated).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from specmesh import catalog, embedded
from specmesh.simulator import drafter_hosts, split_hosts
from specmesh.simulator.pipelines import METHODS, Profile, SimConfig, Simulator

STPP_LEVELS, STPP_CHILDREN = 4, 4   # the static tree timed (stpp's defaults)
OPTIONS = {"sd": {"tp": split_hosts.WORLD, "gamma": split_hosts.GAMMA},        # each real run's, as simulated
                                                                                  # (bench/crossing.py's too)
           "cosine": {"drafters": drafter_hosts.DRAFTERS, "gamma": drafter_hosts.GAMMA, "no_scheduler": True,
                      "drafter_processes": True}}


def calibrate(out: Path, counts=(1, 2, 4, 8, 16, 32, 64), context: int = 256, hosts: bool = False,
              rounds: int = 6, methods=(*METHODS, "sd", "cosine")) -> dict:
    """Measure this machine's costs (bfloat16, one thread, as each rank runs) and write the `local` profile;
    `hosts`: also a message's time between two hosts made here (simulator/hop.py); `methods`: the pipelines whose
    runtime's own work is measured (the others' is 0), "sd": the costs of `sd --tp 2` (simulator/split_hosts.py),
    "cosine": of its drafters on hosts of their own (simulator/drafter_hosts.py).
    Every cost is the fastest of `rounds` rounds over all of them, and each round also times the methods' real
    runs: a shared machine slows down for seconds at a time, and a slow spell then costs one round of every cost,
    not every round of one, and the real runs and the costs they are set against are taken in the same spells."""
    from contextlib import ExitStack
    from specmesh.model.loader import load_model
    from specmesh.timing import torch_threads

    with torch.inference_mode(), torch_threads(1), ExitStack() as running:
        target = load_model(embedded.path("target"), torch.bfloat16, "cpu")
        draft = load_model(embedded.path("draft"), torch.bfloat16, "cpu", draft=True)
        shard = load_model(embedded.path("target"), torch.bfloat16, "cpu", part=(0, split_hosts.WORLD)) \
            if "sd" in methods else None
        drafters = {catalog.name_of(p): load_model(p, torch.bfloat16, "cpu", draft=True)
                    for p in catalog.drafters_for(embedded.path("target"), drafter_hosts.DRAFTERS)[0]} \
            if "cosine" in methods else {}
        real = {m: running.enter_context(RealRuns(m, **OPTIONS.get(m, {"stages": 2}))) for m in methods}
        costs = []
        for _ in range(rounds):
            costs.append(_costs(target, draft, counts, context) + (split_hosts.measure(shard, draft) if shard else [])
                         + drafter_hosts.measure(drafters))
            for runs in real.values():
                runs.time(RUNS_A_ROUND)
        fastest = [min(c) for c in zip(*costs)]
    layer, head, tree_layer, tree_head, drafts, levels = (fastest[i:6 * len(counts):6] for i in range(6))
    hop = link_one_way_ms(target.config.hidden_size)
    profile = {"name": "local", "stage": {"tokens": list(counts), "layer_ms": layer, "head_ms": head,
                                          "tree_layer_ms": tree_layer, "tree_head_ms": tree_head},
               "draft": {"tokens": list(counts), "ms": drafts, "level_ms": levels}, "hop_ms": hop,
               "broadcast_ms": hop, "draft_beside_stage0": True}
    profile |= {f"{unit}_ms": real[m].pipeline_work_ms(profile)
                for unit, m in (("timestep", "pipedec"), ("pass", "pp"), ("round", "stpp")) if m in real}
    if shard is not None:
        profile["split"] = split_hosts.entry(fastest[6 * len(counts):6 * len(counts) + 2 * len(split_hosts.WIDTHS)],
                                             shard)
        ms, answer = real["sd"].fastest
        sim = split_hosts.Simulator(Profile(**profile), len(answer.tokens), split_hosts.GAMMA, "embedded", forward_ms=0)
        profile["split"]["forward_ms"] = split_hosts.own_work_ms(ms, sim, real["sd"].ids)
    if drafters:
        profile["drafters"] = drafter_hosts.entry(fastest[-len(drafters) * len(drafter_hosts.WIDTHS):], list(drafters))
        ms, answer = real["cosine"].fastest
        sim = drafter_hosts.Simulator(Profile(**profile), len(answer.tokens), "embedded", read_ms=0)
        profile["drafters"]["read_ms"] = split_hosts.own_work_ms(ms, sim, real["cosine"].ids)
    if hosts:
        from specmesh.simulator.hop import across_hosts
        profile["link_ms"] = across_hosts()
    out.write_text(json.dumps(profile, indent=2) + "\n")
    return profile


def _costs(target, draft, counts, context: int) -> list[float]:
    """One round of the profile's costs, for each token count in turn: a layer's and the head's time on a chain and
    on STPP's tree, the draft's pipedec timestep and STPP level (six figures a count, in that order; each the median
    of a few runs: the rounds do the rest)."""
    from specmesh.proposers.draft_model import round_ms
    from specmesh.proposers.dynamic_tree import grow_ms
    from specmesh.timing import layer_and_head_ms
    out = []
    for T in counts:
        out += [*layer_and_head_ms(target, T, context, 5), *layer_and_head_ms(target, T, context, 5, STPP_CHILDREN),
                grow_ms(draft, T, min(T, 16), 64, reps=5), round_ms(draft, STPP_LEVELS, T, T, 64, reps=5) / STPP_LEVELS]
    return out


CALIBRATION_PROMPT, CALIBRATION_TOKENS = "def fibonacci(n):", 48
RUNS_A_ROUND = 2                        # real runs of each method in each round of costs


class RealRuns:
    """The real runtime of `method` (the embedded pair, bfloat16, one thread a process, on this machine) answering
    the calibration prompt: its fastest answer (`fastest`: ms, answer)."""

    def __init__(self, method: str, **options):
        from specmesh import LLM
        from specmesh.lossless.sampling import SamplingParams
        self.method, self.params = method, SamplingParams(max_new_tokens=CALIBRATION_TOKENS)   # as simulated
        self.llm = LLM(target="embedded", method=method, dtype="bfloat16", **options)
        self.ids = self.llm.encode(CALIBRATION_PROMPT)
        self.fastest = (float("inf"), None)

    def __enter__(self) -> "RealRuns":
        self.llm.generate(self.ids, self.params)                       # a warm-up: the processes' first steps
        return self

    def __exit__(self, *_) -> None:
        self.llm.close()

    def time(self, runs: int) -> None:
        from specmesh.timing import pause_then
        for _ in range(runs):
            answer = pause_then(lambda: self.llm.generate(self.ids, self.params))
            self.fastest = min(self.fastest, (1e3 * answer.stats.elapsed_s, answer), key=lambda t: t[0])

    def pipeline_work_ms(self, profile: dict) -> float:
        """A pipeline's own work (its ranks' bookkeeping and their messages' handling): the fastest answer's
        time less the same answer simulated from `profile`, per pipedec timestep, pp pass (a token after the
        first) or stpp round."""
        o = self.llm.method.config
        tree = {k: getattr(o, k) for k in ("tree_width", "max_children", "draft_window") if hasattr(o, k)}
        if self.method == "stpp":
            tree["depth"] = o.gamma
        sim = Simulator(SimConfig(self.method, 2, Profile(**profile), max_new_tokens=CALIBRATION_TOKENS,
                                  target="embedded", **tree))
        modelled = sim(sim.llm.encode(CALIBRATION_PROMPT))
        return max(0.0, (self.fastest[0] - modelled.ms) / modelled.steps)


def link_one_way_ms(hidden: int, tokens: int = 4, reps: int = 200) -> float:
    """Half a round trip of a [tokens, hidden] activation between two processes here, through the
    runtime's own link (shared-memory mailboxes on one machine)."""
    import datetime
    import multiprocessing
    import torch.distributed as dist
    from specmesh.runtime.link import Link
    from specmesh.simulator.hop import WARMUP, one_way_ms, ping_pong
    store = dist.TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False)
    echo = multiprocessing.get_context("spawn").Process(target=_echo, args=(store.port, tokens, hidden,
                                                                            reps + WARMUP))
    echo.start()
    times = ping_pong(Link(store, 0, ["stage0", "stage1"], 60.0), torch.randn(tokens, hidden), reps + WARMUP)
    echo.join()
    return one_way_ms(times)


def _echo(port: int, tokens: int, hidden: int, reps: int) -> None:
    import datetime
    import torch.distributed as dist
    from specmesh.runtime.link import Link
    from specmesh.simulator.hop import ping_pong
    store = dist.TCPStore("127.0.0.1", port, 2, False, timeout=datetime.timedelta(seconds=60))
    ping_pong(Link(store, 1, ["stage0", "stage1"], 60.0), torch.empty(tokens, hidden), reps)

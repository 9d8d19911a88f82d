"""PEARL's draft rank (Liu et al., ICLR 2025): the draft in a process of its own, drafting without pause.

Rank 1 (`DraftServer`) holds the draft and, per job, a `ChainDrafter`: each round the draft model
(proposers/draft_model.py, the one draft forward loop) drafts γ tokens (with their q rows when sampling)
while rank 0's target works, sends them, and commits whatever rank 0 decides. Rank 0 sees it through `DraftPeer`: start-up and calibration (γ defaults to round(c), c = target
forward time / draft forward time, both measured at start-up with one thread each, at the same time:
the paper's Table 6 choice; and the target's forward by width, alone and with the draft rank's core lent, for
methods/pearl.py's GammaPolicy), then per job begin -> (decide -> drafts)* -> end (methods/pearl.py); each
decision names the next round's γ, and the drafts come with the time the draft rank took to draft them.
"""
from __future__ import annotations

import atexit
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.engine.stats import Stats
from specmesh.lossless.penalties import Penalty, penalty_for
from specmesh.lossless.sampling import SamplingParams
from specmesh.lossless.verify import Verdict
from specmesh.model.loader import DTYPES, load_model
from specmesh.paths import cache_dir, cache_entry, cached_json, stamp
from specmesh.proposers.draft_model import DraftModel
from specmesh.proposers.ngram import SuffixIndex
from specmesh.runtime.link import Link, PeerError, connect, lending_wanted
from specmesh.timing import forward_ms, rank_threads, share_of_cores, torch_threads

MAX_GAMMA = 16
WIDTHS = (1, 2, 4, 8, 12, MAX_GAMMA)     # target widths measured for the γ policy
ROLES = ["target", "draft"]
CONTINUE, STOP = 0, 1


# ---------------------------------------------------------------------------------------------
# rank 1: the draft


@dataclass
class Chain:
    """The draft rank's view of a sequence, as the draft model proposes for it: the prompt window (`ids`),
    the tokens after it (`tokens`: decided, then undecided drafts), the sampling parameters and generator."""
    ids: list[int]
    params: SamplingParams
    generator: torch.Generator
    tokens: list[int] = field(default_factory=list)
    stats: Stats = field(default_factory=Stats)
    penalty: Penalty | None = None

    def __post_init__(self):              # the request's penalties over the window and the chain: better guesses
        self.penalty = penalty_for(self.params, self.ids, self.tokens)

    @property
    def last(self) -> int:
        return self.tokens[-1]


class ChainDrafter:
    """The draft's side of one job: each round the draft model (proposers/draft_model.py) drafts a chain of γ
    tokens after the newest token, decided or not, as if every undecided draft will be accepted; rank 0's
    decisions then commit undecided drafts or drop them.

    The draft model's cache holds the prompt window, then the first `read` of `chain.tokens`; the first
    `final` of those are decided. A rejection that drops drafts the draft has read rolls its cache back.

    With `lookup` (prompt lookup, as `sd`'s): where the newest tokens, undecided ones included, occurred before
    in the prompt or the decided tokens, what followed them leads the chain, and the draft model drafts only
    the rest (often nothing: its core is then lent to the target's forward for the whole round). The looked-up
    tokens are deterministic proposals: their q rows are one-hot, so verification stays lossless."""

    def __init__(self, model, prompt: list[int], window: int, limit: int, params: SamplingParams, seed: int,
                 lookup: int = 0):
        self.chain = Chain(prompt[-window:], params, torch.Generator(model.device).manual_seed(seed))
        self.base = len(self.chain.ids)
        self.draft = DraftModel(model, 1, self.base + limit + 2 * MAX_GAMMA + 2, window)
        self.draft.admit(0, self.chain)
        self.read, self.final = -1, 0           # -1: the prompt window is not read yet
        self.index = SuffixIndex(prompt, lookup) if lookup else None    # the prompt, then the decided tokens
        self.indexed = 0                        # of them, in the index

    @property
    def committed(self) -> list[int]:
        """The tokens generated so far, as rank 0 decided them."""
        return self.chain.tokens[:self.final]

    def draft_chain(self, n: int) -> tuple[list[int], torch.Tensor | None]:
        """Draft n tokens after the newest; returns them and, when sampling, their q rows [n, V]."""
        tokens, sampled = self.chain.tokens, not self.chain.params.greedy
        found = self.looked_up(n)
        tokens += found
        drafts = list(found)
        q = [one_hot(t, self.draft.model.config.vocab_size) for t in found] if sampled else None
        if len(found) < n:
            self.draft.pending[0] = (self.chain.ids if self.read < 0 else []) + tokens[max(self.read, 0):-1]
            [tree] = self.draft.propose([self.chain], [n - len(found)])
            self.draft.accept([self.chain], [tree], [Verdict(list(range(len(tree))), tree.tokens[1:], None)])
            self.read = len(tokens) + n - len(found) - 1    # all but the newest draft, which the next round reads
            tokens += tree.tokens[1:]
            drafts += tree.tokens[1:]
            q = q + [tree.q[i].cpu() for i in range(len(tree) - 1)] if sampled else None
        return drafts, None if q is None else torch.stack(q)

    def looked_up(self, n: int) -> list[int]:
        """Up to n tokens of prompt lookup after the newest token ([] without `lookup`)."""
        if self.index is None:
            return []
        self.index.extend(self.chain.tokens[self.indexed:self.final])
        self.indexed = self.final
        return self.index.lookup_after(self.chain.tokens[self.final:], n)

    def decide(self, accepted: int, token: int) -> None:
        """`accepted` undecided drafts are committed; token >= 0: then it, and the other drafts are dropped."""
        self.final += accepted
        if token < 0:
            return
        del self.chain.tokens[self.final:]
        if self.read > self.final:              # it read drafts that are gone
            self.read = self.final
            self.draft.cache.rollback(0, self.base + self.read)
        self.chain.tokens.append(token)
        self.final += 1


def one_hot(token: int, vocab: int) -> torch.Tensor:
    """The q row of a deterministic proposal."""
    row = torch.zeros(vocab)
    row[token] = 1.0
    return row


class DraftServer:
    """Rank 1's main loop: load the draft, report its speed, then serve jobs until shutdown."""

    def __init__(self, config: dict):
        self.model = load_model(Path(config["draft"]), DTYPES[config["dtype"]], torch.device(config["device"]),
                                draft=True, quant=config.get("quant"))

    def run(self, link: Link) -> None:
        with torch.inference_mode():
            link.send(torch.tensor([forward_ms(self.model), self.model.config.vocab_size], dtype=torch.float64), 0)
            while not (job := link.recv_obj(0, idle=True)).get("shutdown"):
                self.serve(link, job)

    def serve(self, link: Link, job: dict) -> None:
        params = SamplingParams.from_job(job["params"])
        drafter = ChainDrafter(self.model, job["prompt"], job["window"], job["limit"], params, job["seed"],
                               job["lookup"])
        decision = torch.zeros(4, dtype=torch.int64)
        while True:
            status, accepted, token, gamma = link.recv(decision, 0).tolist()
            drafter.decide(accepted, token)
            if status == STOP:                  # answer with what this rank committed, for rank 0 to check
                link.send(torch.tensor([len(drafter.committed)]), 0)
                link.send(torch.tensor(drafter.committed, dtype=torch.int64), 0)
                return
            start = time.perf_counter()
            tokens, q = drafter.draft_chain(gamma)
            link.send(torch.tensor(tokens + [round(1e6 * (time.perf_counter() - start))]), 0)   # and how long, µs
            if q is not None:
                link.send(q, 0)


# ---------------------------------------------------------------------------------------------
# rank 0: the target's handle on the draft


def by_width_text(ms: dict[int, float]) -> str:
    return ", ".join(f"{w}: {t:.2f}" for w, t in ms.items()) + " ms"


def widths_key(target, path: Path, link: Link) -> str:
    """What the target's forward by width depends on: the machine, rank 0's threads, the model file, its dtype and
    quantization, the kernels, and whether the draft rank lends its core."""
    from specmesh.kernels.build import cpu_name, kernel_version, vector_units
    return " | ".join([cpu_name(), vector_units(), f"{len(os.sched_getaffinity(0))} cores", str(target.device),
                       str(target.dtype), f"quant {target.quant}", stamp(path), f"kernels {kernel_version()}",
                       f"lent {link.boxes is not None}", f"widths {WIDTHS}"])


def widths_cache() -> Path:
    return cache_dir() / "pearl-widths.json"


def cached_widths(key: str | None) -> tuple[dict[int, float], dict[int, float] | None] | None:
    """The target's forward ms by width, alone and lent, as measured_widths stored them under `key`; or None."""
    entry = cached_json(widths_cache()).get(key) if key else None
    if entry is None:
        return None
    return int_widths(entry["alone"]), int_widths(entry["lent"])


def int_widths(ms: dict[str, float] | None) -> dict[int, float] | None:
    """A stored table by width (JSON's keys are strings)."""
    return None if ms is None else {int(w): t for w, t in ms.items()}


def measured_widths(target, link: Link, key: str | None) -> tuple[dict[int, float], dict[int, float] | None]:
    """The target's forward ms by width with the threads rank 0 decodes with, alone and with the draft rank's core
    lent (about a second), cached under `key` (None: not cached): a model's start on a machine measures them once."""
    with rank_threads(2):
        alone = {w: forward_ms(target, w, reps=10) for w in WIDTHS}
        with link.lending():
            lent = {w: forward_ms(target, w, reps=10) for w in WIDTHS} if link.boxes else None
    if key is not None:
        cache_entry(widths_cache(), key, {"alone": alone, "lent": lent})
    return alone, lent


class DraftPeer:
    """The draft rank, seen from rank 0: start-up and calibration, then per job
    begin -> (decide -> drafts)* -> end."""

    def __init__(self, link: Link, target_ms: float, draft_ms: float, vocab: int, target_ms_by_width: dict,
                 lent_ms_by_width: dict | None = None):
        self.link, self.target_ms, self.draft_ms, self.vocab = link, target_ms, draft_ms, vocab
        self.target_ms_by_width = target_ms_by_width       # width -> ms, with the threads rank 0 decodes with
        self.lent_ms_by_width = lent_ms_by_width           # the same with the draft rank's core lent; None: no lending
        self.c = target_ms / draft_ms
        self.gamma = max(1, min(MAX_GAMMA, round(self.c)))
        self.awaiting = 0               # a decision was sent: the draft owes us this many drafts
        self.drafting_ms = 0.0          # how long the draft rank took to draft the last ones
        self.broken: PeerError | None = None

    @classmethod
    def start(cls, target, draft: Path, dtype: torch.dtype, timeout_s: float,
              target_path: Path | None = None) -> "DraftPeer":
        device = target.device
        if device.type == "cuda" and torch.cuda.device_count() > 1:      # the draft gets a GPU of its own
            device = torch.device("cuda", ((device.index or 0) + 1) % torch.cuda.device_count())
        threads = share_of_cores(2)                 # each rank's, the draft's and this one's
        config = {"serve": f"{__name__}:DraftServer", "draft": str(draft), "dtype": str(dtype).split(".")[-1],
                  "quant": target.quant, "device": str(device), "timeout": timeout_s, "threads": threads}
        link = connect(ROLES, config, timeout_s, lend=lending_wanted())    # the draft rank lends its core as it waits
        with torch_threads(threads):
            target_ms = forward_ms(target)          # while the draft times itself
        draft_ms, vocab = link.recv(torch.zeros(2, dtype=torch.float64), 1).tolist()
        key = widths_key(target, target_path, link) if target_path is not None else None
        cached = cached_widths(key)
        widths, lent = cached or measured_widths(target, link, key)
        peer = cls(link, target_ms, draft_ms, int(vocab), widths, lent)
        print(f"pearl: target forward {target_ms:.2f} ms, draft forward {draft_ms:.2f} ms ({threads} "
              f"thread(s) each, measured together): c = {peer.c:.2f}, round(c) = {peer.gamma}; target forward by width"
              f"{' (cached)' if cached else ''}: " + by_width_text(widths)
              + (f"; with the draft's core lent: {by_width_text(lent)}" if lent else ""), file=sys.stderr, flush=True)
        atexit.register(peer.close)
        return peer

    def _guard(self, step, *args):
        if self.broken:
            raise PeerError(f"the draft rank failed earlier: {self.broken}")
        try:
            return step(*args)
        except PeerError as e:
            self.broken = e
            raise

    def begin(self, seq: Sequence, window: int, lookup: int, seed: int) -> None:
        self._guard(self.link.send_obj, {"prompt": seq.ids, "window": window, "lookup": lookup, "limit": seq.limit,
                                         "seed": seed, "params": seq.params.job()}, 1)

    def decide(self, accepted: int, token: int, gamma: int) -> None:
        """Commit `accepted` drafts (then `token`, if >= 0) and draft γ more."""
        self._guard(self.link.send, torch.tensor([CONTINUE, accepted, token, gamma]), 1)
        self.awaiting = gamma

    def drafts(self, sampling: bool) -> tuple[list[int], torch.Tensor | None]:
        """The γ drafts the last decision asked for (and their q rows [γ, V] when sampling); `drafting_ms`: how
        long the draft rank took to draft them."""
        *tokens, micros = self._guard(self.link.recv, torch.zeros(self.awaiting + 1, dtype=torch.int64), 1).tolist()
        self.drafting_ms = micros / 1000
        q = self._guard(self.link.recv, torch.zeros(self.awaiting, self.vocab), 1) if sampling else None
        self.awaiting = 0
        return tokens, q

    def end(self, accepted: int, token: int, sampling: bool) -> list[int] | None:
        """Send the last decision with STOP; returns the tokens the draft rank committed."""
        if self.broken:
            return None
        if self.awaiting:                   # the job ended mid-round: take the drafts, decide nothing
            self.drafts(sampling)
            accepted, token = 0, -1
        self._guard(self.link.send, torch.tensor([STOP, accepted, token, 0]), 1)
        size = int(self._guard(self.link.recv, torch.zeros(1, dtype=torch.int64), 1))
        return self._guard(self.link.recv, torch.zeros(size, dtype=torch.int64), 1).tolist()

    def close(self) -> None:
        if self.link is not None:
            self.link.shutdown(healthy=self.broken is None)
            self.link = None

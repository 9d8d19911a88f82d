"""PEARL's draft rank (Liu et al., ICLR 2025): the draft in a process of its own, drafting without pause.

Rank 1 (`DraftServer`) holds the draft and, per job, a `ChainDrafter`: each round it drafts γ tokens
(with their q rows when sampling) while rank 0's target works, sends them, and commits whatever rank 0
decides. Rank 0 sees it through `DraftPeer`: start-up and calibration (γ defaults to round(c), c = target
forward time / draft forward time, both measured at start-up with one thread each, at the same time:
the paper's Table 6 choice), then per job begin -> (decide -> drafts)* -> end (methods/pearl.py).
"""
from __future__ import annotations

import atexit
import sys
from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.model.cache import KVCache
from specmesh.model.loader import DTYPES, load_model
from specmesh.runtime.link import Link, PeerError, connect
from specmesh.spec.sampling import SamplingParams, probs_from_logits
from specmesh.timing import forward_ms, torch_threads

MAX_GAMMA = 16
ROLES = ["target", "draft"]
CONTINUE, STOP = 0, 1


# ---------------------------------------------------------------------------------------------
# rank 1: the draft


class ChainDrafter:
    """The draft's side of one job: a chain that grows γ tokens per round until told otherwise.

    `tail` holds the tokens past the cache's committed prefix, in order: the first
    `cache.spec` of them are processed (speculative slots), the rest wait for the next
    forward; the first `final` are known to be committed, the others are undecided drafts."""

    def __init__(self, model, prompt: list[int], window: int, limit: int, gamma: int, params: SamplingParams,
                 seed: int):
        self.model, self.params = model, params
        prompt = prompt[-window:]
        self.cache = KVCache.for_model(model, 1, len(prompt) + limit + 2 * gamma + 2)
        if len(prompt) > 1:
            model(torch.tensor([prompt[:-1]], device=model.device), self.cache, last_only=True)
            self.cache.commit_all()
        self.tail, self.final = prompt[-1:], 1
        self.committed: list[int] = []      # the tokens generated so far, as rank 0 decided them
        self.generator = torch.Generator(model.device).manual_seed(seed)

    def draft(self, n: int) -> tuple[list[int], torch.Tensor | None]:
        """Draft n tokens after the tail; returns them and, when sampling, their q rows [n, V]."""
        tokens, qs = [], []
        for _ in range(n):
            new = self.tail[self.cache.spec[0]:]
            logits = self.model(torch.tensor([new], device=self.model.device), self.cache)[0, -1]
            if self.params.greedy:
                x = int(logits.argmax())
            else:
                q = probs_from_logits(logits, self.params)
                x = int(torch.multinomial(q, 1, generator=self.generator))
                qs.append(q)
            self.tail.append(x)
            tokens.append(x)
        return tokens, torch.stack(qs).cpu() if qs else None

    def decide(self, accepted: int, token: int) -> None:
        """`accepted` undecided drafts are committed; token >= 0: then it, and the other drafts are dropped."""
        self.committed += self.tail[self.final:self.final + accepted] + ([token] if token >= 0 else [])
        self.final += accepted
        done = min(self.cache.spec[0], self.final)       # committed tokens already in the cache
        keep = range(done, self.cache.spec[0])
        if token >= 0:
            self.tail = self.tail[:self.final] + [token]
            self.final += 1
            keep = ()
        self.cache.commit(0, range(done), keep)
        self.tail, self.final = self.tail[done:], self.final - done


class DraftServer:
    """Rank 1's main loop: load the draft, report its speed, then serve jobs until shutdown."""

    def __init__(self, config: dict):
        self.model = load_model(Path(config["draft"]), DTYPES[config["dtype"]], torch.device(config["device"]),
                                draft=True)

    def run(self, link: Link) -> None:
        with torch.inference_mode():
            link.send(torch.tensor([forward_ms(self.model), self.model.config.vocab_size], dtype=torch.float64), 0)
            while not (job := link.recv_obj(0, idle=True)).get("shutdown"):
                self.serve(link, job)

    def serve(self, link: Link, job: dict) -> None:
        params = SamplingParams(**job["params"])
        drafter = ChainDrafter(self.model, job["prompt"], job["window"], job["limit"], job["gamma"], params,
                               job["seed"])
        decision = torch.zeros(3, dtype=torch.int64)
        while True:
            status, accepted, token = link.recv(decision, 0).tolist()
            drafter.decide(accepted, token)
            if status == STOP:                  # answer with what this rank committed, for rank 0 to check
                link.send(torch.tensor([len(drafter.committed)]), 0)
                link.send(torch.tensor(drafter.committed, dtype=torch.int64), 0)
                return
            tokens, q = drafter.draft(job["gamma"])
            link.send(torch.tensor(tokens), 0)
            if q is not None:
                link.send(q, 0)


# ---------------------------------------------------------------------------------------------
# rank 0: the target's handle on the draft


class DraftPeer:
    """The draft rank, seen from rank 0: start-up and calibration, then per job
    begin -> (decide -> drafts)* -> end."""

    def __init__(self, link: Link, target_ms: float, draft_ms: float, vocab: int):
        self.link, self.target_ms, self.draft_ms, self.vocab = link, target_ms, draft_ms, vocab
        self.c = target_ms / draft_ms
        self.gamma = max(1, min(MAX_GAMMA, round(self.c)))
        self.awaiting = False           # a decision was sent: the draft owes us its drafts
        self.broken: PeerError | None = None

    @classmethod
    def start(cls, target, draft: Path, dtype: torch.dtype, timeout_s: float) -> "DraftPeer":
        device = target.device
        if device.type == "cuda" and torch.cuda.device_count() > 1:      # the draft gets a GPU of its own
            device = torch.device("cuda", ((device.index or 0) + 1) % torch.cuda.device_count())
        config = {"serve": f"{__name__}:DraftServer", "draft": str(draft), "dtype": str(dtype).split(".")[-1],
                  "device": str(device), "timeout": timeout_s, "threads": 1}
        link = connect(ROLES, config, timeout_s)
        with torch_threads(1):
            target_ms = forward_ms(target)          # while the draft times itself
        draft_ms, vocab = link.recv(torch.zeros(2, dtype=torch.float64), 1).tolist()
        peer = cls(link, target_ms, draft_ms, int(vocab))
        print(f"pearl: target forward {target_ms:.2f} ms, draft forward {draft_ms:.2f} ms (one thread each, "
              f"measured together): c = {peer.c:.2f}, gamma = {peer.gamma}", file=sys.stderr, flush=True)
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

    def begin(self, seq: Sequence, gamma: int, window: int, seed: int) -> None:
        p = seq.params
        self._guard(self.link.send_obj, {
            "prompt": seq.ids, "window": window, "limit": seq.limit, "gamma": gamma, "seed": seed,
            "params": {"temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p}}, 1)

    def decide(self, accepted: int, token: int) -> None:
        self._guard(self.link.send, torch.tensor([CONTINUE, accepted, token]), 1)
        self.awaiting = True

    def drafts(self, gamma: int, sampling: bool) -> tuple[list[int], torch.Tensor | None]:
        tokens = self._guard(self.link.recv, torch.zeros(gamma, dtype=torch.int64), 1).tolist()
        q = self._guard(self.link.recv, torch.zeros(gamma, self.vocab), 1) if sampling else None
        self.awaiting = False
        return tokens, q

    def end(self, accepted: int, token: int, gamma: int, sampling: bool) -> list[int] | None:
        """Send the last decision with STOP; returns the tokens the draft rank committed."""
        if self.broken:
            return None
        if self.awaiting:                   # the job ended mid-round: take the drafts, decide nothing
            self.drafts(gamma, sampling)
            accepted, token = 0, -1
        self._guard(self.link.send, torch.tensor([STOP, accepted, token]), 1)
        size = int(self._guard(self.link.recv, torch.zeros(1, dtype=torch.int64), 1))
        return self._guard(self.link.recv, torch.zeros(size, dtype=torch.int64), 1).tolist()

    def close(self) -> None:
        if self.link is not None:
            self.link.shutdown(healthy=self.broken is None)
            self.link = None

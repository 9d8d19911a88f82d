"""The serving engine: a request pool and one step loop with continuous batching.

Running requests live in rows [0, B) of one KV cache. Each step admits waiting
requests (each prefilled alone, in the next free row, as long as rows are free),
then runs one target forward for all B running rows (one new token each), samples
every row with its own parameters and seeded generator, and retires the rows that
finished or whose client left: the last row moves into the freed one, so the running
rows stay a contiguous prefix of the cache and every forward works on a view of it.

The loop runs in a thread of its own; results go out through each request's `emit`
callback (the HTTP layer hands them to its event loop). An exception in the loop fails
every request in flight, marks the engine failed, and calls `on_failure`.
"""
from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specmesh.cache import KVCache
from specmesh.generation import Row
from specmesh.sampling import SamplingParams, make_generator, next_tokens


@dataclass
class Event:
    text: str = ""                      # new text of this request
    finish_reason: str | None = None    # "stop" | "length" once it is done
    error: str | None = None            # the engine failed


@dataclass
class Request:
    prompt: list[int]
    params: SamplingParams
    emit: Callable[[Event], None]
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    finished_at: float | None = None
    aborted: bool = False
    row: Row | None = None              # tokens, text and finish state (set when admitted)
    generator: torch.Generator | None = None
    last: int = -1                      # newest token, not yet in the cache

    @property
    def completion_tokens(self) -> int:
        return len(self.row.tokens) if self.row else 0


@dataclass
class EngineStats:
    """What /metrics reports; updated by the loop thread."""
    generated_tokens: int = 0
    target_forwards: int = 0
    steps: int = 0
    running: int = 0
    waiting: int = 0


class Engine:
    def __init__(self, llm, max_batch: int = 16, on_failure: Callable[[BaseException], None] | None = None,
                 on_finish: Callable[[Request], None] | None = None):
        self.model, self.tokenizer = llm.models.target, llm.tokenizer
        self.context = llm.context
        self.eos = set(self.model.config.eos_ids)
        self.cache = KVCache.for_model(self.model, max_batch, self.context)
        self.max_batch = max_batch
        self.running: list[Request] = []            # running[i] holds cache row i
        self.waiting: collections.deque[Request] = collections.deque()
        self.stats = EngineStats()
        self.failure: BaseException | None = None
        self.on_failure, self.on_finish = on_failure, on_finish
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="specmesh-engine", daemon=True)

    def start(self) -> "Engine":
        self._thread.start()
        return self

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        self._thread.join(timeout=10)

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

    def submit(self, request: Request) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the engine failed: {self.failure}")
        with self._wake:
            self.waiting.append(request)
            self.stats.waiting = len(self.waiting)
            self._wake.notify()

    def abort(self, request: Request) -> None:
        """Drop a request (its client left); its row is freed at the end of the current step."""
        request.aborted = True
        with self._wake:
            self._wake.notify()

    # -- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        try:
            with torch.inference_mode():
                while True:
                    with self._wake:
                        while not self._stop and not self.waiting and not self.running:
                            self._wake.wait()
                        if self._stop:
                            return
                    self._admit()
                    if self.running:
                        self._step()
                    self._retire()
        except BaseException as e:           # noqa: BLE001 - every failure must reach the clients
            self._fail(e)

    def _admit(self) -> None:
        while len(self.running) < self.max_batch:
            with self._wake:
                if not self.waiting:
                    break
                request = self.waiting.popleft()
                self.stats.waiting = len(self.waiting)
            if request.aborted:
                continue
            slot = len(self.running)
            view = self.cache.view(slot, slot + 1)
            view.rollback(0, 0)
            p = request.params
            request.row = Row(self.tokenizer, p, self.eos, min(p.max_new_tokens, self.context - len(request.prompt)))
            request.generator = make_generator(p.seed, self.model.device)
            ids = torch.tensor([request.prompt], device=self.model.device)
            logits = self.model(ids, view, last_only=True)[:, -1]
            view.commit_all()
            self.stats.target_forwards += 1
            self.running.append(request)
            self._emit(request, int(next_tokens(logits, p, request.generator)))
        self.stats.running = len(self.running)

    def _step(self) -> None:
        """One token for every running row, in one forward."""
        view = self.cache.view(0, len(self.running))
        tokens = torch.tensor([[r.last] for r in self.running], device=self.model.device)
        logits = self.model(tokens, view)[:, -1]                           # [B, V]
        view.commit_all()
        self.stats.target_forwards += 1
        self.stats.steps += 1
        for i, request in enumerate(self.running):
            if not request.row.finish and not request.aborted:
                self._emit(request, int(next_tokens(logits[i:i + 1], request.params, request.generator)))

    def _emit(self, request: Request, token: int) -> None:
        now = time.perf_counter()
        request.first_token_at = request.first_token_at or now
        request.last = token
        request.row.extend([token])
        self.stats.generated_tokens += 1
        piece = request.row.stream_piece()
        if request.row.finish:
            request.finished_at = now
            reason = "stop" if request.row.finish in ("eos", "stop") else "length"
            request.emit(Event(piece, reason))
        elif piece:
            request.emit(Event(piece))

    def _retire(self) -> None:
        """Free the rows of finished and aborted requests; the last row moves into each hole."""
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if request.row.finish or request.aborted:
                last = len(self.running) - 1
                if i != last:
                    self.cache.move_row(last, i)
                self.running[i] = self.running[last]
                self.running.pop()
                if self.on_finish:
                    self.on_finish(request)
            else:
                i += 1
        self.stats.running = len(self.running)

    def _fail(self, error: BaseException) -> None:
        self.failure = error
        message = f"engine failure: {type(error).__name__}: {error}"
        with self._wake:
            doomed = self.running + list(self.waiting)
            self.running, self.waiting = [], collections.deque()
        for request in doomed:
            request.emit(Event(error=message))
        if self.on_failure:
            self.on_failure(error)

"""The serving engine: a request pool and one step loop with continuous batching.

Running requests live in rows [0, B) of one KV cache (and, for `sd`, of the draft's;
speculation: serve/speculate.py). Each step admits waiting requests (each prefilled
alone, in the next free row, as long as rows are free; a prompt's cached prefix, if any, is
read from the prefix cache: serve/prefix_cache.py), then runs the target over all
B running rows (one new token each, or a drafted chain or tree each), samples every
row with its own parameters and seeded generator, and retires the rows that finished
or whose client left: the last row moves into the freed one, so the running rows stay
a contiguous prefix of the cache and every forward works on a view of it.

The loop runs in the calling thread (`run`; `specmesh serve` gives it the main thread) or in
a thread of its own (`start`); each step's results go out at once through
`deliver` (the HTTP layer hands the whole batch to its event loop in one wake-up, which
calls each request's `emit`). An exception in the loop fails every request in flight,
marks the engine failed, and calls `on_failure`.
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
from specmesh.kernels import SMALL_ROWS
from specmesh.sampling import SamplingParams, argmax, make_generator, next_tokens
from specmesh.serve.prefix_cache import PrefixCache
from specmesh.serve.speculate import ChainSpeculator, TreeSpeculator

MAX_GAMMA = 16              # cache room past the context for a verification
GROUP = SMALL_ROWS          # rows per forward


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
    drafter: object = None              # `tree`: this request's draft model and its cache
    draft_lag: list[int] = field(default_factory=list)   # `sd`: tokens committed while speculation was off

    @property
    def completion_tokens(self) -> int:
        return len(self.row.tokens) if self.row else 0


def deliver_here(batch: list[tuple["Request", Event]]) -> None:
    """Without an event loop: hand each event to its request in the engine's thread."""
    for request, event in batch:
        request.emit(event)


@dataclass
class EngineStats:
    """What /metrics reports; updated by the loop thread."""
    generated_tokens: int = 0
    target_forwards: int = 0
    drafted: int = 0                    # speculative methods: draft tokens verified
    accepted: int = 0                   # ... and accepted
    cached_prompt_tokens: int = 0       # prompt tokens read from the prefix cache instead of computed
    steps: int = 0
    running: int = 0
    waiting: int = 0


class Engine:
    def __init__(self, llm, max_batch: int = 16, gamma: int | None = None,
                 on_failure: Callable[[BaseException], None] | None = None,
                 on_finish: Callable[[Request], None] | None = None, prefix_cache: PrefixCache | None = None):
        self.model, self.tokenizer = llm.models.target, llm.tokenizer
        self.context = llm.context
        self.eos = set(self.model.config.eos_ids)
        room = self.context + MAX_GAMMA + 1                 # a verification may run past the context
        self.cache = KVCache.for_model(self.model, max_batch, room)
        self.speculator = None
        options = llm.method.options
        if llm.method.name == "sd":
            self.speculator = ChainSpeculator(llm.models.draft, max_batch, room, options["draft_window"],
                                              gamma)                  # gamma None: by batch size
        elif llm.method.name == "tree":
            self.speculator = TreeSpeculator(llm.models.draft, gamma or options["gamma"], options["tree_width"],
                                             options["max_children"], options["draft_window"])
        self.max_batch = max_batch
        self.prefix_cache = prefix_cache
        self.running: list[Request] = []            # running[i] holds cache row i
        self.waiting: collections.deque[Request] = collections.deque()
        self.stats = EngineStats()
        self.deliver: Callable[[list[tuple[Request, Event]]], None] = deliver_here
        self._outbox: list[tuple[Request, Event]] = []
        self.failure: BaseException | None = None
        self.on_failure, self.on_finish = on_failure, on_finish
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="specmesh-engine", daemon=True)

    def start(self) -> "Engine":
        """Run the loop in a thread of its own."""
        self._thread.start()
        return self

    def run(self) -> None:
        """Run the loop in this thread until `stop` (or a failure)."""
        self._loop()

    def stop(self) -> None:
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    @property
    def idle(self) -> bool:
        with self._wake:
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
                        self._flush()
                    self._retire()
        except BaseException as e:           # noqa: BLE001 - every failure must reach the clients
            self._fail(e)

    def _admit(self) -> None:
        while len(self.running) < self.max_batch:
            with self._wake:                    # never idle-looking in between: see `idle`
                if not self.waiting:
                    break
                request = self.waiting.popleft()
                self.stats.waiting = len(self.waiting)
                if request.aborted:
                    continue
                slot = len(self.running)
                self.running.append(request)
            view = self.cache.view(slot, slot + 1)
            view.rollback(0, 0)
            p = request.params
            request.row = Row(self.tokenizer, p, self.eos, min(p.max_new_tokens, self.context - len(request.prompt)))
            request.generator = make_generator(p.seed, self.model.device)
            cached = self.prefix_cache.load(request.prompt, self.cache, slot) if self.prefix_cache else 0
            ids = torch.tensor([request.prompt[cached:]], device=self.model.device)
            logits = self.model(ids, view, last_only=True)[:, -1]
            view.commit_all()
            if self.prefix_cache:
                self.prefix_cache.store(request.prompt, self.cache, slot)
            self.stats.target_forwards += 1
            self.stats.cached_prompt_tokens += cached
            if self.speculator:
                self.speculator.admit(slot, request)
            self._emit(request, int(next_tokens(logits, p, request.generator)))
            self._flush()
        self.stats.running = len(self.running)

    def _step(self) -> None:
        """One token for every running row: one forward per group of up to GROUP rows (on CPU the
        kernels' batch-invariant shapes: a row's logits do not depend on the others); or, for a
        speculative method, a batch of drafted chains checked at once."""
        self.stats.steps += 1
        if self.speculator and self.speculator.speculates(len(self.running)):
            blocks = self.speculator.step(self.running, self.model, self.cache, self.stats)
            for request, block in zip(self.running, blocks):
                for token in block:
                    if request.row.finish or request.aborted:
                        break
                    self._emit(request, token)
            return
        if self.speculator:                     # a batch too wide to speculate: decode plainly
            self.speculator.skip(self.running)
        for first in range(0, len(self.running), GROUP):
            group = self.running[first:first + GROUP]
            view = self.cache.view(first, first + len(group))
            tokens = torch.tensor([[r.last] for r in group], device=self.model.device)
            logits = self.model(tokens, view)[:, -1]                       # [rows, V]
            view.commit_all()
            self.stats.target_forwards += 1
            tops = argmax(logits).tolist()                                 # the greedy rows' tokens, at once
            for i, request in enumerate(group):
                if request.row.finish or request.aborted:
                    continue
                p = request.params
                self._emit(request, tops[i] if p.greedy else int(next_tokens(logits[i:i + 1], p, request.generator)))

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
            self._outbox.append((request, Event(piece, reason)))
        elif piece:
            self._outbox.append((request, Event(piece)))

    def _flush(self) -> None:
        if self._outbox:
            self.deliver(self._outbox)
            self._outbox = []

    def _retire(self) -> None:
        """Free the rows of finished and aborted requests; the last row moves into each hole."""
        i = 0
        while i < len(self.running):
            request = self.running[i]
            if request.row.finish or request.aborted:
                last = len(self.running) - 1
                if i != last:
                    self.cache.move_row(last, i)
                    if self.speculator:
                        self.speculator.move_row(last, i)
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
        self.deliver([(request, Event(error=message)) for request in doomed])
        if self.on_failure:
            self.on_failure(error)

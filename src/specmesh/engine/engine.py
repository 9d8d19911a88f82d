"""The engine: one step loop for `LLM.generate`, `specmesh generate`, the bench and `specmesh serve`.

step() = admit waiting sequences (the method prefills them, or starts their loop) -> retire the done
-> the method's step over every running sequence -> append each one's tokens (stopping rules:
engine/sequence.py) -> retire the done.

`LLM` runs steps until its sequences are done (offline batched inference). The server runs the loop
in a thread (`run` in the calling thread; `specmesh serve` gives it the main thread, `start` a thread
of its own): each step's text goes out at once through `deliver` (the HTTP layer hands the whole
batch to its event loop in one wake-up, which calls each sequence's `emit`). An exception in the
loop fails every sequence in flight, marks the engine failed and calls `on_failure`.
"""
from __future__ import annotations

import numbers
import threading
import time
from collections.abc import Callable

import torch

from specmesh.engine.method import Method
from specmesh.engine.runner import Runner
from specmesh.engine.scheduler import Scheduler
from specmesh.engine.sequence import Event, Prompt, Sequence
from specmesh.lossless.sampling import InvalidParameter, SamplingParams, make_generator
from specmesh.model.tokenizer import Tokenizer
from specmesh.runtime import PeerError


def deliver_here(batch: list[tuple[Sequence, Event]]) -> None:
    """Without an event loop: hand each event to its sequence in the engine's thread."""
    for seq, event in batch:
        seq.emit(event)


def check_prompt(ids: list[int], context: int, vocab: int) -> None:
    """A prompt needs at least one token, each in the target's vocabulary, and room for one more within its
    context (a token id past the embedding would read outside it)."""
    if not ids:
        raise ValueError("prompt is empty")
    bad = [t for t in ids if isinstance(t, bool) or not isinstance(t, numbers.Integral) or not 0 <= t < vocab]
    if bad:
        raise ValueError(f"token id {bad[0]!r} is outside the vocabulary (integers 0 to {vocab - 1})")
    if len(ids) >= context:
        raise ValueError(f"prompt of {len(ids)} tokens does not fit the context of {context} tokens")


def failure_code(error: BaseException) -> str:
    return "peer_lost" if isinstance(error, PeerError) else "engine_failed"


class Engine:
    """`method` stepping over `runner`'s rows (methods.engine builds both). `context`: the tokens a sequence may
    reach (the target's context, less the slots the method's steps need beyond it: engine/sizing.py);
    `check_params(params)` raises InvalidParameter for what the method cannot give."""

    def __init__(self, runner: Runner, method: Method, tokenizer: Tokenizer, name: str, context: int,
                 check_params: Callable[[SamplingParams], None] = lambda params: None,
                 prefill_share: float | None = None, per_request: int | None = None,
                 methods: tuple[str, ...] | None = None):
        self.runner, self.method, self.tokenizer, self.name = runner, method, tokenizer, name
        self.methods = methods or (name,)       # the methods a request may name (several: methods/mixed.py)
        self.choose: Callable[[list[int]], str] = lambda ids: self.methods[0]      # a request's "auto" (LLM sets it)
        self.context, self.check_params = context, check_params
        self.target, self.stats = runner.model, runner.stats
        self.prefill_share = prefill_share      # of the engine's time, for prefills while others decode (None: all)
        self.busy_s = [0.0, 0.0]                # seconds of prefills, of decoding steps, since the batch was empty
        self.scheduler = Scheduler(runner.rows, per_request)
        self.deliver: Callable[[list[tuple[Sequence, Event]]], None] = deliver_here
        self.on_finish: Callable[[Sequence], None] | None = None
        self.on_failure: Callable[[BaseException], None] | None = None
        self.failure: BaseException | None = None
        self._outbox: list[tuple[Sequence, Event]] = []
        self._wake = threading.Condition()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="specmesh-engine", daemon=True)

    # -- requests -------------------------------------------------------------------------------
    def sequences(self, ids: list[int], params: SamplingParams, method: str | None = None) -> list[Sequence]:
        """The n sequences of one request (sample j of a seeded request uses seed + j), decoded by `method` (one of
        the engine's; default its first; "auto": the one `choose` gives for this prompt)."""
        vocab = self.target.config.vocab_size
        check_prompt(ids, self.context, vocab)
        if method == "auto":
            method = self.choose(ids)
        if method is not None and method not in self.methods:
            raise InvalidParameter("method", f"method {method!r} is not one this engine runs: it runs "
                                   f"{', '.join(self.methods)}")
        self.check_params(params)
        if any(t >= vocab for t in params.logit_bias):
            raise InvalidParameter("logit_bias", f"logit_bias: token id {max(params.logit_bias)} is past the "
                                   f"vocabulary of {vocab} tokens")
        limit = min(params.max_new_tokens, self.context - len(ids))
        prompt = Prompt(list(ids), waiting=params.n)
        device, eos = self.target.device, set(self.target.config.eos_ids)
        seqs = [Sequence(prompt, params, self.tokenizer, eos, limit,
                         make_generator(None if params.seed is None else params.seed + j, device))
                for j in range(params.n)]
        for seq in seqs:
            seq.method = method
        return seqs

    def submit(self, seqs: list[Sequence]) -> None:
        if self.failure is not None:
            raise RuntimeError(f"the engine failed: {self.failure}")
        with self._wake:
            self.scheduler.add(seqs)
            self.stats.waiting = self.scheduler.waiting
            self._wake.notify()

    def complete(self, requests: list[list[Sequence]], within_s: float | None = None) -> float | None:
        """Submit the requests (each its sequences) and step until they are done, beside whatever else is in flight;
        the seconds it took. `within_s`: past that many seconds they are cancelled and the answer is None. A
        failure (or an interrupt) in a step abandons every sequence in flight."""
        start = time.perf_counter()
        for seqs in requests:
            self.submit(seqs)
        mine = [seq for seqs in requests for seq in seqs]
        try:
            while not all(seq.done for seq in mine):
                self.step()
                if within_s is not None and time.perf_counter() - start > within_s:
                    self.cancel(mine)
                    return None
        except BaseException:
            self.abandon()
            raise
        return time.perf_counter() - start

    def cancel(self, seqs: list[Sequence]) -> None:
        """Drop these sequences now (their consumer stopped reading), between steps: their rows are freed and a loop
        method hears the request is over."""
        for seq in seqs:
            seq.aborted = True
        self._retire()

    def abort(self, seq: Sequence) -> None:
        """Drop a sequence (its client left); its row is freed at the end of the current step."""
        seq.aborted = True
        with self._wake:
            self._wake.notify()

    def abandon(self) -> list[Sequence]:
        """Drop every sequence in flight (its consumer stopped, or a step failed) and return them: loop
        methods close their loops, so their other processes hear that the request is over. Errors while
        closing are dropped: the reason for abandoning is the one that matters."""
        with self._wake:
            doomed = self.scheduler.clear()
        self.runner.drop_staged()
        for seq in doomed:
            seq.aborted = True
            try:
                self.method.release(seq)
            except Exception:       # noqa: BLE001 - a loop's other processes may be gone already
                pass
        return doomed

    @property
    def idle(self) -> bool:
        return self.scheduler.idle          # no lock needed: admission never leaves the scheduler empty-looking

    # -- one step -------------------------------------------------------------------------------
    def step(self) -> None:
        with torch.inference_mode():
            if self.scheduler.waiting and self._may_prefill():
                start = time.perf_counter()
                self._admit()
                self._retire()
                self.busy_s[0] += time.perf_counter() - start
            running = self.scheduler.running
            if running:
                start = time.perf_counter()
                self.stats.steps += 1
                for seq, block in zip(running, self.method.step(running)):
                    self._emit(seq, block)
                self.busy_s[1] += time.perf_counter() - start
            self._retire()                      # before the flush: a finished answer arrives already counted
            self._flush()
            if not self.scheduler.running:
                self.busy_s = [0.0, 0.0]

    def _may_prefill(self) -> bool:
        """Whether this step may admit (and prefill): always with nothing running or no `prefill_share`;
        otherwise while prefills took at most that share of the time since the batch was last empty."""
        prefill, decode = self.busy_s
        share = self.prefill_share
        return share is None or not self.scheduler.running or prefill <= share / (1 - share) * decode

    def _admit(self) -> None:
        """Give free rows to waiting sequences. A long prompt first computes one chunk per step (runner.py);
        the sequence takes its row once the prompt is whole."""
        while True:
            with self._wake:
                seq = self.scheduler.next_waiting()
                self.stats.waiting = self.scheduler.waiting
            if seq is None or seq.prompt is not self.runner.staged:
                self.runner.drop_staged()       # its requests left, or another prompt's turn came first
            if seq is None:
                break
            if self.method.chunked_prefill and self.runner.needs_chunks(seq.prompt) and not self.runner.prefill_chunk(seq):
                break
            with self._wake:
                row = self.scheduler.admit(seq)
                self.stats.waiting = self.scheduler.waiting
            self._emit(seq, self.method.admit(seq, row))
            if seq.done:
                self._retire()                  # counted before its answer goes out, as in step
            self._flush()                       # its first token now
        self.stats.running = len(self.scheduler.running)

    def _emit(self, seq: Sequence, tokens: list[int]) -> None:
        if seq.done or not tokens:
            return
        now = time.perf_counter()
        seq.first_token_at = seq.first_token_at or now
        before = len(seq.tokens)
        seq.extend(tokens)
        seq.stats.generated_tokens = len(seq.tokens)
        self.stats.generated_tokens += len(seq.tokens) - before
        if seq.emit is None:
            return
        piece = seq.stream_piece()
        if seq.finish:
            seq.finished_at = now
            self._outbox.append((seq, Event(piece, seq.finish_reason, tokens=len(seq.tokens))))
        elif piece:
            self._outbox.append((seq, Event(piece, tokens=len(seq.tokens))))

    def _flush(self) -> None:
        if self._outbox:
            self.deliver(self._outbox)
            self._outbox = []

    def _retire(self) -> None:
        for seq in self.scheduler.retire(self.method.move_row):
            self.method.release(seq)
            self.stats.add(seq.stats)
            if self.on_finish:
                self.on_finish(seq)
        self.stats.running = len(self.scheduler.running)

    # -- the server's loop ----------------------------------------------------------------------
    def start(self) -> "Engine":
        """Run the loop in a thread of its own."""
        self._thread.start()
        return self

    def run(self) -> None:
        """Run the loop in this thread until `stop` (or a failure)."""
        self._loop()

    def stop(self) -> None:
        """End the loop after the current step; sequences still in flight get an error event."""
        with self._wake:
            self._stop = True
            self._wake.notify()
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    def _loop(self) -> None:
        try:
            while True:
                with self._wake:
                    while not self._stop and self.scheduler.idle:
                        self._wake.wait()
                    if self._stop:
                        break
                self.step()
            self._cancel("the server shut down before this request finished", "server_shutting_down")
        except BaseException as e:           # noqa: BLE001 - every failure must reach the clients
            self._fail(e)

    def _cancel(self, message: str, code: str) -> None:
        """End every sequence still in flight (the loop was stopped): each gets an error event."""
        events = [(seq, Event(error=message, error_code=code)) for seq in self.abandon() if seq.emit is not None]
        if events:
            try:
                self.deliver(events)
            except RuntimeError:            # the HTTP event loop has closed: its clients are gone already
                pass

    def _fail(self, error: BaseException) -> None:
        """Every sequence in flight ends with the error: `peer_lost` where a process of the method was lost (a
        PeerError names its rank and host), else `engine_failed`."""
        self.failure = error
        self._cancel(f"engine failure: {type(error).__name__}: {error}", failure_code(error))
        if self.on_failure:
            self.on_failure(error)

"""Which sequences run: the waiting ones, queued per request, and the running ones, which hold cache rows 0..B-1.

Admission is fair: a free row goes to the waiting sequence of the request with the fewest running
sequences (the oldest such request first), so a request for many samples or prompts is admitted in pieces
that share the batch with the requests that came after it; and no request holds more than `per_request` rows
(the server's: three quarters of them), so one that came first and asks for every row still leaves rows for
the next (its sequences run to their end once admitted: without that bound a newcomer waited for one of
them to finish). A sequence whose client left while it waited is dropped. Retiring frees the rows of
finished and aborted sequences: the last running sequence moves into each freed row, so the running rows
stay a contiguous prefix of the cache and every forward works on a view of it.
"""
from __future__ import annotations

import collections
from collections.abc import Callable

from specmesh.engine.sequence import Sequence


class Scheduler:
    def __init__(self, rows: int, per_request: int | None = None):
        self.rows, self.per_request = rows, per_request or rows
        self.queues: dict[int, collections.deque[Sequence]] = {}    # request -> its waiting sequences, by arrival
        self.requests = 0                                           # requests added so far (the next one's key)
        self.waiting = 0                                            # sequences in the queues
        self.running: list[Sequence] = []                           # running[i] holds cache row i
        self.dropped: list[Sequence] = []                           # aborted while waiting, not yet retired

    def add(self, seqs: list[Sequence]) -> None:
        """One request's sequences (its prompts' samples, in order)."""
        self.requests += 1
        for seq in seqs:
            seq.request = self.requests
        self.queues[self.requests] = collections.deque(seqs)
        self.waiting += len(seqs)

    def next_waiting(self) -> Sequence | None:
        """The sequence the next free row goes to (None: no row is free, or nothing waits). Sequences
        whose client left while they waited are dropped on the way."""
        while self.waiting and len(self.running) < self.rows:
            running = collections.Counter(s.request for s in self.running)
            open_ = [k for k in self.queues if running[k] < self.per_request]
            if not open_:
                return None
            key = min(open_, key=lambda k: running[k])             # min keeps the first of equals: the oldest
            seq = self.queues[key][0]
            if not seq.aborted:
                return seq
            self._dequeue(seq)
            self.dropped.append(seq)
        return None

    def admit(self, seq: Sequence) -> int:
        """`next_waiting`'s sequence takes the next row; returns it."""
        self.running.append(seq)                # before it leaves the queue: never empty-looking midway
        self._dequeue(seq)
        return len(self.running) - 1

    def _dequeue(self, seq: Sequence) -> None:
        key = seq.request
        self.queues[key].popleft()
        self.waiting -= 1
        if not self.queues[key]:
            del self.queues[key]

    def retire(self, move_row: Callable[[int, int], None]) -> list[Sequence]:
        """Remove the done sequences (and return them with those dropped while waiting); `move_row(src, dst)`
        moves a row's state into a freed one."""
        done, i, self.dropped = self.dropped, 0, []
        while i < len(self.running):
            seq = self.running[i]
            if not seq.done:
                i += 1
                continue
            last = len(self.running) - 1
            if i != last:
                move_row(last, i)
            self.running[i] = self.running[last]
            self.running.pop()
            done.append(seq)
        return done

    def clear(self) -> list[Sequence]:
        """Every sequence, running or waiting, out of the scheduler."""
        doomed = self.running + [seq for queue in self.queues.values() for seq in queue]
        self.running, self.queues, self.waiting = [], {}, 0
        return doomed

    @property
    def idle(self) -> bool:
        return not self.running and not self.waiting

"""Which sequences run: the waiting ones, queued per prompt, and the running ones, which hold cache rows 0..B-1.

Admission is fair: a free row goes to the waiting sequence of the prompt with the fewest running
sequences (the oldest such prompt first), so a request for many samples is admitted in pieces that
share the batch with the requests that came after it. A sequence whose client left while it waited
is dropped. Retiring frees the rows of finished and aborted sequences: the last running sequence
moves into each freed row, so the running rows stay a contiguous prefix of the cache and every
forward works on a view of it.
"""
from __future__ import annotations

import collections
from collections.abc import Callable

from specmesh.engine.sequence import Sequence


class Scheduler:
    def __init__(self, rows: int):
        self.rows = rows
        self.queues: dict[int, collections.deque[Sequence]] = {}    # id(prompt) -> its waiting sequences, by arrival
        self.waiting = 0                                            # sequences in the queues
        self.running: list[Sequence] = []                           # running[i] holds cache row i
        self.dropped: list[Sequence] = []                           # aborted while waiting, not yet retired

    def add(self, seq: Sequence) -> None:
        self.queues.setdefault(id(seq.prompt), collections.deque()).append(seq)
        self.waiting += 1

    def next_waiting(self) -> Sequence | None:
        """The sequence the next free row goes to (None: no row is free, or nothing waits). Sequences
        whose client left while they waited are dropped on the way."""
        while self.waiting and len(self.running) < self.rows:
            running = collections.Counter(id(s.prompt) for s in self.running)
            key = min(self.queues, key=lambda k: running[k])        # min keeps the first of equals: the oldest
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
        key = id(seq.prompt)
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

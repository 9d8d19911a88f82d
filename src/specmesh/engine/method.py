"""What the engine runs: a decoding method built over its runner (methods/ builds them; the engine knows none).

Running sequence i holds cache row i. Every hook the engine calls is declared here; a method without one of the
optional behaviours leaves the default.
"""
from __future__ import annotations

from typing import Protocol

from specmesh.engine.sequence import Sequence


class Method(Protocol):
    # admit() prefills through Runner.prefill, so the engine may compute a long prompt in chunks first (runner.py);
    # False: the method prefills on its own (the multi-process loops)
    chunked_prefill: bool = False

    def admit(self, seq: Sequence, row: int) -> list[int]:
        """Set up a new sequence in `row` (prefill, proposer state); its first tokens."""

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        """One step for every running sequence: the tokens each committed, in order."""

    def move_row(self, src: int, dst: int) -> None:
        """The engine moved a sequence from row `src` to `dst` (one before it finished)."""

    def release(self, seq: Sequence) -> None:
        """The sequence left the batch (finished, cancelled or abandoned)."""

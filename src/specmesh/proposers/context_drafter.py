"""cosine's context drafter: prompt lookup (ngram.SuffixIndex) as one of the fused drafters.

It runs no model. After each node it reads, its candidate is the token that followed the latest earlier
occurrence of the longest suffix (n = MIN_N..MAX_N tokens) of the request's tokens and the path read so far;
where none occurred it is silent for the rest of the round's spine. Fusion compares candidates by
confidence, and a lookup has no probability of its own: its confidence is the measured precision of its
candidates by match length, (hits + 1) / (tries + 2), counted over every request it drafted for (a candidate
counts where the verifier decided it: along the accepted path, and at the first position past it against the
target's own token). Code repeats its context, so long matches earn a high confidence and short ones a low
one, and the fused spine follows the lookup where it has been right.

Being free, it is not routed: it joins every round beside the routed drafters (its `free` flag).
"""
from __future__ import annotations

from specmesh.engine.sequence import Sequence
from specmesh.proposers.fused_drafters import Candidates
from specmesh.proposers.ngram import MatchRecord, SuffixIndex

MIN_N, MAX_N = 2, 6


class ContextDrafter:
    free = True                                   # costs no forward: joins every round, not routed
    dead = False                                  # it lives in this process

    def __init__(self, rows: int, min_n: int = MIN_N, max_n: int = MAX_N):
        self.min_n, self.max_n = min_n, max_n
        self.index: list[SuffixIndex | None] = [None] * rows
        self.record = MatchRecord({n: [0, 0] for n in range(min_n, max_n + 1)})    # match length -> [hits, tries]
        self.paths: list[list[int]] = []          # per row: the spine tokens read this round
        self.spine: list[list[tuple[int, int]]] = []    # per row: its (token, n) candidates along the spine
        self.open: list[tuple[int, int] | None] = [None] * rows    # a candidate past the accepted path
        self.top: Candidates | None = None

    def admit(self, row: int, seq: Sequence) -> None:
        self.index[row], self.open[row] = SuffixIndex(seq.ids, self.min_n, self.max_n), None

    def move_row(self, src: int, dst: int) -> None:
        self.index[dst], self.open[dst] = self.index[src], self.open[src]

    def confidence(self, n: int) -> float:
        return self.record.precision(n)

    def _count(self, candidate: tuple[int, int], truth: int) -> None:
        token, n = candidate
        self.record.count(n, token == truth)

    def begin(self, seqs: list[Sequence]) -> None:
        """Index the tokens accepted since the last round; the newest one decides last round's open candidate."""
        for b, seq in enumerate(seqs):
            index = self.index[b]
            index.extend(seq.tokens[len(index.tokens) - len(seq.ids):])
            if self.open[b] is not None:
                self._count(self.open[b], seq.last)
                self.open[b] = None
        self.paths, self.spine = [[] for _ in seqs], [[] for _ in seqs]

    def read_root(self, seqs: list[Sequence]) -> None:
        self.top = self._lookup([[[]] for _ in seqs])

    def read_level(self, seqs: list[Sequence], pairs: list[tuple[int, int]]) -> None:
        """pairs[b]: (the token row b continues, its own candidate)."""
        for path, (go_on, _) in zip(self.paths, pairs):
            path.append(go_on)
        self.top = self._lookup([[path, path[:-1] + [own]] for path, (_, own) in zip(self.paths, pairs)])

    def read_chain(self, row: int, length: int) -> tuple[list[float], list[int]]:
        """After read_root, the row's spine as read_level would grow it with no other drafter: its candidates'
        confidences and tokens, up to `length` of them (fewer where the lookup finds nothing)."""
        path, spine = self.paths[row], self.spine[row]
        while len(spine) == len(path) + 1 and len(spine) < length:
            path.append(spine[-1][0])
            if (found := self.index[row].next_after(path)) is not None:
                spine.append(found)
        chain = spine[:length]
        return [self.confidence(n) for _, n in chain], [token for token, _ in chain]

    def _lookup(self, reads: list[list[list[int]]]) -> Candidates:
        """Per row, the candidate after each path read (the first: the spine's): probabilities and tokens
        [B][k]; probability 0 where the lookup found nothing (or the spine found nothing at a level before)."""
        probs, tokens = [[0.0] * len(paths) for paths in reads], [[0] * len(paths) for paths in reads]
        for b, paths in enumerate(reads):
            for i, path in enumerate(paths):
                lost = i == 0 and len(self.spine[b]) < len(self.paths[b])
                found = None if lost else self.index[b].next_after(path)
                if found is not None:
                    tokens[b][i], probs[b][i] = found[0], self.confidence(found[1])
                    if i == 0:
                        self.spine[b].append(found)
        return probs, tokens

    def result(self) -> Candidates:
        return self.top

    def finish(self, row: int, accepted: list[int]) -> None:
        """Count the spine candidates the verifier decided; the one just past the accepted path waits for the
        target's token (the next round's newest)."""
        spine, path = self.spine[row], self.paths[row]
        for i, candidate in enumerate(spine):
            if i > len(accepted) or path[:i] != accepted[:i]:
                break
            if i == len(accepted):
                self.open[row] = candidate
            else:
                self._count(candidate, accepted[i])

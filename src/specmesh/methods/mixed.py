"""Several methods in one step: each request names one of the engine's methods (`ar`, `sd`, `tree`, `easyspec`,
`selfdraft`, `suffix`), and one target forward verifies every row's tree, whatever its method.

Each method keeps its own proposer and depth policy (as its own engine would build them) over rows of its own,
numbered 0, 1, ... in the order its sequences came (what a proposer expects of the rows it is given); `Dispatch`
maps the engine's rows to them and back, and keeps each method's rows packed as sequences leave. A row's tree
is what that method alone would have proposed at the batch's width, and the verifier is the one verifier, so every
row's tokens are those of its method alone (greedy; seeded samples of deterministic proposals too).
"""
from __future__ import annotations

import torch

from specmesh.engine.runner import Runner
from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.methods.base import Configured
from specmesh.methods.speculative import DraftDepth, Speculative
from specmesh.options import MIXABLE
from specmesh.proposers import Proposer

class Plain:
    """`ar`'s rows: the newest token alone, verified (so drawn) as a one-row step draws it."""
    levels = 0

    def admit(self, row: int, seq: Sequence) -> None:
        pass

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        return [TokenTree.root(seq.last) for seq in seqs]

    def accept(self, seqs, trees, verdicts, logits=None) -> None:
        pass

    def move_row(self, src: int, dst: int) -> None:
        pass


class Dispatch:
    """The proposers of several methods behind one: engine row -> (method, its own row)."""

    def __init__(self, proposers: dict[str, Proposer], policies: dict[str, DraftDepth], rows: int):
        self.proposers, self.policies = proposers, policies
        self.default = next(iter(proposers))                 # a sequence that names no method
        self.members: dict[str, list[int]] = {name: [] for name in proposers}    # its own row j -> engine row
        self.owner: list[tuple[str, int, Sequence] | None] = [None] * rows      # engine row -> (method, j, seq)
        self.levels = 0

    def admit(self, row: int, seq: Sequence) -> None:
        name = seq.method or self.default
        j = len(self.members[name])
        self.members[name].append(row)
        self.owner[row] = (name, j, seq)
        self.proposers[name].admit(j, seq)

    def move_row(self, src: int, dst: int) -> None:
        """The engine moved row `src` into `dst`, whose sequence finished."""
        self.leave(dst)
        name, j, seq = self.owner[src]
        self.members[name][j], self.owner[dst], self.owner[src] = dst, (name, j, seq), None

    def release(self, seq: Sequence) -> None:
        """A sequence left the batch: its rows freed, unless a move freed them already."""
        for row, held in enumerate(self.owner):
            if held is not None and held[2] is seq:
                self.leave(row)

    def leave(self, row: int) -> None:
        """Free engine row `row`'s place in its method's rows, packing them (its last row moves into the gap)."""
        name, j, _ = self.owner[row]
        self.owner[row] = None
        members = self.members[name]
        last = len(members) - 1
        if j != last:
            self.proposers[name].move_row(last, j)
            moved = members[last]
            members[j] = moved
            self.owner[moved] = (name, j, self.owner[moved][2])
        members.pop()

    def groups(self) -> dict[str, list[int]]:
        """Each running method's engine rows (positions in the step's sequences), in its own rows' order."""
        return {name: rows for name, rows in self.members.items() if rows}

    def budgets(self, seqs: list[Sequence]) -> list[int]:
        """Each row's depth, by its method's policy at the batch's width."""
        out = [0] * len(seqs)
        for name, rows in self.groups().items():
            for b, depth in zip(rows, self.policies[name].budgets([seqs[b] for b in rows], width=len(seqs))):
                out[b] = depth
        return out

    def idle(self) -> None:
        for policy in self.policies.values():
            policy.idle()

    def observe(self, draft_s: float, verify_s: float, trees: list[tuple[int, int, int]]) -> None:
        """The whole step, to every member's policy (`suffix`'s prices its nodes by the forward's time by width)."""
        for policy in self.policies.values():
            policy.observe(draft_s, verify_s, trees)

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        trees: list[TokenTree | None] = [None] * len(seqs)
        self.levels = 0
        for name, rows in self.groups().items():
            proposer = self.proposers[name]
            for b, tree in zip(rows, proposer.propose([seqs[b] for b in rows], [budgets[b] for b in rows])):
                trees[b] = tree
            self.levels = max(self.levels, proposer.levels)
        return trees

    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        for name, rows in self.groups().items():
            self.proposers[name].accept([seqs[b] for b in rows], [trees[b] for b in rows],
                                        [verdicts[b] for b in rows], None if logits is None else logits[rows])


class Mixed(Speculative):
    """The speculative step over a Dispatch, which is its proposer and its depth policy (each row's depth from its
    own method's policy)."""

    def __init__(self, runner: Runner, dispatch: Dispatch):
        super().__init__(runner, dispatch, dispatch)

    def release(self, seq: Sequence) -> None:
        self.proposer.release(seq)


def build_mixed(models, methods: dict[str, Configured], runner: Runner) -> Mixed:
    """Each method built as its own engine would build it, over the same runner; their proposers and policies
    dispatched by the row's method."""
    proposers, policies = {}, {}
    for name, method in methods.items():
        if name not in MIXABLE:
            raise ValueError(f"{name} cannot share a step with other methods; these can: {', '.join(MIXABLE)}")
        if name == "ar":
            proposers[name], policies[name] = Plain(), DraftDepth(0)
            continue
        built = method.spec.build(models, method, runner)
        proposers[name], policies[name] = built.proposer, built.policy
    return Mixed(runner, Dispatch(proposers, policies, runner.rows))

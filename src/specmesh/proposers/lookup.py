"""`sd` with `lookup`: prompt lookup first, the draft model where it finds nothing.

Code and edits repeat their context: where the sequence's last n tokens (n >= `lookup`, longest first) occurred
before, the tokens that followed them are proposed as the chain (ngram.SuffixIndex), and the draft model is not
run this step; elsewhere the draft drafts as in plain `sd`. The candidate chain is a deterministic proposal, so
verification stays lossless when sampling too. The draft reads the tokens it did not propose in its next
step's catch-up, as it reads tokens accepted while speculation was off.
"""
from __future__ import annotations

import torch

from specmesh.engine.sequence import Sequence
from specmesh.proposers.draft_model import DraftModel
from specmesh.proposers.ngram import SuffixIndex
from specmesh.spec.token_tree import TokenTree
from specmesh.spec.verify import Verdict


class LookupFirst:
    def __init__(self, draft: DraftModel, rows: int, min_n: int):
        self.draft, self.min_n = draft, min_n
        self.index: list[SuffixIndex | None] = [None] * rows
        self.looked: list[bool] = []            # per running row: this step's tree came from the lookup

    def admit(self, row: int, seq: Sequence) -> None:
        self.draft.admit(row, seq)
        self.index[row] = SuffixIndex(seq.ids, self.min_n)

    def move_row(self, src: int, dst: int) -> None:
        self.draft.move_row(src, dst)
        self.index[dst] = self.index[src]

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        found = [caught_up(self.index[b], seq).lookup(budget) if budget else []
                 for b, (seq, budget) in enumerate(zip(seqs, budgets))]
        self.looked = [bool(f) for f in found]
        trees = self.draft.propose(seqs, [0 if f else budget for f, budget in zip(found, budgets)])
        return [TokenTree.chain(seq.last, f) if f else tree for seq, f, tree in zip(seqs, found, trees)]

    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        for b, (tree, verdict) in enumerate(zip(trees, verdicts)):
            if self.looked[b]:
                self.draft.queue(b, [tree.tokens[n] for n in verdict.path[1:]])
            else:
                self.draft.keep(b, tree, verdict.path[1:])


def caught_up(index: SuffixIndex, seq: Sequence) -> SuffixIndex:
    """`index`, which holds the prompt and some of the tokens after it, extended to every token committed so far,
    the newest included (the first is committed after the proposer admits the sequence)."""
    index.extend(seq.tokens[len(index.tokens) - len(seq.ids):])
    return index

"""`sd` with `lookup`: prompt lookup first, the draft model where it finds nothing.

Code and edits repeat their context: where the sequence's last n tokens (n >= `lookup`, longest first) occurred
before, the tokens that followed them are proposed as the chain (ngram.SuffixIndex), and the draft model is not
run this step; elsewhere the draft drafts as in plain `sd`. The chain is as long as the step's depth, or
`reach` tokens where the lookup is sure: where matches of its length n had their first token accepted at least
SURE of the time ((hits + 1) / (tries + 2), counted over the engine's requests). A copied stretch of code is
then accepted in long runs, and a verification of many tokens costs less than as many steps (cosine's context
drafter does the same: docs/cosine.md). With `shared` the lookup matches in one SuffixTree over every request the
engine ran (their prompts and outputs, bounded as `suffix` bounds it), so a request repeating earlier work finds
it there; the chain is then the most frequent continuation, token by token. The candidate chain is a deterministic
proposal, so verification stays lossless when sampling too. The draft reads the tokens it did not propose in its
next step's catch-up, as it reads tokens accepted while speculation was off.
"""
from __future__ import annotations

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.proposers.draft_model import DraftModel
from specmesh.proposers.ngram import MatchRecord, SuffixIndex
from specmesh.options import SuffixOptions
from specmesh.proposers.suffix_tree import SuffixTree


SURE = 0.9          # a match length whose first token was accepted this often proposes `reach` tokens
MATCHED = 8         # shared: the longest suffix matched; a tree path holds it and the chain below it
CHAIN = 32          # shared: the chain a path holds at least below the match (a step's depth; `reach` if longer)


class SharedIndex:
    """A request's view of the engine's SuffixTree, read as LookupFirst reads a SuffixIndex: its tokens added to
    the tree as they come (later requests match them), its suffix matched over every request the tree holds."""

    def __init__(self, tree: SuffixTree, tokens: list[int], min_n: int):
        self.tree, self.sid, self.min_n = tree, tree.open(), min_n
        self.tokens: list[int] = []
        self.node = 0                               # the last match's node
        self.extend(tokens)

    def extend(self, tokens: list[int]) -> None:
        self.tokens += tokens
        self.tree.extend(self.sid, list(tokens))

    def match_length(self) -> int | None:
        """The longest suffix (at least min_n tokens, at most MATCHED) that occurred before with a continuation."""
        self.node, n = self.tree.match(self.tokens, MATCHED)
        return n if n >= self.min_n else None

    def chain(self, k: int) -> list[int]:
        """Up to k tokens below the last match, each the most frequent continuation of the path so far."""
        out, node = [], self.node
        while len(out) < k and (kids := self.tree.children(node)):
            node = max(kids.values(), key=lambda c: self.tree.count[c])
            out.append(self.tree.token[node])
        return out


class LookupFirst:
    def __init__(self, draft: DraftModel, rows: int, min_n: int, reach: int = 0, shared: bool = False):
        self.draft, self.min_n, self.reach = draft, min_n, reach
        self.shared = SuffixTree(MATCHED + max(reach, CHAIN), SuffixOptions().cache_tokens) if shared else None
        self.index: list[SuffixIndex | SharedIndex | None] = [None] * rows
        self.looked: list[int | None] = []      # per running row: the match length of this step's lookup, if any
        self.record = MatchRecord()             # match length -> [first tokens accepted, lookups verified]

    def sure(self, n: int) -> bool:
        return self.record.precision(n) >= SURE

    def admit(self, row: int, seq: Sequence) -> None:
        self.draft.admit(row, seq)
        self.index[row] = SharedIndex(self.shared, list(seq.ids), self.min_n) if self.shared else \
            SuffixIndex(seq.ids, self.min_n)

    @property
    def levels(self) -> int:
        return self.draft.levels

    def move_row(self, src: int, dst: int) -> None:
        self.draft.move_row(src, dst)
        self.index[dst] = self.index[src]

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        found, self.looked = [], []
        for b, (seq, budget) in enumerate(zip(seqs, budgets)):
            index = caught_up(self.index[b], seq)
            n = index.match_length() if budget else None
            k = min(self.reach, seq.remaining - 1) if n and self.reach and self.sure(n) else budget
            chain = index.chain(k) if n else []
            found.append(chain)
            self.looked.append(n if chain else None)
        trees = self.draft.propose(seqs, [0 if f else budget for f, budget in zip(found, budgets)])
        return [TokenTree.chain(seq.last, f) if f else tree for seq, f, tree in zip(seqs, found, trees)]

    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        for b, (tree, verdict) in enumerate(zip(trees, verdicts)):
            if self.looked[b]:
                self.record.count(self.looked[b], verdict.accepted > 0)
                self.draft.queue(b, [tree.tokens[n] for n in verdict.path[1:]])
            else:
                self.draft.keep(b, tree, verdict.path[1:])


def caught_up(index: SuffixIndex, seq: Sequence) -> SuffixIndex:
    """`index`, which holds the prompt and some of the tokens after it, extended to every token committed so far,
    the newest included (the first is committed after the proposer admits the sequence)."""
    index.extend(seq.tokens[len(index.tokens) - len(seq.ids):])
    return index

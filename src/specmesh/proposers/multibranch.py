"""Multi-Branch Self-Drafting's proposals (Gao et al., AAAI 2025): no draft model.

Each row's tree below its newest token merges the candidate continuations of two n-gram caches
(the context cache: n-grams of the branches, the prompt and the accepted output, LRU per key
token; the corpus cache: frequent n-grams of a corpus, longest prefix first) with the row's N draft
branches, each a path of the same tree (a branch token sees the root and the branch's earlier
tokens, as in the paper). The target's one forward verifies the tree (branch tokens are
deterministic proposals like the candidates, so sampling stays lossless) and predicts the token
after each branch position: those predictions grow the branches and become contextual n-grams.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specmesh import catalog
from specmesh.engine.sequence import Sequence
from specmesh.lossless.sampling import argmax
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.proposers.branches import Branches
from specmesh.proposers.ngram import ContextCache, CorpusCache

CORPUS: dict[Path, CorpusCache] = {}       # loaded corpus caches, by path


def corpus_cache(target_path: Path | None, path: str, tokenizer=None) -> CorpusCache | None:
    """The corpus cache at `path`, else the target's (catalog.ngram_for), else none; checked against the target's
    `tokenizer` where given."""
    file = Path(path) if path else catalog.ngram_for(target_path)
    if file is None:
        return None
    if file not in CORPUS:
        CORPUS[file] = CorpusCache.load(file)
    if tokenizer is not None:
        CORPUS[file].check(file, tokenizer)
    return CORPUS[file]


def candidates(root: int, sequence: list[int], context: ContextCache, corpus: CorpusCache | None,
               k: int, room: int) -> list[list[int]]:
    """Up to k distinct continuations of the sequence (ending in root), each at most `room` tokens."""
    found = context.lookup(root, k)
    if corpus is not None and len(found) < k:
        found += [c for c in corpus.lookup(sequence, k) if c not in found][:k - len(found)]
    return [list(c[:room]) for c in found if room > 0]


def tail(seq: Sequence, n: int) -> list[int]:
    """The last n tokens of prompt and output."""
    return (seq.ids[-n:] + seq.tokens[-n:])[-n:]


@dataclass
class RowState:
    context: ContextCache
    branches: Branches
    grown: bool = False             # this step's tree holds every branch whole (its predictions count)


class MultiBranch:
    levels = 0          # no draft model: its candidates and branches cost no forward of their own

    def __init__(self, rows: int, branches: int, branch_len: int, gram: int, max_candidates: int,
                 corpus: CorpusCache | None):
        self.count, self.length, self.gram, self.k, self.corpus = branches, branch_len, gram, max_candidates, corpus
        self.rows: list[RowState | None] = [None] * rows

    def admit(self, row: int, seq: Sequence) -> None:
        context = ContextCache(self.gram)
        context.add_sequence(seq.ids)
        seed = seq.params.seed or 0
        self.rows[row] = RowState(context, Branches(self.count, self.length, self.gram, seq.ids, seed=seed))

    def move_row(self, src: int, dst: int) -> None:
        self.rows[dst] = self.rows[src]

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        trees = []
        for b, (seq, budget) in enumerate(zip(seqs, budgets)):
            state = self.rows[b]
            paths = candidates(seq.last, tail(seq, 8), state.context, self.corpus, self.k, budget)
            branches = [branch[:budget] for branch in state.branches.tokens]
            state.grown = all(len(a) == len(b) for a, b in zip(branches, state.branches.tokens))
            trees.append(TokenTree.from_paths(seq.last, paths + [br for br in branches if br]))
        return trees

    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        """Branch predictions become n-grams and grow the branches; the accepted tokens become n-grams."""
        for b, (seq, tree, verdict) in enumerate(zip(seqs, trees, verdicts)):
            state = self.rows[b]
            if state.grown and logits is not None:
                nodes = [tree.node(branch[:j + 1]) for branch in state.branches.tokens for j in range(len(branch))]
                for gram in state.branches.update(argmax(logits[b, nodes])):
                    state.context.add(gram)
            state.context.add_sequence(tail(seq, self.gram - 1) + verdict.tokens)

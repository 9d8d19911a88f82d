"""Suffix decoding (Oliaro et al., SuffixDecoding; Arctic Inference): continuations proposed from a suffix tree over
earlier requests' prompts and outputs and the request's own text, no draft model.

`SuffixTree` counts every continuation of every suffix of the sequences it holds, up to `depth` tokens a path: node
= a token sequence seen, count = how often it occurred. Each step the proposer finds the longest suffix of the
sequence (at most `depth - levels` tokens, so that `levels` continuation levels fit below it) that occurred before
with something after it, and grows a tree below it best-first: a child's probability is its count over its
siblings' (how often that continuation followed), a node's the product down from the root; at most
`min(tree_tokens, factor * match length)` nodes, none below `min_prob`. A long match of text that recurred often
proposes a deep tree, a short or rare one a small tree or none. The tree is a deterministic proposal, verified as
prompt lookup's chains are: lossless greedy and sampling.

Memory is bounded: the tree holds at most `cache_tokens` tokens of sequences (so at most `cache_tokens * depth`
nodes); the oldest sequence is dropped whole (its counts taken back, nodes at zero freed) when a new token would
pass the bound. A sequence dropped while it runs is no longer added to.
"""
from __future__ import annotations

import heapq
import math
from array import array
from collections import OrderedDict

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict


class SuffixTree:
    """Continuation counts of the held sequences' suffixes, paths of at most `depth` tokens below the root (node 0).
    A node's children: None, the one child's id (most nodes: a path seen once), or {token: child}."""

    def __init__(self, depth: int, cache_tokens: int):
        self.depth, self.cache_tokens = depth, cache_tokens
        self.kids: list[int | dict[int, int] | None] = [None]   # node -> its children
        self.count = array("i", [0])                        # node -> occurrences of its path
        self.token = array("i", [-1])                       # node -> the last token of its path
        self.free: list[int] = []                           # node ids to reuse
        self.held: OrderedDict[int, list[int]] = OrderedDict()   # sequence id -> its tokens, oldest first
        self.ends: dict[int, list[int]] = {}                # sequence id -> nodes of its last 1, 2, ... tokens
        self.tokens = 0                                     # tokens held over every sequence
        self.next_id = 0

    @property
    def nodes(self) -> int:
        return len(self.count) - len(self.free) - 1

    def children(self, node: int) -> dict[int, int]:
        kids = self.kids[node]
        return {} if kids is None else {self.token[kids]: kids} if isinstance(kids, int) else kids

    def child(self, node: int, token: int) -> int:
        """The child of `node` adding `token`, or -1."""
        kids = self.kids[node]
        if kids is None:
            return -1
        if isinstance(kids, int):
            return kids if self.token[kids] == token else -1
        return kids.get(token, -1)

    def open(self) -> int:
        """A new, empty sequence; its id."""
        self.next_id += 1
        self.held[self.next_id], self.ends[self.next_id] = [], []
        return self.next_id

    def extend(self, sid: int, tokens: list[int]) -> None:
        """Append `tokens` to sequence `sid` (ignored once it was dropped), dropping the oldest sequences first
        where the bound would be passed."""
        for t in tokens:
            while self.tokens >= self.cache_tokens and self.held:
                self.drop(next(iter(self.held)))
            if sid not in self.held:
                return
            ends = self.ends[sid]
            self.ends[sid] = [self._counted(node, t) for node in [0] + ends[:self.depth - 1]]
            self.held[sid].append(t)
            self.tokens += 1

    def _counted(self, node: int, token: int) -> int:
        """The child of `node` adding `token` (made where missing), its count one more."""
        child = self.child(node, token)
        if child < 0:
            child = self._new(token)
            kids = self.kids[node]
            if kids is None:
                self.kids[node] = child
            elif isinstance(kids, int):
                self.kids[node] = {self.token[kids]: kids, token: child}
            else:
                kids[token] = child
        self.count[child] += 1
        return child

    def _new(self, token: int) -> int:
        if self.free:
            node = self.free.pop()
            self.kids[node], self.count[node], self.token[node] = None, 0, token
            return node
        self.kids.append(None)
        self.count.append(0)
        self.token.append(token)
        return len(self.count) - 1

    def drop(self, sid: int) -> None:
        """Take sequence `sid`'s counts back: every path it added, walked again; nodes left at zero are freed (a
        node's count is at least its children's, so a freed node's subtree goes with it along the same path)."""
        tokens = self.held.pop(sid)
        del self.ends[sid]
        self.tokens -= len(tokens)
        for i in range(len(tokens)):
            node = 0
            for t in tokens[i:i + self.depth]:
                child = self.child(node, t)
                self.count[child] -= 1
                if self.count[child] == 0:
                    self._detach(node, t)
                    self.free.append(child)
                node = child

    def _detach(self, node: int, token: int) -> None:
        kids = self.kids[node]
        if isinstance(kids, int):
            self.kids[node] = None
            return
        del kids[token]
        if len(kids) == 1:
            self.kids[node] = next(iter(kids.values()))

    def match(self, context: list[int], longest: int) -> tuple[int, int]:
        """(node, length) of the longest suffix of `context` (at most `longest` tokens) that occurred with a
        continuation; (0, 0) where none did."""
        for m in range(min(longest, len(context)), 0, -1):
            node = 0
            for t in context[len(context) - m:]:
                node = self.child(node, t)
                if node < 0:
                    break
            if node > 0 and self.kids[node] is not None:
                return node, m
        return 0, 0

    def grow(self, tree: TokenTree, node: int, nodes: int, levels: int, min_prob: float) -> TokenTree:
        """Add below `tree`'s root (whose path is `node`'s), best-first by estimated probability, up to `nodes`
        continuations at most `levels` deep, each at least `min_prob` likely."""
        frontier: list[tuple[float, int, int, int, int, float]] = []   # (-p, tie, node, tree parent, level, p | parent)
        self._push(frontier, node, 0, 0, 1.0, min_prob)
        while frontier and len(tree) <= nodes:
            neg_p, _, at, parent, level, given = heapq.heappop(frontier)
            index = tree.add(self.token[at], parent, given)
            if level < levels:
                self._push(frontier, at, index, level, -neg_p, min_prob)
        return tree

    def _push(self, frontier: list, node: int, index: int, level: int, p: float, min_prob: float) -> None:
        kids = self.children(node).values()
        total = sum(self.count[c] for c in kids)
        for child in kids:
            given = self.count[child] / total
            if p * given >= min_prob:
                heapq.heappush(frontier, (-p * given, child, child, index, level + 1, given))


class SuffixProposer:
    """The proposer of `suffix`: one SuffixTree shared by every request of the engine (or, `private`, a tree of
    each request's own text: prompt lookup's reach), each running sequence added to it as it grows."""
    levels = 0                                  # no draft forwards

    def __init__(self, rows: int, depth: int, cache_tokens: int, tree_tokens: int, factor: float, min_prob: float,
                 private: bool = False):
        self.depth, self.cache_tokens, self.private = depth, cache_tokens, private
        self.tree_tokens, self.factor, self.min_prob = tree_tokens, factor, min_prob
        self.shared = SuffixTree(depth, cache_tokens)
        self.rows: list[tuple[SuffixTree, int] | None] = [None] * rows       # (its tree, its sequence's id)
        self.added = [0] * rows                 # tokens of the row's sequence added to its tree

    def admit(self, row: int, seq: Sequence) -> None:
        tree = SuffixTree(self.depth, self.cache_tokens) if self.private else self.shared
        sid = tree.open()
        tree.extend(sid, list(seq.ids))
        self.rows[row], self.added[row] = (tree, sid), 0

    def move_row(self, src: int, dst: int) -> None:
        self.rows[dst], self.added[dst] = self.rows[src], self.added[src]

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        return [self._propose(b, seq, budget) for b, (seq, budget) in enumerate(zip(seqs, budgets))]

    def _propose(self, row: int, seq: Sequence, levels: int) -> TokenTree:
        tree, sid = self.rows[row]
        tree.extend(sid, seq.tokens[self.added[row]:])          # the newest token included
        self.added[row] = len(seq.tokens)
        proposal = TokenTree.root(seq.last)
        levels = min(levels, self.depth - 1)
        if levels == 0:
            return proposal
        longest = self.depth - levels
        context = (list(seq.ids[-longest:]) + seq.tokens)[-longest:]
        node, m = tree.match(context, longest)
        nodes = min(self.tree_tokens, math.ceil(self.factor * m))
        return tree.grow(proposal, node, nodes, levels, self.min_prob) if m else proposal

    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        """Nothing to learn: the committed tokens join the tree at the next proposal."""

"""Suffix decoding (Oliaro et al., SuffixDecoding; Arctic Inference): continuations proposed from a suffix tree over
earlier requests' prompts and outputs and the request's own text, no draft model.

`SuffixTree` counts every continuation of every suffix of the sequences it holds, up to `depth` tokens a path: node
= a token sequence seen, count = how often it occurred. Each step the proposer finds the longest suffix of the
sequence (at most `depth - levels` tokens, so that `levels` continuation levels fit below it) that occurred before
with something after it, and grows candidates below it best-first by estimated probability: a node's, given its
parent, is its count over its siblings' (how often that continuation followed) times `Confidence` for the length of
the text it continues (the match plus the levels above it: one token of match is a weak witness, twelve a strong
one), learned from the verdicts (never less for a longer text); a path's, the product down from the root. Then
`priced` keeps, over every row, the likeliest candidates up to the number that gives the most tokens per unit of
forward time, the forward's cost by width fitted as the steps run (timing.WidthCost): deep trees where a long match
recurred and a wider forward costs little, none where a guess would cost more than it is likely to save. The tree is
a deterministic proposal, verified as prompt lookup's chains are: lossless greedy and sampling, whatever was kept.

Memory is bounded: the tree holds at most `cache_tokens` tokens of sequences (so at most `cache_tokens * depth`
nodes); the oldest sequence is dropped whole (its counts taken back, nodes at zero freed) when a new token would
pass the bound. A sequence dropped while it runs is no longer added to.
"""
from __future__ import annotations

import heapq
from array import array
from collections import OrderedDict
from typing import NamedTuple, Protocol

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.timing import WidthCost


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


class Confidence:
    """How often a proposed node was right where its parent was, over how often its counts said it would be (the
    sum of their estimates), by the length of the text it continues: the matched suffix and the levels above it.
    Read as a fit that never falls with the length (a longer witness is no weaker): otherwise a length never tried
    keeps its prior, and where the prior is too low for a node of it to pay, it is never tried."""
    LONGEST = 16            # lengths from here on share one figure
    PRIOR = (1.0, 2.0)      # (right, estimated) before any verdict: a half
    MEMORY = 512.0          # estimates a length remembers: past it both sums are halved, so older verdicts fade

    def __init__(self):
        self.right = [self.PRIOR[0]] * (self.LONGEST + 1)       # by length; [0] unused (a length is at least 1)
        self.estimated = [self.PRIOR[1]] * (self.LONGEST + 1)
        self.fitted: list[float] | None = None                  # non_decreasing's, until the next verdict

    def __call__(self, length: int) -> float:
        if self.fitted is None:
            self.fitted = [0.0] + non_decreasing(self.right[1:], self.estimated[1:])
        return min(1.0, self.fitted[min(length, self.LONGEST)])

    def count(self, length: int, estimate: float, right: bool) -> None:
        n = min(length, self.LONGEST)
        self.right[n] += right
        self.estimated[n] += estimate
        if self.estimated[n] > self.MEMORY:
            self.right[n] /= 2
            self.estimated[n] /= 2
        self.fitted = None


def non_decreasing(right: list[float], estimated: list[float]) -> list[float]:
    """The ratios right[i] / estimated[i] fitted non-decreasing in i, by least squares weighted by `estimated`
    (pool adjacent violators: neighbours out of order are pooled, their sums added, until none is)."""
    pools: list[list[float]] = []                   # [right, estimated, cells]
    for r, e in zip(right, estimated):
        pools.append([r, e, 1])
        while len(pools) > 1 and pools[-2][0] * pools[-1][1] > pools[-1][0] * pools[-2][1]:
            last = pools.pop()
            pools[-1] = [a + b for a, b in zip(pools[-1], last)]
    return [r / e for r, e, n in pools for _ in range(int(n))]


class Candidate(NamedTuple):
    p: float            # estimated probability that the target takes the path from the root to this node
    parent: int         # the parent's index among the row's candidates (-1: the root)
    token: int
    length: int         # tokens of the text this node continues (match + levels above it): Confidence's key
    given: float        # the counts' estimate given the parent: this continuation's count over its siblings'


def continuations(tree: SuffixTree, node: int, matched: int, most: int, levels: int, min_prob: float,
                  confidence: Confidence) -> list[Candidate]:
    """Up to `most` continuations of `node`'s path (a suffix of `matched` tokens), at most `levels` deep, each at
    least `min_prob` likely, best first (so by falling p, a parent before its children)."""
    out: list[Candidate] = []
    frontier: list[tuple[float, int, int, int, float]] = []      # (-p, tree node, parent candidate, level, given)

    def push(at: int, index: int, level: int, p: float) -> None:
        kids = tree.children(at).values()
        total = sum(tree.count[c] for c in kids)
        sure = confidence(matched + level)
        for child in kids:
            given = tree.count[child] / total
            if (q := p * min(1.0, sure * given)) >= min_prob:
                heapq.heappush(frontier, (-q, child, index, level + 1, given))

    push(node, -1, 0, 1.0)
    while frontier and len(out) < most:
        neg_p, at, parent, level, given = heapq.heappop(frontier)
        out.append(Candidate(-neg_p, parent, tree.token[at], matched + level - 1, given))
        if level < levels:
            push(at, len(out) - 1, level, -neg_p)
    return out


def priced(rows: list[list[Candidate]], per_token: float, others: int = 0) -> list[int]:
    """How many of each row's candidates to verify: the likeliest first over every row, up to the count with the
    most tokens per unit of forward time, (rows + sum of p) / (1 + per_token * (rows + candidates)), where rows
    counts `others` in the batch besides these (each row's root is verified anyway and gives a token). A row's
    count is a prefix of its list (ties go to the earlier)."""
    merged = sorted((-c.p, r, i) for r, row in enumerate(rows) for i, c in enumerate(row))
    base = len(rows) + others
    best, take, tokens = base / (1 + per_token * base), 0, float(base)
    for k, (neg_p, _, _) in enumerate(merged, 1):
        tokens -= neg_p
        if (rate := tokens / (1 + per_token * (base + k))) > best:
            best, take = rate, k
    counts = [0] * len(rows)
    for _, r, _ in merged[:take]:
        counts[r] += 1
    return counts


def paying(per_token: float, rows: int) -> float:
    """The least probability a node must have to pay for its row in a batch of `rows` (priced's first step:
    (rows + p) / (1 + c (rows + 1)) > rows / (1 + c rows)); each node kept raises it, so none below it is kept."""
    return per_token * rows / (1 + per_token * rows)


class Pricing(Protocol):
    """What the proposer prices its nodes by (methods.speculative.Priced, the step's policy, keeps both)."""
    cost: WidthCost     # the target's forward time by width, fitted as the steps run
    width: int          # sequences in this step's batch, of every method


class SuffixProposer:
    """The proposer of `suffix`: one SuffixTree shared by every request of the engine (or, `private`, a tree of
    each request's own text: prompt lookup's reach), each running sequence added to it as it grows; one Confidence
    learned over every row's verdicts; `policy`, what its nodes are priced by."""
    levels = 0                                  # no draft forwards

    def __init__(self, rows: int, depth: int, cache_tokens: int, tree_tokens: int, min_prob: float,
                 policy: Pricing, private: bool = False):
        self.depth, self.cache_tokens, self.private = depth, cache_tokens, private
        self.tree_tokens, self.min_prob, self.policy = tree_tokens, min_prob, policy
        self.shared = SuffixTree(depth, cache_tokens)
        self.confidence = Confidence()
        self.rows: list[tuple[SuffixTree, int] | None] = [None] * rows       # (its tree, its sequence's id)
        self.added = [0] * rows                 # tokens of the row's sequence added to its tree
        self.proposed: list[list[Candidate]] = [[] for _ in range(rows)]    # the last proposal's nodes 1, 2, ...

    def admit(self, row: int, seq: Sequence) -> None:
        tree = SuffixTree(self.depth, self.cache_tokens) if self.private else self.shared
        sid = tree.open()
        tree.extend(sid, list(seq.ids))
        self.rows[row], self.added[row] = (tree, sid), 0

    def move_row(self, src: int, dst: int) -> None:
        self.rows[dst], self.added[dst] = self.rows[src], self.added[src]

    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        width = self.policy.width
        per_token = self.policy.cost.per_token(width)
        worth = max(self.min_prob, paying(per_token, width))
        rows = [self._candidates(b, seq, budget, worth) for b, (seq, budget) in enumerate(zip(seqs, budgets))]
        counts = priced(rows, per_token, width - len(seqs))
        trees = []
        for b, (seq, row, count) in enumerate(zip(seqs, rows, counts)):
            self.proposed[b] = row[:count]
            tree = TokenTree.root(seq.last)
            for c in self.proposed[b]:
                tree.add(c.token, c.parent + 1, c.p)
            trees.append(tree)
        return trees

    def _candidates(self, row: int, seq: Sequence, levels: int, min_prob: float) -> list[Candidate]:
        tree, sid = self.rows[row]
        tree.extend(sid, seq.tokens[self.added[row]:])          # the newest token included
        self.added[row] = len(seq.tokens)
        levels = min(levels, self.depth - 1)
        if levels == 0:
            return []
        longest = self.depth - levels
        context = (list(seq.ids[-longest:]) + seq.tokens)[-longest:]
        node, m = tree.match(context, longest)
        return continuations(tree, node, m, self.tree_tokens, levels, min_prob, self.confidence) if m else []

    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        """Each node whose parent was accepted was tried: Confidence learns whether it was right. (The committed
        tokens join the suffix tree at the next proposal.)"""
        for b, (tree, verdict) in enumerate(zip(trees, verdicts)):
            on = set(verdict.path)
            for i, c in enumerate(self.proposed[b], 1):
                if tree.parents[i] in on:
                    self.confidence.count(c.length, c.given, i in on)

"""A small draft model proposing a chain (`sd`) or a top-k tree (`tree`, `stpp`) below each row's newest
token, for every running row at once.

The draft's cache has the target's rows. Per row it holds committed tokens, then, while a proposal
is out, the tree nodes it processed (speculative slots, the same slots in every row: all rows grow
trees of one shape). Tokens a row committed that the draft has not read yet wait in `pending`:
the last accepted draft token (a tree's deepest level is never processed), a new prompt's last
`window` tokens, tokens committed while speculation was off.

A proposal of depth d: rows with more than one pending token besides the root read all but the
last of them alone (the prompt's window, shared by a request's samples); then one batched forward
reads each row's last pending token and root (rows with one token fewer get a padding slot that
nothing sees); then d - 1 batched forwards, one per tree level. Each level keeps the `width` best
of the top-`max_children` children of the level before, by cumulative log-probability, and with
`min_prob` only those whose path probability (the product of the draft's probabilities from the root)
is at least that: a node less likely is worth less than the wider verification and the draft forward it
costs, and a level with none ends the tree (every row keeps as many as the row with the most, so that
all rows keep one shape). A sampling chain draws each token from q instead (unless `deterministic`: a
verifier without q rows).
A chain ends early after a token the draft gave less than `stop_below` (sd's option): its next tokens would
likely be rejected, and a draft forward and a wider verification are saved. A request's penalties apply to
the draft's logits as to the target's (the draft then guesses the
penalised target better; losslessness does not depend on it).

The draft reads only the last `window` prompt tokens: its guesses hinge on the recent context, and a
long prompt's draft prefill (and the longer attention of every draft step) cost more than the few
acceptances they buy (docs/methods.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from specmesh.engine.sequence import Sequence
from specmesh.engine.stats import Stats
from specmesh.lossless.penalties import penalise
from specmesh.lossless.sampling import SamplingParams, argmax, probs_from_logits, sample
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.model import Transformer
from specmesh.timing import median_ms


class DraftModel:
    def __init__(self, model: Transformer, rows: int, max_len: int, window: int, width: int = 1,
                 max_children: int = 1, deterministic: bool = False, stop_below: float = 0.0, min_prob: float = 0.0,
                 groups: list[range] = ()):
        self.model, self.window, self.width, self.max_children = model, window, width, max_children
        self.stop_below = stop_below            # a chain ends after a token the draft gives less probability
        self.min_log_prob = math.log(min_prob) if min_prob > 0 else -math.inf   # a tree's nodes: path probability
        self.chain = width == 1 and max_children == 1
        self.deterministic = deterministic
        self.cache = KVCache.for_model(model, rows, max_len, groups=groups)  # a fuzzy draft: its layer groups
        self.pending: list[list[int]] = [[] for _ in range(rows)]     # per row: unread tokens, oldest first
        self.slots: dict[int, int] = {}         # tree node -> speculative slot (the same in every row)
        self.read_together = 2                  # unread tokens a row reads in the root's batched forward
        self.levels = 0                         # draft forwards one after another in the last proposal

    # -- rows -----------------------------------------------------------------------------------
    def admit(self, row: int, seq: Sequence) -> None:
        self.cache.rollback(row, 0)
        self.pending[row] = list(seq.ids[-self.window:])

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)
        self.pending[dst] = self.pending[src]

    # -- proposing --------------------------------------------------------------------------------
    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]:
        """A tree below each row's newest token, at most budgets[b] levels deep."""
        for b, seq in enumerate(seqs):
            self.pending[b].append(seq.last)
        trees = [TokenTree.root(seq.last) for seq in seqs]
        self.slots, self.levels = {}, 0
        depth = max(budgets)
        if depth == 0:
            return trees
        self._catch_up(seqs)
        logits = self._read_pending(seqs)                       # [B, V] at each root
        level, budgets, self.levels = [0], list(budgets), 1
        for d in range(depth):
            level = self._grow(seqs, trees, level, logits, [d < budget for budget in budgets])
            if not level:                           # no node was likely enough (min_prob)
                break
            if self.chain and self.stop_below:      # unsure: the next token would likely be rejected anyway
                budgets = [d + 1 if budget > d + 1 and tree.prob[-1] < self.stop_below else budget
                           for tree, budget in zip(trees, budgets)]
            if d + 1 >= max(budgets):
                break
            logits = self._forward_level(seqs, trees, level)     # [B, width, V]
            self.levels += 1
        return [tree.truncate(budget) for tree, budget in zip(trees, budgets)]

    def _forward(self, seqs: list[Sequence], tokens: list[list[int]], reading: bool, batch: Batch) -> torch.Tensor:
        for seq in seqs:
            seq.stats.draft_forwards += 1
        return self._run(torch.tensor(tokens, device=self.model.device), self.cache.view(0, len(seqs)), reading,
                         batch)

    def _run(self, x: torch.Tensor, cache: KVCache, reading: bool, batch: Batch) -> torch.Tensor:
        """The draft's forward over x [B, T], `reading` committed tokens (a prompt, accepted tokens, the root)
        or growing a level of the tree (the fuzzy drafter runs these differently)."""
        return self.model(x, cache, batch)

    def _catch_up(self, seqs: list[Sequence]) -> None:
        """Rows with more than `read_together` unread tokens read all but the last alone; fresh rows with the same
        tokens (a request's samples) share one forward. A lone row has no other to pad for: it reads them all in
        the root's forward, a forward fewer after a step that accepted many tokens."""
        if len(seqs) == 1:
            return
        done: dict[tuple[int, ...], int] = {}
        for b, seq in enumerate(seqs):
            if len(self.pending[b]) <= self.read_together:
                continue
            read = tuple(self.pending[b][:-1])
            self.pending[b] = self.pending[b][-1:]
            fresh = self.cache.lengths[b] == 0
            if fresh and read in done:
                self.cache.move_row(done[read], b)          # a copy: the source row stays
                continue
            view = self.cache.view(b, b + 1)
            self._run(torch.tensor([read], device=self.model.device), view, True, Batch(last_only=True))
            view.commit_all()
            seq.stats.draft_forwards += 1
            if fresh:
                done[read] = b

    def _read_pending(self, seqs: list[Sequence]) -> torch.Tensor:
        """Each row's unread tokens (up to `read_together`, or all of a lone row's), the root last, in one forward
        (committed); logits [B, V] (the head at the last token only)."""
        B, rows = len(seqs), self.pending[:len(seqs)]
        T = max(len(p) for p in rows)
        if all(len(p) == T for p in rows):
            logits = self._forward(seqs, rows, True, Batch(last_only=True))[:, -1]
            self.cache.commit_all()
        else:                                               # pad short rows in front: a slot nothing sees
            tokens = [[p[0]] * (T - len(p)) + p for p in rows]
            depths = torch.tensor([[0] * (T - len(p)) + list(range(len(p))) for p in rows])
            mask = torch.zeros(B, T, T, dtype=torch.bool)
            for b, p in enumerate(rows):
                pad = T - len(p)
                mask[b, pad:, pad:] = torch.ones(len(p), len(p), dtype=torch.bool).tril()
                mask[b, :pad, :pad] = torch.eye(pad, dtype=torch.bool)
            logits = self._forward(seqs, tokens, True, Batch(depths, mask, last_only=True))[:, -1]
            for b, p in enumerate(rows):
                self.cache.commit(b, range(T - len(p), T))
        for b in range(B):
            self.pending[b] = []
        return logits

    def _grow(self, seqs: list[Sequence], trees: list[TokenTree], level: list[int], logits: torch.Tensor,
              kept: list[bool]) -> list[int]:
        """Add a level below `level` (the same node numbers in every tree) from the draft's logits at
        those nodes ([B, V] or [B, len(level), V]); returns the new level's nodes. Rows whose tree will
        not keep the level (`kept`) get argmax tokens: their generators advance as they would alone."""
        logits = logits.view(len(seqs), len(level), -1)
        if self.chain:
            tops = argmax(logits[:, 0]).tolist()
            for b, (seq, tree) in enumerate(zip(seqs, trees)):
                row = penalise(seq.penalty, logits[b, :1], tree, level)[0]          # [V]
                if seq.params.greedy or self.deterministic or not kept[b]:
                    x = tops[b] if seq.penalty is None else int(argmax(row))
                    tree.add(x, level[0], float(row.float().softmax(-1)[x]) if self.stop_below else 1.0)
                else:                                       # a sampling chain: x ~ q, verified against q
                    q = probs_from_logits(row, seq.params)
                    x = int(sample(q, seq.generator))
                    tree.sampled, tree.q[level[0]] = True, q
                    tree.add(x, level[0], float(q[x]))
            return [len(trees[0]) - 1]
        ranked = [self._rank(seq, tree, level, logits[b]) for b, (seq, tree) in enumerate(zip(seqs, trees))]
        # as many nodes in every row (one shape): the most that pass min_prob in any row, at most `width`
        kept = max(sum(score >= self.min_log_prob for score, *_ in row[:self.width]) for row in ranked)
        k = self.max_children
        return [[tree.add(x, level[i // k], p) for _, i, x, p in sorted(row[:kept], key=lambda c: c[1])]
                for tree, row in zip(trees, ranked)][0]

    def _rank(self, seq: Sequence, tree: TokenTree, level: list[int], logits: torch.Tensor) -> list[tuple]:
        """The top-`max_children` children of each node of `level` (logits [n, V]) as (path log-probability, i,
        token, probability), i = the parent's place in `level` * max_children + the child's rank; best path first."""
        logits = penalise(seq.penalty, logits, tree, level)
        q = logits.float().softmax(-1) if seq.params.greedy else probs_from_logits(logits, seq.params)
        top_p, top_x = (t.cpu() for t in q.topk(self.max_children, dim=-1))  # [n, k]
        scores = torch.tensor([tree.logp[n] for n in level])[:, None] + top_p.log()
        return sorted(zip(scores.flatten().tolist(), range(scores.numel()), top_x.flatten().tolist(),
                          top_p.flatten().tolist()), key=lambda c: (-c[0], c[1]))

    def _forward_level(self, seqs: list[Sequence], trees: list[TokenTree], level: list[int]) -> torch.Tensor:
        """Run the draft over a new level in every row; each node sees its drafted ancestors (the root
        is committed). Returns logits [B, len(level), V]."""
        held = len(self.slots)
        for i, node in enumerate(level):
            self.slots[node] = held + i
        tokens = [[tree.tokens[n] for n in level] for tree in trees]
        if self.chain or len(level) == 1 and trees[0].depths[level[0]] == held + 1:   # below every held node:
            return self._forward(seqs, tokens, False, Batch())                          # the cache's chain mask
        mask = np.zeros((len(trees), len(level), held + len(level)), dtype=bool)     # on the host: the cache
        for b, tree in enumerate(trees):                                               # copies it over once
            for i, node in enumerate(level):
                mask[b, i, [self.slots[anc] for anc in tree.path_to(tree.parents[node])[1:]]] = True
                mask[b, i, held + i] = True
        depths = torch.full((len(level),), trees[0].depths[level[0]] - 1)
        return self._forward(seqs, tokens, False, Batch(depths, torch.from_numpy(mask)))

    # -- learning the verdicts --------------------------------------------------------------------
    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        """Keep each row's accepted path in the draft cache; queue accepted tokens it has not read."""
        for b, (tree, verdict) in enumerate(zip(trees, verdicts)):
            self.keep(b, tree, verdict.path[1:])

    def keep(self, row: int, tree: TokenTree, path: list[int]) -> None:
        """Commit the accepted nodes `path` the draft processed; queue the others."""
        processed = [self.slots[n] for n in path if n in self.slots]     # a prefix of the path
        self.cache.commit(row, processed)
        self.pending[row] += [tree.tokens[n] for n in path[len(processed):]]

    def queue(self, row: int, tokens: list[int]) -> None:
        """Accepted tokens of a tree the draft did not grow (lookup.LookupFirst): read at the next proposal."""
        self.cache.commit(row, [])
        self.pending[row] += tokens


@dataclass
class _Row:
    """What a proposal reads of a sequence, for timing one without an engine (greedy, no penalties)."""
    ids: list[int]
    tokens: list[int]
    stats: Stats = field(default_factory=Stats)
    params: SamplingParams = field(default_factory=SamplingParams)
    penalty: None = None
    generator: None = None

    @property
    def last(self) -> int:
        return self.tokens[-1]


def round_ms(draft: Transformer, depth: int, width: int, children: int, context: int = 128,
             reps: int = 10) -> float:
    """Median time in ms of STPP's drafting each round: a static tree of `depth` levels of at most `width` nodes
    (`children` a node) below a newest token the draft has not read, then a verdict that accepts none of it."""
    gen = torch.Generator().manual_seed(0)
    row = _Row(torch.randint(draft.config.vocab_size, (context,), generator=gen).tolist(), [0])
    drafter = DraftModel(draft, 1, context + 2 * reps + 8 + depth * width, context, width, children,
                         deterministic=True)
    drafter.admit(0, row)

    def step():
        tree = drafter.propose([row], [depth])[0]
        drafter.accept([row], [tree], [Verdict([0], [tree.tokens[-1]], tree.tokens[-1])])
        row.tokens.append(tree.tokens[-1])

    with torch.inference_mode():
        return median_ms(step, reps)

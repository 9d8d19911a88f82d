"""Batched speculative decoding for the serving engine (methods `sd` and `tree`).

`sd` (ChainSpeculator):
The draft model keeps its own cache with the same rows as the target's. Each step it
drafts a chain of γ tokens for every running row at once (γ + 1 batched draft forwards:
the last only processes the γ-th token, so that every row's draft cache then holds
the same slots as the target's will: the root and the γ drafts). The target checks
all chains (groups of rows whose tokens fit the kernels' batch-invariant size per
forward), the shared `verify` decides per row with the row's own parameters and
generator, and both caches commit the same path.

γ shrinks as the batch grows: a wider batch already keeps the weights busy, and every
rejected draft token costs a full row of target compute; from 4 running requests on γ is 0
and the step is plain decoding (README, "Serving"), until the batch has been narrow for
SETTLE_STEPS steps. The draft reads what it has not read yet
(`draft_lag`: a new request's prompt, tokens decoded while speculation was off) in one
forward per request when it next drafts for it.

`tree` (TreeSpeculator): each request's draft grows its own top-k tree (DraftModel, with a
cache of its own), and the target checks the trees of all running requests together, padded
to one size (a padding node sees only the prefix and itself; it is never on an accepted path).
"""
from __future__ import annotations

import torch

from specmesh.cache import KVCache
from specmesh.drafters.draft_model import DraftModel
from specmesh.job import Job
from specmesh.kernels import SMALL_ROWS
from specmesh.sampling import argmax, probs_from_logits
from specmesh.tree import TokenTree
from specmesh.verify import verify

SETTLE_STEPS = 8    # a batch must stay narrow this many steps before speculation resumes


def default_gamma(batch: int) -> int:
    """Draft length for a batch of this many rows (measured: README, "Serving"); 0: no speculation."""
    return 4 if batch <= 2 else 3 if batch == 3 else 0


class ChainSpeculator:
    def __init__(self, draft, max_batch: int, max_len: int, window: int, gamma: int | None = None):
        self.draft, self.window, self.gamma = draft, window, gamma
        self.cache = KVCache.for_model(draft, max_batch, max_len)
        self.narrow_steps = SETTLE_STEPS        # steps in a row whose batch was narrow enough to speculate

    def admit(self, slot: int, request) -> None:
        """Empty the draft's row: it reads the prompt's last `window` tokens when it first drafts
        for the request (in a wide batch, which does not speculate, it may never need them)."""
        self.cache.view(slot, slot + 1).rollback(0, 0)
        request.draft_lag = list(request.prompt[-self.window:])
        if slot == 0:                           # an idle engine: no wide batch to settle from
            self.narrow_steps = SETTLE_STEPS

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

    def speculates(self, batch: int) -> bool:
        """Whether this step speculates (called once per step). After a wide batch, only once the batch
        has stayed narrow for SETTLE_STEPS steps: a brief dip (clients of finished requests sending
        their next ones) would make the draft read every request's skipped tokens for a step or two.
        A request that arrives at an idle engine speculates from its first step, so a seeded request
        sent alone samples the same tokens whatever came before it."""
        narrow = self._gamma(batch) > 0
        self.narrow_steps = self.narrow_steps + 1 if narrow else 0
        return narrow and (self.gamma is not None or self.narrow_steps > SETTLE_STEPS)

    def _gamma(self, batch: int) -> int:
        return self.gamma if self.gamma is not None else default_gamma(batch)

    def skip(self, running: list) -> None:
        """The engine decodes this step plainly: the draft will read these tokens when it next drafts."""
        for request in running:
            request.draft_lag.append(request.last)

    def step(self, running: list, target, target_cache: KVCache, stats) -> list[list[int]]:
        """One speculative step for every running request; returns each one's new tokens."""
        B = len(running)
        gamma = self._gamma(B)
        self._catch_up(running)
        drafts, qs = self._draft(running, gamma)
        tokens = torch.tensor([[r.last] + d for r, d in zip(running, drafts)], device=target.device)
        rows_per_forward = max(1, SMALL_ROWS // (gamma + 1))
        logits = []
        for first in range(0, B, rows_per_forward):
            view = target_cache.view(first, min(B, first + rows_per_forward))
            logits.append(target(tokens[first:first + rows_per_forward], view))      # [rows, γ+1, V]
            stats.target_forwards += 1
        logits = torch.cat(logits)
        out = []
        for b, request in enumerate(running):
            tree = TokenTree.chain(request.last, drafts[b])
            if qs[b]:
                tree.sampled, tree.q = True, dict(enumerate(qs[b]))
            verdict = verify(tree, logits[b], request.params, request.generator)
            target_cache.commit(b, verdict.path)
            self.cache.commit(b, verdict.path)
            stats.drafted += gamma
            stats.accepted += verdict.accepted
            out.append(verdict.tokens)
        return out

    def _catch_up(self, running: list) -> None:
        """Rows whose draft has not read some tokens (a new prompt's, or tokens decoded while
        speculation was off) read them now."""
        for b, request in enumerate(running):
            if request.draft_lag:
                view = self.cache.view(b, b + 1)
                self.draft(torch.tensor([request.draft_lag], device=self.draft.device), view, last_only=True)
                view.commit_all()
                request.draft_lag = []

    def _draft(self, running: list, gamma: int) -> tuple[list[list[int]], list[list[torch.Tensor]]]:
        """γ tokens per row (argmax when greedy, drawn from q when sampling) and the q rows drawn from."""
        B = len(running)
        view = self.cache.view(0, B)
        x = torch.tensor([[r.last] for r in running], device=self.draft.device)
        drafts, qs = [[] for _ in range(B)], [[] for _ in range(B)]
        for d in range(gamma + 1):
            logits = self.draft(x, view)[:, -1]                                        # [B, V]
            if d == gamma:                                  # this forward only processed the γ-th draft
                break
            tops = argmax(logits).tolist()
            for b, request in enumerate(running):
                p = request.params
                if p.greedy:
                    drafts[b].append(tops[b])
                else:
                    q = probs_from_logits(logits[b], p)
                    drafts[b].append(int(torch.multinomial(q, 1, generator=request.generator)))
                    qs[b].append(q)
            x = torch.tensor([[d[-1]] for d in drafts], device=self.draft.device)
        return drafts, qs


class TreeSpeculator:
    def __init__(self, draft, depth: int, width: int, max_children: int, window: int):
        self.draft, self.depth, self.width, self.max_children, self.window = draft, depth, width, max_children, window

    def admit(self, slot: int, request) -> None:
        slack = self.depth * self.width + 1
        job = Job(prompt=request.prompt, params=request.params, generator=request.generator,
                  max_len=len(request.prompt) + request.row.limit + slack, limit=request.row.limit)
        request.drafter = DraftModel(self.draft, job, self.window)

    def move_row(self, src: int, dst: int) -> None:
        pass                                    # each request's draft cache is its own

    def speculates(self, batch: int) -> bool:
        return True

    def step(self, running: list, target, target_cache: KVCache, stats) -> list[list[int]]:
        trees = [r.drafter.propose(r.last, min(self.depth, r.row.limit - len(r.row.tokens) - 1), self.width,
                                   self.max_children) for r in running]
        B, N = len(trees), max(len(t) for t in trees)
        tokens = torch.zeros(B, N, dtype=torch.long)
        depths = torch.zeros(B, N, dtype=torch.long)
        mask = torch.eye(N, dtype=torch.bool).repeat(B, 1, 1)          # padding nodes: themselves only
        for b, tree in enumerate(trees):
            n = len(tree)
            tokens[b, :n], depths[b, :n] = torch.tensor(tree.tokens), torch.tensor(tree.depths)
            mask[b, :n, :n] = tree.ancestor_mask()
        rows = max(1, SMALL_ROWS // N)
        logits = []
        for first in range(0, B, rows):
            group = slice(first, min(B, first + rows))
            view = target_cache.view(group.start, group.stop)
            logits.append(target(tokens[group].to(target.device), view, depths=depths[group],
                                 tree_mask=mask[group]))                   # [rows, N, V]
            stats.target_forwards += 1
        logits = torch.cat(logits)
        out = []
        for b, (request, tree) in enumerate(zip(running, trees)):
            verdict = verify(tree, logits[b, :len(tree)], request.params, request.generator)
            target_cache.commit(b, verdict.path)
            request.drafter.accept(tree, verdict)
            stats.drafted += len(tree) - 1
            stats.accepted += verdict.accepted
            out.append(verdict.tokens)
        return out

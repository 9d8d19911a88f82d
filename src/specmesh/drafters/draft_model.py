"""A small draft model that proposes a chain or a top-k tree below the current root.

The draft keeps its own KV cache: committed tokens, plus the tree nodes it has
processed while drafting (speculative slots). Accepted tokens it has not processed
yet wait in `pending` and go in front of the next proposal's first forward.

The draft reads only the last `window` prompt tokens: its guesses hinge on the recent
context, and a long prompt's draft prefill (plus the longer attention of every draft
step) cost more than the few acceptances they buy (README, "Defaults").
"""
from __future__ import annotations

import torch

from specmesh.cache import KVCache
from specmesh.job import Job
from specmesh.sampling import argmax, probs_from_logits
from specmesh.tree import TokenTree
from specmesh.verify import Verdict


class DraftModel:
    def __init__(self, model, job: Job, window: int):
        self.model, self.job = model, job
        self.cache = KVCache.for_model(model, 1, job.max_len)
        prompt = job.prompt[-window:]
        if len(prompt) > 1:                 # the last prompt token goes in with the first proposal
            job.prefill(model, self.cache, prompt[:-1], "draft")
        self.pending = prompt[-1:]
        self.slots: dict[int, int] = {}     # tree node -> draft speculative slot

    def _forward(self, tokens: list[int], last_only: bool = False, **tree) -> torch.Tensor:
        self.job.stats.draft_forwards += 1
        return self.model(torch.tensor([tokens], device=self.model.device), self.cache, last_only=last_only, **tree)[0]

    def _dist(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft probabilities [n, V]: the sampling transform when sampling, plain softmax when greedy."""
        params = self.job.params
        return logits.float().softmax(-1) if params.greedy else probs_from_logits(logits, params)

    def propose(self, root: int, depth: int, width: int = 1, max_children: int = 1,
                deterministic: bool = False) -> TokenTree:
        """Grow a tree of `depth` levels below `root`: each level keeps the `width` best of the
        top-`max_children` children of the previous level (by cumulative log-probability).
        A sampling chain (width = max_children = 1) draws each token from q instead, unless
        `deterministic` (then verification needs no q rows)."""
        self.pending.append(root)
        tree = TokenTree.root(root)
        self.slots = {}
        if depth == 0:
            return tree
        logits = self._forward(self.pending, last_only=True)          # [1, V] at the root
        self.cache.commit_all()
        self.pending = []
        chain = width == 1 and max_children == 1
        greedy = self.job.params.greedy
        tree.sampled = chain and not greedy and not deterministic
        level = [0]
        for d in range(depth):
            if chain and greedy:                                # argmax chain: no distribution needed
                level = [tree.add(int(argmax(logits[-1])), level[0])]
                if d + 1 < depth:
                    logits = self._forward_level(tree, level)
                continue
            q = self._dist(logits)                              # [len(level), V]
            if tree.sampled:
                tree.q[level[0]] = q[0]
                x = int(torch.multinomial(q[0], 1, generator=self.job.generator))
                level = [tree.add(x, level[0], float(q[0, x]))]
            else:
                level = self._expand(tree, level, q, width, max_children)
            if d + 1 < depth:
                logits = self._forward_level(tree, level)
        return tree

    def _expand(self, tree: TokenTree, level: list[int], q: torch.Tensor, width: int, k: int) -> list[int]:
        top_p, top_x = q.topk(k, dim=-1)                        # [n, k]
        scores = torch.tensor([tree.logp[n] for n in level], device=q.device)[:, None] + top_p.log()
        best = scores.flatten().topk(min(width, scores.numel())).indices.sort().values.tolist()
        top_p, top_x = top_p.flatten().tolist(), top_x.flatten().tolist()
        return [tree.add(top_x[i], level[i // k], top_p[i]) for i in best]

    def _forward_level(self, tree: TokenTree, level: list[int]) -> torch.Tensor:
        """Run the draft over one new tree level; each node sees its drafted ancestors (the root is committed)."""
        held = len(self.slots)
        if len(level) == 1 and tree.parents[level[0]] == len(tree) - 2 and held == len(tree) - 2:
            self.slots[level[0]] = held                         # a chain so far: the cache's default mask
            return self._forward([tree.tokens[level[0]]])
        mask = torch.zeros(len(level), held + len(level), dtype=torch.bool)
        for i, node in enumerate(level):
            for anc in tree.path_to(tree.parents[node])[1:]:
                mask[i, self.slots[anc]] = True
            mask[i, held + i] = True
            self.slots[node] = held + i
        depths = torch.tensor([tree.depths[n] - 1 for n in level])
        return self._forward([tree.tokens[n] for n in level], depths=depths, tree_mask=mask)

    def accept(self, tree: TokenTree, verdict: Verdict) -> None:
        """Keep the accepted path in the draft cache; queue accepted tokens it has not processed."""
        path = verdict.path[1:]
        processed = [self.slots[n] for n in path if n in self.slots]   # a prefix of the path
        self.cache.commit(0, processed)
        self.pending += [tree.tokens[n] for n in path[len(processed):]]

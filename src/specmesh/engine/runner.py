"""The target model over the engine's cache rows: prefills (shared by a request's samples, read from the
prefix cache where it holds them) and batched forwards over the running rows.

Running sequence i holds cache row i. A forward over the running rows takes them in groups of at
most GROUP_TOKENS tokens (rows x new tokens each), the size up to which the CPU kernels compute a
row the same way whatever the number of rows: a sequence's logits are bit for bit the same alone
or in a batch (docs/serving.md).
"""
from __future__ import annotations

import torch

from specmesh.engine.prefix_cache import PrefixCache
from specmesh.engine.sequence import Sequence
from specmesh.engine.stats import EngineStats
from specmesh.kernels import SMALL_ROWS
from specmesh.model.cache import KVCache
from specmesh.model.model import Transformer
from specmesh.spec.token_tree import TokenTree

GROUP_TOKENS = SMALL_ROWS


class Runner:
    def __init__(self, model: Transformer, rows: int, max_len: int, stats: EngineStats,
                 prefix_cache: PrefixCache | None = None):
        self.model, self.stats, self.prefix_cache = model, stats, prefix_cache
        self.rows, self.max_len = rows, max_len
        self.device = model.device
        self._cache: KVCache | None = None

    @property
    def cache(self) -> KVCache:
        """[rows, max_len] slots, allocated on first use (the multi-process methods keep caches of their own)."""
        if self._cache is None:
            self._cache = KVCache.for_model(self.model, self.rows, self.max_len)
        return self._cache

    def prefill(self, seq: Sequence, row: int) -> torch.Tensor:
        """Put seq's prompt into `row` (empty) as committed tokens; returns the logits after it [1, V].
        The first of a prompt's sequences computes it (after what the prefix cache holds of it); the
        others copy its keys and values."""
        prompt = seq.prompt
        prompt.waiting -= 1
        if prompt.kv is not None:
            self.cache.fill(row, [k[0] for k in prompt.kv[0]], [v[0] for v in prompt.kv[1]])
            logits = prompt.logits
        else:
            logits = self._compute(seq, row)
            if prompt.waiting > 0:                  # siblings still wait for a row: keep the prompt
                prompt.kv, prompt.logits = self.cache.view(row, row + 1).prefix(), logits
        if prompt.waiting == 0:
            prompt.kv = prompt.logits = None
        return logits

    def _compute(self, seq: Sequence, row: int) -> torch.Tensor:
        view = self.cache.view(row, row + 1)
        view.rollback(0, 0)
        cached = self.prefix_cache.load(seq.ids, self.cache, row) if self.prefix_cache else 0
        ids = torch.tensor([seq.ids[cached:]], device=self.device)
        logits = self.model(ids, view, last_only=True)[:, -1]
        view.commit_all()
        if self.prefix_cache:
            self.prefix_cache.store(seq.ids, self.cache, row)
        seq.stats.target_forwards += 1
        self.stats.target_forwards += 1
        self.stats.prefills += 1
        self.stats.cached_prompt_tokens += cached
        return logits

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """tokens [B, N] for rows 0..B-1 (depths [B, N], mask [B, N, N] over the new slots: a tree per
        row; None: chains) -> logits [B, N, V]; the new slots stay speculative."""
        B, N = tokens.shape
        per = max(1, GROUP_TOKENS // N)
        out = []
        for first in range(0, B, per):
            group = slice(first, min(B, first + per))
            tree = {} if mask is None else {"depths": depths[group], "tree_mask": mask[group]}
            out.append(self.model(tokens[group], self.cache.view(group.start, group.stop), **tree))
            self.stats.target_forwards += 1
        return out[0] if len(out) == 1 else torch.cat(out)

    def forward_trees(self, trees: list[TokenTree]) -> torch.Tensor:
        """One tree per running row, padded to one size N -> logits [B, N, V]. Chains of one length
        need no mask; a padding node sees only the prefix and itself and is never on a path."""
        B, N = len(trees), max(len(t) for t in trees)
        if all(len(t) == N for t in trees) and all(t.is_chain() for t in trees):
            return self.forward(torch.tensor([t.tokens for t in trees], device=self.device))
        tokens = torch.zeros(B, N, dtype=torch.long)
        depths = torch.zeros(B, N, dtype=torch.long)
        mask = torch.eye(N, dtype=torch.bool).repeat(B, 1, 1)
        for b, tree in enumerate(trees):
            n = len(tree)
            tokens[b, :n], depths[b, :n] = torch.tensor(tree.tokens), torch.tensor(tree.depths)
            mask[b, :n, :n] = tree.ancestor_mask()
        return self.forward(tokens.to(self.device), depths.to(self.device), mask.to(self.device))

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

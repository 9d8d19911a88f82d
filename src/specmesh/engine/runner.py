"""The target model over the engine's cache rows: prefills (shared by a request's samples, read from the
prefix cache where it holds them) and batched forwards over the running rows.

A prompt longer than `chunk` tokens is computed before it takes a row, one chunk per engine step, in a
staging row of its own: the running rows' steps go on in between, and a request whose client leaves
stops costing anything within a chunk (the engine stops staging it). Once whole, its keys and values
wait in the Prompt like those a request's other samples share.

Running sequence i holds cache row i. A forward over the running rows takes them in groups of at
most GROUP_TOKENS tokens (rows x new tokens each), the size up to which the CPU kernels compute a
row the same way whatever the number of rows: a sequence's logits are bit for bit the same alone
or in a batch (docs/serving.md).
"""
from __future__ import annotations

import numpy as np
import torch

from specmesh.engine.prefix_cache import MIN_REST, PrefixCache
from specmesh.engine.sequence import Prompt, Sequence
from specmesh.engine.stats import EngineStats
from specmesh.kernels import SMALL_ROWS
from specmesh.lossless.token_tree import TokenTree
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.model import Transformer

GROUP_TOKENS = SMALL_ROWS
PREFILL_CHUNK = 128         # prompt tokens a step computes (docs/serving.md)
PREFILL_SHARE = 1 / 3       # the server's share of time for prefills while requests decode (Engine.prefill_share)


class Runner:
    def __init__(self, model: Transformer, rows: int, max_len: int, prefix_cache: PrefixCache | None = None,
                 chunk: int = PREFILL_CHUNK):
        self.model, self.prefix_cache = model, prefix_cache
        self.stats = EngineStats()              # the engine's counters (Engine.stats)
        self.rows, self.max_len = rows, max_len
        # the prefix cache's bits need every chunk on the prefill kernels' path: MIN_REST tokens at least
        self.chunk, self.min_chunk = (max(chunk, MIN_REST), MIN_REST) if prefix_cache else (chunk, 1)
        self.device = model.device
        self._cache: KVCache | None = None
        self._staging: KVCache | None = None
        self.staged: Prompt | None = None       # the long prompt in the staging row
        self.prompt_tail = 1                    # a prefill's logits: after the prompt's last this many tokens
        # tokens a forward of several rows takes at most: GROUP_TOKENS, where more would go through products whose
        # rounding depends on the rows; without a limit where the kernels' long forward computes a token as their
        # one-call forward does (their products and C attention: without AMX), so the weights are read once
        fast = model.fast_forward
        self.group_tokens = None if fast is not None and fast.long and fast.c_attention \
            else GROUP_TOKENS

    @property
    def cache(self) -> KVCache:
        """[rows, max_len] slots, allocated on first use (the multi-process methods keep caches of their own)."""
        if self._cache is None:
            self._cache = KVCache.for_model(self.model, self.rows, self.max_len)
        return self._cache

    def needs_chunks(self, prompt: Prompt) -> bool:
        return prompt.kv is None and len(prompt.ids) > self.chunk

    def prefill_chunk(self, seq: Sequence) -> bool:
        """Compute the next chunk of seq's long prompt in the staging row (starting over unless it is the
        staged one); True once it is whole: then `prefill` copies it into a row."""
        prompt = seq.prompt
        if self._staging is None:
            self._staging = KVCache.for_model(self.model, 1, self.max_len)
        cache = self._staging
        if self.staged is not prompt:
            self.staged = prompt
            cache.rollback(0, 0)
            cached = self.prefix_cache.load(seq.ids, cache, 0) if self.prefix_cache else 0
            self.stats.cached_prompt_tokens += cached
        done = int(cache.lengths[0])
        rest = len(seq.ids) - done
        take = rest if rest < self.chunk + self.min_chunk else self.chunk
        ids = torch.tensor([seq.ids[done:done + take]], device=self.device)
        logits = self.model(ids, cache, Batch(last_only=self.prompt_tail))[0]
        cache.commit_all()
        self.stats.target_forwards += 1
        self.stats.prefill_pending = len(seq.ids) - done - ids.shape[1]
        if self.stats.prefill_pending:
            return False
        seq.stats.target_forwards += 1          # a sequence's prefill is one forward of its own, however chunked
        if self.prefix_cache:
            self.prefix_cache.store(seq.ids, cache, 0)
        prompt.kv, prompt.logits = cache.prefix(), logits
        self.staged = None
        self.stats.prefills += 1
        return True

    def drop_staged(self) -> None:
        self.staged, self.stats.prefill_pending = None, 0

    def prefill(self, seq: Sequence, row: int) -> torch.Tensor:
        """Put seq's prompt into `row` (empty) as committed tokens; returns the logits after its last tokens
        [n, V] (n = `prompt_tail`, or fewer where the prefix cache or the chunks held the others).
        The first of a prompt's sequences computes it (after what the prefix cache holds of it); the
        others copy its keys and values."""
        prompt = seq.prompt
        prompt.waiting -= 1
        if prompt.kv is not None:
            self.cache.fill_prefix(row, prompt.kv)
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
        logits = self.model(ids, view, Batch(last_only=self.prompt_tail))[0]
        view.commit_all()
        if self.prefix_cache:
            self.prefix_cache.store(seq.ids, self.cache, row)
        seq.stats.target_forwards += 1
        self.stats.target_forwards += 1
        self.stats.prefills += 1
        self.stats.cached_prompt_tokens += cached
        return logits

    def forward(self, tokens: torch.Tensor, depths: torch.Tensor | None = None,
                mask: torch.Tensor | None = None, lens: list[int] | None = None) -> torch.Tensor:
        """tokens [B, N] for rows 0..B-1 (depths [B, N], mask [B, N, N] over the new slots: a tree per
        row; None: chains; lens: each row's real tokens, the rest padding) -> logits [B, N, V]; the new slots stay
        speculative."""
        B, N = tokens.shape
        per = B if self.group_tokens is None else max(1, self.group_tokens // N)
        out = []
        for first in range(0, B, per):
            group = slice(first, min(B, first + per))
            batch = Batch(lens=None if lens is None else lens[group]) if mask is None else \
                Batch(depths[group], mask[group], lens=None if lens is None else lens[group])
            out.append(self.model(tokens[group], self.cache.view(group.start, group.stop), batch))
            self.stats.target_forwards += 1
        return out[0] if len(out) == 1 else torch.cat(out)

    def forward_trees(self, trees: list[TokenTree]) -> torch.Tensor:
        """One tree per running row, padded to one size N -> logits [B, N, V]. Chains of one length
        need no mask; a padding node sees only the prefix and itself and is never on a path, and the kernels skip
        its products (on a CPU a padded row costs a row's: one row's chain of 32 made a 4-row step verify 128)."""
        B, N = len(trees), max(len(t) for t in trees)
        if all(len(t) == N for t in trees) and all(t.is_chain() for t in trees):
            return self.forward(torch.tensor([t.tokens for t in trees], device=self.device))
        tokens, depths = np.zeros((B, N), dtype=np.int64), np.zeros((B, N), dtype=np.int64)
        mask = np.tile(np.eye(N, dtype=bool), (B, 1, 1))
        for b, tree in enumerate(trees):
            n = len(tree)
            tokens[b, :n], depths[b, :n] = tree.tokens, tree.depths
            mask[b, :n, :n] = tree.ancestor_mask().numpy()
        # depths and mask stay on the host, where the cache reads them (KVCache.prepare)
        return self.forward(torch.from_numpy(tokens).to(self.device), torch.from_numpy(depths), torch.from_numpy(mask),
                            [len(t) for t in trees])

    def move_row(self, src: int, dst: int) -> None:
        self.cache.move_row(src, dst)

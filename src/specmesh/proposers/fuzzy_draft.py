"""EasySpec's drafter (Wu et al., NeurIPS 2025): the draft model growing its tree with layer-parallel
("fuzzy") forwards, and bonus calibration.

Growing a level, the draft's layers run in groups (consecutive layer ranges): a group's attention blocks all
read the group's input hidden state, so they can run at once (on the devices a tensor-parallel target leaves
idle while it waits for its draft, or computed together on one); the MLPs follow in order
(model.layer_parallel). The keys and values those forwards write are fuzzy. Bonus calibration throws
them away after a verification: the accepted tokens are read again, exactly (layer after layer), together
with the bonus token in the forward that starts the next round, so the next tree grows from the exact
cache. Policies (`calibration`):
  never     every draft forward is fuzzy, the prompt's included, and its entries stay
  prefill   the prompt is read exactly; afterwards as `never`
  round     every round's fuzzy entries are replaced (the paper)
  mismatch  as `round`, but a round whose drafts were all accepted keeps its fuzzy entries (the authors'
            code's default)
A batched root read is exact when any of its rows is due for calibration.

The proposals are the draft's own: chains drawn from q carry that q, top-k trees are deterministic, and the
one verifier (lossless/verify.py) decides. Fuzziness costs acceptance, never losslessness (unlike the authors'
sampling path, which verifies greedy drafts against a softmax q).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.model import Transformer
from specmesh.proposers.draft_model import DraftModel



def default_groups(layers: int, size: int = 2) -> list[int]:
    """Group sizes for a draft this deep: the first and last eighth of the layers (at least one each) exact,
    the middle ones in groups of `size` (pairs: the authors' example for 32 layers: 4 alone, 12 pairs, 4 alone;
    a remainder group smaller)."""
    edge = max(1, layers // 8)
    if layers <= 2 * edge:
        return [1] * layers
    middle = layers - 2 * edge
    full, rest = divmod(middle, size)
    return [1] * edge + [size] * full + ([rest] if rest else []) + [1] * edge


def layer_groups(spec: str, layers: int) -> list[range]:
    """Consecutive layer ranges from group sizes ("1,2,1"; "" for default_groups)."""
    try:
        sizes = [int(s) for s in spec.split(",")] if spec else default_groups(layers)
    except ValueError:
        raise ValueError(f"easyspec: layer_groups must be group sizes like 1,2,1, got {spec!r}") from None
    if any(n < 1 for n in sizes) or sum(sizes) != layers:
        raise ValueError(f"easyspec: layer_groups {spec!r} must be positive sizes adding up to the draft's "
                         f"{layers} layers")
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [range(s, s + n) for s, n in zip(starts, sizes)]


def count_exact(seq: Sequence, forwards: int) -> None:
    """Draft forwards that read exactly (what a simulated clock prices as exact ones)."""
    seq.stats.info["exact_reads"] = seq.stats.info.get("exact_reads", 0) + forwards


class FuzzyDraft(DraftModel):
    def __init__(self, model: Transformer, rows: int, max_len: int, window: int, groups: list[range],
                 calibration: str, depth: int, width: int = 1, max_children: int = 1):
        # calibration: one of options.POLICIES (EasySpecOptions checks it)
        super().__init__(model, rows, max_len, window, width, max_children, groups=groups)
        self.groups, self.calibration = groups, calibration
        self.read_together = depth + 1          # a calibration's accepted tokens and the bonus, in one forward
        self.due = [False] * rows               # per row: its next root read must be exact
        self.exact = False                      # the forward now running reads exactly

    def admit(self, row: int, seq: Sequence) -> None:
        super().admit(row, seq)
        self.due[row] = self.calibration != "never"

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self.due[dst] = self.due[src]

    def _run(self, x: torch.Tensor, cache: KVCache, reading: bool, batch: Batch) -> torch.Tensor:
        if reading and self.exact:
            return self.model(x, cache, batch)
        return self.model(x, cache, replace(batch, groups=self.groups))

    def _catch_up(self, seqs: list[Sequence]) -> None:
        self.exact = self.calibration != "never"             # a prompt (or a long queue): exact unless never
        before = [seq.stats.draft_forwards for seq in seqs]
        super()._catch_up(seqs)
        if self.exact:
            for seq, n in zip(seqs, before):
                count_exact(seq, seq.stats.draft_forwards - n)

    def _read_pending(self, seqs: list[Sequence]) -> torch.Tensor:
        # exact where due, or where a lone row reads a prompt or a long queue here (as _catch_up would: exact)
        queued = any(len(p) > self.read_together for p in self.pending[:len(seqs)])
        self.exact = any(self.due[:len(seqs)]) or queued and self.calibration != "never"
        for b, seq in enumerate(seqs):
            self.due[b] = False
            if self.exact:
                count_exact(seq, 1)
        return super()._read_pending(seqs)

    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None:
        for b, (tree, verdict) in enumerate(zip(trees, verdicts)):
            missed = verdict.accepted < max(tree.depths)
            self.due[b] = self.calibration == "round" or self.calibration == "mismatch" and missed
            if self.due[b]:                 # bonus calibration: drop the round's entries, read its tokens again
                self.cache.prune(b, [])
                self.pending[b] += [tree.tokens[n] for n in verdict.path[1:]]
            else:
                self.keep(b, tree, verdict.path[1:])

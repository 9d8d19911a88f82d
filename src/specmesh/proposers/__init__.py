"""Everything that proposes tokens, behind one interface.

A proposer keeps per-row state beside the engine's cache rows (running sequence i holds row i):
  admit(row, seq)                     a new sequence took `row`
  propose(seqs, budgets) -> trees     a TokenTree below each sequence's newest token, at most
                                      budgets[i] levels deep (0: the root alone)
  accept(seqs, trees, verdicts, logits)  the verifier's verdicts, and the target's logits at every
                                      node ([B, N, V]: Self-Draft reads its branches' predictions there)
  move_row(src, dst)                  the engine moved a sequence to another row

A tree may hold nodes from several sources (n-gram candidates and branches; later fused drafters);
chains drawn from the draft distribution carry their q rows (`TokenTree.sampled`), so `verify` uses
rejection sampling for them. Implementations: draft_model.DraftModel (chains and top-k trees; lookup.LookupFirst
puts prompt lookup before its chains),
multibranch.MultiBranch (n-gram caches and branches), fused_drafters.FusedDrafters (cosine: several drafters
routed per request, their tokens fused into one tree; context_drafter.ContextDrafter is one of them, prompt lookup
with no model), suffix_tree.SuffixProposer (suffix decoding over earlier requests); pipedec's dynamic tree (dynamic_tree.TreeDrafter)
and PEARL's draft rank (remote_chain) propose inside their own loops, across processes.
"""
from __future__ import annotations

from typing import Protocol

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict


class Proposer(Protocol):
    levels: int         # draft forwards one after another in the last proposal (0: none; what a simulated clock prices)

    def admit(self, row: int, seq: Sequence) -> None: ...
    def propose(self, seqs: list[Sequence], budgets: list[int]) -> list[TokenTree]: ...
    def accept(self, seqs: list[Sequence], trees: list[TokenTree], verdicts: list[Verdict],
               logits: torch.Tensor | None = None) -> None: ...
    def move_row(self, src: int, dst: int) -> None: ...

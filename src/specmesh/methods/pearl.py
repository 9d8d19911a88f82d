"""PEARL (Liu et al., ICLR 2025): the draft and the target run at the same time, in two processes.

Rank 0 holds the target and decides everything; rank 1 holds the draft and drafts
without pause. Each round both work at once: the draft drafts γ tokens while the
target runs one forward over the newest committed token and the drafts still
undecided; then the new drafts (and, when sampling, their q rows) go to rank 0,
which verifies and answers with one decision: how many undecided drafts are accepted,
and the target's correction token if one was rejected.

* pre-verify (no drafts undecided): the target's forward is the newest token alone,
  and its logits check the round's first draft at once. Rejected: the target's token
  is appended and the other γ−1 drafts are dropped with no verification forward.
  Accepted: the others become the undecided drafts; mode post-verify.
* post-verify: the target verifies the undecided drafts while the draft drafts γ more
  as if all were accepted; the logits after the last undecided draft check the first
  new one. All accepted: the new drafts become the undecided ones, no bonus token,
  the mode stays. Otherwise the accepted prefix plus the correction is kept, the new
  drafts are dropped, and the mode returns to pre-verify.

The mode is not stored: a round pre-verifies exactly when no drafts are undecided.
Verification is the shared `verify` (sampling: the standard rule with each draft's
q), on rank 0 only; the draft commits what it is told, so the ranks cannot diverge.
γ defaults to round(c), c = target forward time / draft forward time, both measured
at start-up with one thread each, at the same time (the paper's Table 6 choice).
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.methods.ar import target_token
from specmesh.methods.base import MethodSpec, Models
from specmesh.methods.loop import Loop, prefill
from specmesh.model.cache import KVCache
from specmesh.proposers.remote_chain import MAX_GAMMA, DraftPeer
from specmesh.spec.token_tree import TokenTree
from specmesh.spec.verify import Verdict, verify
from specmesh.timing import rank_threads

DEFAULTS = {"gamma": 0, "draft_window": 64, "timeout": 30}    # gamma 0: round(c), measured at start-up


class RanksDivergedError(RuntimeError):
    pass


def slack(options: dict) -> int:
    return (options["gamma"] or MAX_GAMMA) + 1          # the newest token and the undecided drafts


def start(models: Models, draft: Path, dtype: torch.dtype, options: dict) -> None:
    """Method hook (LLM): the draft lives in its own process."""
    models.remote = DraftPeer.start(models.target, draft, dtype, options["timeout"])


# ---------------------------------------------------------------------------------------------
# rank 0: the decode loop


class Rounds:
    """Rank 0's bookkeeping between rounds: the newest committed token (not yet processed by
    the target) and the undecided drafts with their q rows. Pure: tests script it."""

    def __init__(self, root: int):
        self.fresh, self.undecided, self.q = root, [], None

    @property
    def mode(self) -> str:
        return "post-verify" if self.undecided else "pre-verify"

    def inputs(self) -> list[int]:
        """The tokens of this round's target forward."""
        return [self.fresh] + self.undecided

    def chain(self, drafts: list[int], q: torch.Tensor | None) -> TokenTree:
        """The undecided drafts plus the round's first new one, below the newest token."""
        tree = TokenTree.chain(self.fresh, self.undecided + drafts[:1])
        if q is not None:
            tree.sampled = True
            rows = list(self.q) + [q[0]] if self.undecided else [q[0]]
            tree.q = dict(enumerate(rows))
        return tree

    def settle(self, verdict: Verdict, drafts: list[int], q: torch.Tensor | None) -> tuple[int, int, int]:
        """Apply the verdict; returns (accepted drafts, correction token or -1, target cache slots to commit)."""
        accepted = verdict.accepted
        commit = 1 + min(accepted, len(self.undecided))
        if verdict.next_token is None:                       # all accepted: the new drafts are next
            self.fresh, self.undecided = drafts[0], drafts[1:]
            self.q = None if q is None else q[1:]
            return accepted, -1, commit
        self.fresh, self.undecided, self.q = verdict.next_token, [], None
        return accepted, verdict.next_token, commit


def decode(models: Models, seq: Sequence, options: dict) -> Iterator[list[int]]:
    """Rank 0's loop (`timeout` took effect when the draft rank started: see `start`)."""
    target, stats, peer = models.target, seq.stats, models.remote
    gamma = options["gamma"] or peer.gamma
    sampling = not seq.params.greedy
    stats.info.update(c=peer.c, gamma=gamma)
    cache = KVCache.for_model(target, 1, len(seq.ids) + seq.limit + slack(options))
    accepted, token, generated = 0, -1, []
    peer.begin(seq, gamma, options["draft_window"], seed=int(torch.randint(2 ** 62, (), generator=seq.generator,
                                                                         device=seq.generator.device)))
    try:
        logits = prefill(target, cache, seq)                            # the draft prefills its window meanwhile
        rounds = Rounds(target_token(logits, seq))
        emitted, accepted, token = [rounds.fresh], 0, rounds.fresh
        with rank_threads(2):                                           # the draft rank has the other core
            while True:
                generated += emitted
                yield emitted
                peer.decide(accepted, token)                            # the draft goes on from here
                logits = target(torch.tensor([rounds.inputs()], device=target.device), cache)[0]
                drafts, q = peer.drafts(gamma, sampling)
                q = None if q is None else q.to(logits.device)
                tree = rounds.chain(drafts, q)
                verdict = verify(tree, logits, seq.params, seq.generator, seq.penalty)
                accepted, token, commit = rounds.settle(verdict, drafts, q)
                cache.commit(0, range(commit))
                emitted = verdict.tokens
                stats.target_forwards += 1
                stats.verifications += 1
                stats.draft_forwards += gamma
                stats.drafted_tokens += len(tree) - 1
                stats.accepted_tokens += accepted
                stats.phases += token >= 0                     # a rejection ends a drafting phase
    finally:
        stats.phases += token < 0 and accepted > 0     # the phase still running at the end
        committed = peer.end(accepted, token, gamma, sampling)
        if committed is not None and committed != generated:
            raise RanksDivergedError(f"pearl: the draft rank committed {len(committed)} tokens that differ from "
                                     f"the target rank's {len(generated)}")


SPEC = MethodSpec("pearl", "PEARL: draft and target in two processes, working at the same time (pre-verify / "
                  "post-verify); γ = round(c) measured at start-up", DEFAULTS, True,
                  build=lambda models, method, runner: Loop(models, decode, method.options, penalties=True),
                  slack=slack, start=start, max_rows=1)

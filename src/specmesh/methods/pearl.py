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
γ, unless given, is chosen before every round by `GammaPolicy`: the γ that maximises the
expected tokens per ms of a two-state model of these rounds, from the draft's measured step,
the target's forward measured by width, and the acceptance rate so far (`gamma_rule=measured`,
the default); `gamma_rule=c` keeps the paper's rule (its Table 6): γ = round(c), c = target
forward time / draft forward time, both measured at start-up with one thread each, at the
same time.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import torch

from specmesh.engine.sequence import Sequence
from specmesh.lossless.token_tree import TokenTree
from specmesh.lossless.verify import Verdict, verify
from specmesh.methods.ar import target_token
from specmesh.methods.base import MethodSpec, Models
from specmesh.methods.loop import Loop, prefill
from specmesh.model.cache import KVCache
from specmesh.options import PearlOptions
from specmesh.proposers.remote_chain import MAX_GAMMA, DraftPeer
from specmesh.timing import by_width, rank_threads

SEEDED_GAMMA = 4        # a seeded sampling request's γ without --gamma: both rules time this machine, and how far the
                        # draft runs decides which random numbers each token takes


class RanksDivergedError(RuntimeError):
    pass


def slack(options: PearlOptions) -> int:
    return (options.gamma or MAX_GAMMA) + 1          # the newest token and the undecided drafts


# ---------------------------------------------------------------------------------------------
# rank 0: γ from what is measured


def round_ms(drafting: float, alone: float, lent: float | None = None) -> float:
    """How long a round lasts: the target's forward takes `alone` ms on rank 0's own cores while the draft
    drafts for `drafting` ms. Without lending, the slower of the two. With it (`lent`: the same forward's ms with
    the draft rank's core borrowed), once the draft waits the rest of the forward runs at alone / lent times
    the speed: drafting + (alone − drafting) · lent / alone."""
    if lent is None or drafting >= alone:
        return max(drafting, alone)
    return drafting + (alone - drafting) * lent / alone


def tokens_per_ms(gamma: int, alpha: float, draft_ms: float, target_ms: Callable[[int], float],
                  lent_ms: Callable[[int], float] | None = None, overhead_ms: float = 0.0) -> float:
    """Expected tokens per ms of PEARL's rounds with draft length γ, each draft accepted with
    probability α, a draft step of `draft_ms` and a target forward of w tokens of target_ms(w)
    (lent_ms(w) with the waiting draft rank's core: see round_ms), plus `overhead_ms` a round around
    the forward (the decision's hop, waiting for the drafts, verification, bookkeeping).

    Two states: pre-verify P (target width 1; its one check accepts with α: 1 token, on to Q;
    else 1 token, stay) and post-verify Q (γ−1 undecided drafts: width γ; γ checks; all pass with
    α^γ: γ tokens, stay; a rejection at k: k + 1 tokens, back to P). A round lasts round_ms.
    Renewal-reward over the stationary chain,
    π_Q / π_P = α / (1 − α^γ):  (1 + r·E_Q) / (t_P + r·t_Q),  E_Q = (1 − α^γ) / (1 − α)."""
    t_p, t_q = (overhead_ms + round_ms(gamma * draft_ms, target_ms(w), lent_ms(w) if lent_ms else None)
                for w in (1, gamma))
    if alpha >= 1.0:
        return gamma / t_q
    e_q = (1 - alpha ** gamma) / (1 - alpha)
    r = alpha / (1 - alpha ** gamma)
    return (1 + r * e_q) / (t_p + r * t_q)


@dataclass
class GammaPolicy:
    """γ for the next round: argmax over 1..MAX_GAMMA of `tokens_per_ms`, with α the acceptance so
    far (accepted drafts / (accepted + rejections): the chain's maximum-likelihood estimate), starting
    from a prior of PRIOR_ALPHA worth PRIOR_CHECKS checks; the draft rank's drafting time per drafted token
    so far (prompt lookup's tokens cost next to nothing), starting from the start-up draft forward worth
    PRIOR_TOKENS tokens; and the mean of the rounds' time beside the target's forward so far."""
    draft_ms: float                             # the draft's forward, measured at start-up
    target_ms: dict[int, float]                 # width -> ms of the target's forward on rank 0's own cores
    lent_ms: dict[int, float] | None = None     # the same with the waiting draft rank's core borrowed, if lent
    accepted: int = 0
    rejected: int = 0
    drafted: int = 0                            # tokens the draft rank drafted, in `drafting_ms`
    drafting_ms: float = 0.0
    overhead_ms: float = 0.0                    # the mean of `rounds` rounds' time beside the target's forward
    rounds: int = 0
    PRIOR_ALPHA, PRIOR_CHECKS, PRIOR_TOKENS = 0.6, 4, 4

    @property
    def alpha(self) -> float:
        return (self.accepted + self.PRIOR_ALPHA * self.PRIOR_CHECKS) / (
            self.accepted + self.rejected + self.PRIOR_CHECKS)

    @property
    def step_ms(self) -> float:
        """The draft rank's time per drafted token."""
        return (self.draft_ms * self.PRIOR_TOKENS + self.drafting_ms) / (self.PRIOR_TOKENS + self.drafted)

    def observe(self, accepted: int, rejected: bool, overhead_ms: float | None = None, drafted: int = 0,
                drafting_ms: float = 0.0) -> None:
        self.accepted += accepted
        self.rejected += rejected
        self.drafted += drafted
        self.drafting_ms += drafting_ms
        if overhead_ms is not None:
            self.rounds += 1
            self.overhead_ms += (overhead_ms - self.overhead_ms) / self.rounds

    @cached_property
    def widths(self) -> tuple[Callable[[int], float], Callable[[int], float] | None]:
        """The target's forward ms by width 0..MAX_GAMMA, alone and lent, interpolated once: gamma() runs every
        round and reads each 2·MAX_GAMMA times (interpolating there cost ~0.1 ms a round)."""
        tables = [[by_width(ms)(w) for w in range(MAX_GAMMA + 1)] if ms else None
                  for ms in (self.target_ms, self.lent_ms)]
        return tuple(None if t is None else t.__getitem__ for t in tables)

    def gamma(self) -> int:
        alpha, step, (ms, lent) = self.alpha, self.step_ms, self.widths
        return max(range(1, MAX_GAMMA + 1), key=lambda g: tokens_per_ms(g, alpha, step, ms, lent, self.overhead_ms))


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


def decode(models: Models, seq: Sequence, options: PearlOptions) -> Iterator[list[int]]:
    """Rank 0's loop (`timeout` took effect when the draft rank started: see `start`)."""
    target, stats, peer = models.target, seq.stats, models.remote
    policy = GammaPolicy(peer.draft_ms, peer.target_ms_by_width, peer.lent_ms_by_width)
    sampling = not seq.params.greedy
    seeded = sampling and seq.params.seed is not None         # its samples must not hang on timings: γ fixed
    fixed = options.gamma or (SEEDED_GAMMA if seeded else peer.gamma if options.gamma_rule == "c" else None)
    gamma = fixed or policy.gamma()
    rule = "given" if options.gamma else "seeded" if seeded else options.gamma_rule
    stats.info.update(c=peer.c, gamma_rule=rule)
    gammas = []
    cache = KVCache.for_model(target, 1, len(seq.ids) + seq.limit + slack(options))
    accepted, token, generated = 0, -1, []
    seed = int(torch.randint(2 ** 62, (), generator=seq.generator, device=seq.generator.device))
    peer.begin(seq, options.draft_window, options.lookup, seed)
    try:
        logits = prefill(target, cache, seq)                            # the draft prefills its window meanwhile
        rounds = Rounds(target_token(logits, seq))
        emitted, accepted, token = [rounds.fresh], 0, rounds.fresh
        with rank_threads(2), peer.link.lending():      # the draft rank has the other core and lends it as it waits
            while True:
                generated += emitted
                yield emitted
                began = time.perf_counter()
                peer.decide(accepted, token, gamma)                     # the draft goes on from here
                forward = time.perf_counter()
                logits = target(torch.tensor([rounds.inputs()], device=target.device), cache)[0]
                forward = time.perf_counter() - forward
                drafts, q = peer.drafts(sampling)
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
                policy.observe(accepted, token >= 0, 1000 * (time.perf_counter() - began - forward), gamma,
                               peer.drafting_ms)
                gammas.append(gamma)
                gamma = fixed or policy.gamma()
    finally:
        stats.info["gamma"] = round(sum(gammas) / len(gammas), 2) if gammas else gamma   # the mean over rounds
        stats.phases += token < 0 and accepted > 0     # the phase still running at the end
        committed = peer.end(accepted, token, sampling)
        if committed is not None and committed != generated:
            raise RanksDivergedError(f"pearl: the draft rank committed {len(committed)} tokens that differ from "
                                     f"the target rank's {len(generated)}")


def start(models: Models, draft: Path, dtype: torch.dtype, options: PearlOptions) -> None:
    """Method hook (LLM): the draft lives in its own process."""
    models.remote = DraftPeer.start(models.target, draft, dtype, options.timeout, models.target_path)


SPEC = MethodSpec.of("pearl", build=lambda models, method, runner: Loop(models, decode, method.config),
                     slack=slack, start=start, logprobs=False)

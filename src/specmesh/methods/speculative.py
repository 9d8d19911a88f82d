"""The speculative step shared by `sd`, `tree`, `selfdraft`, `easyspec`, `cosine` and `suffix`:

  propose (a tree per running sequence) -> one target forward over all trees (padded to one size)
  -> `verify` each with its own parameters and generator -> commit the accepted paths -> the
  proposer learns the verdicts.

The methods differ only in their proposer (proposers/) and in how deep they draft. `DraftDepth` is
the one speculation policy: a fixed depth (a `gamma` the user gave), or (`sd`, `tree`, `easyspec`, `selfdraft`) a
depth by the number of running sequences, since a wider batch already keeps the weights busy and every rejected
draft token costs a full row of target compute (docs/serving.md).
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from specmesh.engine.runner import Runner
from specmesh.engine.sequence import Sequence
from specmesh.lossless.verify import verify
from specmesh.methods.ar import AR
from specmesh.methods.base import Configured, MethodSpec
from specmesh.methods.cosine_schedule import Scheduled
from specmesh.options import EasySpecOptions
from specmesh.proposers import Proposer
from specmesh.proposers.context_drafter import ContextDrafter
from specmesh.proposers.draft_model import DraftModel
from specmesh.proposers.fused_drafters import PROMPT_POSITIONS, Drafter, FusedDrafters
from specmesh.proposers.fuzzy_draft import FuzzyDraft, layer_groups
from specmesh.proposers.lookup import LookupFirst
from specmesh.proposers.multibranch import MultiBranch, corpus_cache
from specmesh.proposers.remote_drafter import DrafterPool
from specmesh.proposers.suffix_tree import SuffixProposer
from specmesh.timing import WidthCost, forward_ms

SETTLE_STEPS = 8    # after a batch too wide to speculate, it must stay narrow this long before speculation resumes


def depth_by_width(width: int, depth: int = 4) -> int:
    """How deep `sd`, `tree`, `easyspec` and `selfdraft` draft for a batch of this many sequences, `depth` the single
    sequence's; 0: decode plainly (the widths where drafting stopped paying: docs/serving.md)."""
    return depth if width <= 2 else min(depth, 3) if width == 3 else min(depth, 2) if width == 4 else 0


@dataclass
class DraftDepth:
    fixed: int | None = None
    by_width: Callable[[int], int] = depth_by_width
    narrow_steps: int = SETTLE_STEPS        # steps in a row whose batch was narrow enough to speculate
    sampled: bool = False                   # the proposer draws a sampling row's tokens from the draft (sd's chain)

    def depth(self, width: int) -> int:
        """How deep to draft this step (called once per step). After a wide batch, speculation resumes
        only once the batch has stayed narrow for SETTLE_STEPS steps: a brief dip (clients of finished
        requests sending their next ones) would make the draft read every sequence's skipped tokens."""
        if self.fixed is not None:
            return self.fixed
        depth = self.by_width(width)
        self.narrow_steps = self.narrow_steps + 1 if depth else 0
        return depth if self.narrow_steps > SETTLE_STEPS else 0

    def idle(self) -> None:
        """A sequence arrived at an idle engine: it speculates from its first step (so a seeded request
        sent alone samples the same tokens whatever ran before it)."""
        self.narrow_steps = SETTLE_STEPS

    def budgets(self, seqs: list[Sequence], width: int | None = None) -> list[int]:
        """Each sequence's draft depth this step (called once per step), in a batch of `width` sequences (default:
        these). Where the proposer samples its tokens
        (`sampled`), a seeded sampling row drafts as deep as it would alone, whatever the batch: how many tokens
        it drafts decides which random numbers each of its tokens takes, and its samples must not depend on the
        requests beside it (greedy rows, and rows of deterministic proposals, whose verification draws one
        number a token however deep the tree, give the same tokens at any depth)."""
        depth = self.depth(len(seqs) if width is None else width)
        alone = self.fixed if self.fixed is not None else self.by_width(1)
        return [max(0, min(alone if self.sampled and seeded(s) else depth, s.remaining - 1)) for s in seqs]

    def observe(self, draft_s: float, verify_s: float, trees: list[tuple[int, int, int]]) -> None:
        """What a step cost and gave: its drafting, its verification, and each row's (depth drafted, tree tokens,
        draft tokens accepted) (cosine_schedule.Scheduled plans on these)."""


@dataclass
class Priced(DraftDepth):
    """`suffix`'s policy: its whole depth while `depth_by_width` drafts at all, none from the widths where drafting
    stopped paying (a user's `gamma`: at every width), the proposer choosing how many nodes are worth their rows
    from `cost`, which this fits to every step's forward time and width, and from the batch's `width`."""
    cost: WidthCost = field(default_factory=WidthCost)
    width: int = 1                          # sequences in this step's batch, of every method (mixed.Dispatch)

    def budgets(self, seqs: list[Sequence], width: int | None = None) -> list[int]:
        self.width = len(seqs) if width is None else width
        return super().budgets(seqs, width)

    def observe(self, draft_s: float, verify_s: float, trees: list[tuple[int, int, int]]) -> None:
        self.cost.observe(sum(tokens for _, tokens, _ in trees), verify_s)


class Speculative(AR):
    def __init__(self, runner: Runner, proposer: Proposer, depth: DraftDepth):
        super().__init__(runner)
        self.proposer, self.policy = proposer, depth
        # if a list: per step (rows, tokens verified, draft forwards one after another)
        self.trace: list[tuple[int, int, int]] | None = None

    def admit(self, seq: Sequence, row: int) -> list[int]:
        logits = self.runner.prefill(seq, row)          # [n, V]: after the prompt's last n tokens
        tokens = self.first_token(seq, logits[-1:])
        if self.runner.prompt_tail > 1:                  # cosine's router compares its drafters with the target there
            self.proposer.admit(row, seq, prompt_logits=logits)
        else:
            self.proposer.admit(row, seq)
        if row == 0:
            self.policy.idle()
        return tokens

    def step(self, seqs: list[Sequence]) -> list[list[int]]:
        start = time.perf_counter()
        budgets = self.policy.budgets(seqs)
        trees = self.proposer.propose(seqs, budgets)
        drafted = time.perf_counter()
        logits = self.runner.forward_trees(trees)                                  # [B, N, V]
        verified = time.perf_counter()
        if self.trace is not None:
            self.trace.append((len(seqs), sum(len(t) for t in trees), self.proposer.levels))
        verdicts = []
        for b, (seq, tree) in enumerate(zip(seqs, trees)):
            seq.stats.draft_s += drafted - start
            seq.stats.verify_s += verified - drafted
            verdict = verify(tree, logits[b, :len(tree)], seq.params, seq.generator, seq.penalty)
            self.runner.cache.commit(b, verdict.path)
            seq.score(logits[b], verdict.path[:len(verdict.tokens)])    # row path[k] predicted token k
            s = seq.stats
            s.target_forwards += 1
            s.verifications += 1
            s.drafted_tokens += len(tree) - 1
            s.accepted_tokens += verdict.accepted
            verdicts.append(verdict)
        self.policy.observe(drafted - start, verified - drafted,
                            [(d, len(t), v.accepted) for d, t, v in zip(budgets, trees, verdicts)])
        self.proposer.accept(seqs, trees, verdicts, logits)
        return [v.tokens for v in verdicts]

    def move_row(self, src: int, dst: int) -> None:
        super().move_row(src, dst)
        self.proposer.move_row(src, dst)


def seeded(seq: Sequence) -> bool:
    return seq.params.seed is not None and not seq.params.greedy


def narrowing(depth: int, fixed: bool, sampled: bool = False) -> DraftDepth:
    """A method's depth: `depth` while the batch is narrow, less (then none) as it widens, or always `depth` where
    the user fixed it."""
    return DraftDepth(depth if fixed else None, lambda width: depth_by_width(width, depth), sampled=sampled)


def build_sd(models, method: Configured, runner: Runner) -> Speculative:
    o = method.config
    draft = DraftModel(models.draft, runner.rows, runner.max_len, o.draft_window, stop_below=o.stop_below)
    if o.lookup:
        draft = LookupFirst(draft, runner.rows, o.lookup, o.lookup_reach, o.lookup_shared)
    return Speculative(runner, draft, narrowing(o.gamma, "gamma" in method.given, sampled=True))


def build_tree(models, method: Configured, runner: Runner) -> Speculative:
    o = method.config
    draft = DraftModel(models.draft, runner.rows, runner.max_len, o.draft_window, o.tree_width,
                       o.max_children, min_prob=o.min_prob)
    if o.lookup:
        draft = LookupFirst(draft, runner.rows, o.lookup, o.lookup_reach, o.lookup_shared)
    return Speculative(runner, draft, narrowing(o.gamma, "gamma" in method.given))


def build_easyspec(models, method: Configured, runner: Runner) -> Speculative:
    o = method.config
    groups = layer_groups(o.layer_groups, models.draft.config.num_layers)
    draft = FuzzyDraft(models.draft, runner.rows, runner.max_len, o.draft_window, groups, o.calibration,
                       o.gamma, o.tree_width, o.max_children)
    return Speculative(runner, draft, narrowing(o.gamma, "gamma" in method.given))


def check_easyspec(models, options: EasySpecOptions) -> None:
    layer_groups(options.layer_groups, models.draft.config.num_layers)


def build_cosine(models, method: Configured, runner: Runner) -> Speculative:
    o = method.config
    if isinstance(models.remote, DrafterPool):                  # --drafter-processes
        drafters = models.remote.drafters(runner.rows, runner.max_len)
    else:
        drafters = [Drafter(DraftModel(m, runner.rows, runner.max_len, o.draft_window, width=2, max_children=2))
                    for m in models.drafters]
    if models.context_drafter:
        drafters.append(ContextDrafter(runner.rows))
    proposer = FusedDrafters(drafters, models.target.embed, runner.rows, o.routed,
                             o.explore_below, o.tree_budget, o.solo_budget, o.guess_budget,
                             routing=not o.no_routing, fusion=not o.no_fusion,
                             token_budget=None if o.no_adaptive else o.token_budget,
                             names=models.drafter_names)
    if proposer.compares_prompt:
        # the router compares its model drafters with the target over the prompt's last positions
        runner.prompt_tail = min(o.draft_window, PROMPT_POSITIONS)
    policy = DraftDepth(o.gamma) if o.no_scheduler else \
        Scheduled(o.gamma, o.tree_budget, o.lam, o.token_budget, o.max_step_ms or float("inf"),
                  choose_depth="gamma" not in method.given, target_ms=target_by_width(models, runner.rows))
    return Speculative(runner, proposer, policy)


def target_by_width(models, rows: int) -> dict[int, float]:
    """The target's forward time by width (measured once a model, up to the widest a batch of `rows` trees of 16
    verifies): what decoding plainly costs beside drafting, for the scheduler."""
    for width in (1, 2, 4, 8, 16, 32, 64, 128):
        if width not in models.target_ms and width <= max(16, 16 * rows):
            models.target_ms[width] = forward_ms(models.target, width, reps=5)
    return models.target_ms


def build_selfdraft(models, method: Configured, runner: Runner) -> Speculative:
    o = method.config
    corpus = corpus_cache(models.target_path, o.ngram_cache, models.tokenizer)
    proposer = MultiBranch(runner.rows, o.branches, o.branch_len, o.gram, o.max_candidates, corpus)
    return Speculative(runner, proposer, narrowing(o.gram - 1, False))


def build_suffix(models, method: Configured, runner: Runner) -> Speculative:
    o = method.config
    policy = Priced(o.gamma if "gamma" in method.given else None, lambda width: o.gamma if depth_by_width(width) else 0,
                    cost=WidthCost(o.row_cost))
    proposer = SuffixProposer(runner.rows, o.depth, o.cache_tokens, o.tree_tokens, o.min_prob, policy, o.private)
    return Speculative(runner, proposer, policy)


SD = MethodSpec.of("sd", build_sd, slack=lambda o: max(o.gamma, o.lookup_reach if o.lookup else 0) + 1)
TREE = MethodSpec.of("tree", build_tree,
                     slack=lambda o: max(o.gamma * o.tree_width, o.lookup_reach if o.lookup else 0) + 1)
EASYSPEC = MethodSpec.of("easyspec", build_easyspec, slack=lambda o: o.gamma * o.tree_width + 1, spread_draft=True,
                         check=check_easyspec)
COSINE = MethodSpec.of("cosine", build_cosine, slack=lambda o: max(o.tree_budget, o.solo_budget) + 1,
                       needs_drafters=True)
SELFDRAFT = MethodSpec.of("selfdraft", build_selfdraft,
                          slack=lambda o: 1 + o.max_candidates * (o.gram - 1) + o.branches * o.branch_len)
SUFFIX = MethodSpec.of("suffix", build_suffix, slack=lambda o: o.tree_tokens + 1)

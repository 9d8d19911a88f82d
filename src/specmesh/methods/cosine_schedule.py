"""CoSine's request scheduler and adaptive speculation (Yang et al. 2025, §4.3, Eq. 8 and Algorithm 2).

Each step the scheduler picks the requests B of the pool that speculate, minimising

    T_ttl(B) / b + λ Γ(B)      subject to  Γ(B) <= Γ_max,  T_ttl(B) <= T_max,  memory(B) <= M_max

with b = |B| >= 1, Γ(B) = Σ_B tokens_i the tokens sent to verification, and T_ttl(B) = max_B draft_ms_i +
verify_base_ms + verify_ms_per_token Γ(B), drafting (in parallel, the longest dominates) plus a verification
fitted as linear in its tokens. The max and the division make it no linear program: for each b, it is one
after a reformulation (a continuous t >= draft_ms_i x_i stands for the max; b is fixed, so the objective is
linear), solved exactly by SciPy's MILP (HiGHS), and the best b wins; pools of up to EXACT_POOL requests are
searched exhaustively instead (the same optimum, and what the tests compare against). In the engine, a
request left out decodes plainly this step (one token, no draft).

Adaptive speculation: where no batch fits Γ_max, one token is taken from the longest draft until the
budget holds (proposers/fused_drafters.py's `trim`). How deep to draft is chosen before the batch, on the same measured costs (`Scheduled`):
an extension, the paper fixes the draft length.
"""
from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass

import numpy as np

from specmesh.timing import by_width

EXACT_POOL = 12                 # pools up to this size: exhaustive search


@dataclass(frozen=True)
class Candidate:
    tokens: int                 # tokens it would send to verification (its tree, root included)
    draft_ms: float             # its drafting time this step
    memory: float = 0.0         # what it holds (the KV cache's MB)


@dataclass(frozen=True)
class Bounds:
    verify_base_ms: float       # a verification forward's fixed cost
    verify_ms_per_token: float  # and its cost per token
    lam: float = 0.0            # λ: the weight of verification tokens
    max_tokens: int = 10 ** 9   # Γ_max
    max_ms: float = float("inf")    # T_max
    max_memory: float = float("inf")


def total_ms(batch: list[Candidate], bounds: Bounds) -> float:
    """T_ttl: the longest draft, then one verification of every token."""
    tokens = sum(c.tokens for c in batch)
    return max(c.draft_ms for c in batch) + bounds.verify_base_ms + bounds.verify_ms_per_token * tokens


def objective(batch: list[Candidate], bounds: Bounds) -> float:
    return total_ms(batch, bounds) / len(batch) + bounds.lam * sum(c.tokens for c in batch)


def feasible(batch: list[Candidate], bounds: Bounds) -> bool:
    return (len(batch) > 0 and sum(c.tokens for c in batch) <= bounds.max_tokens
            and total_ms(batch, bounds) <= bounds.max_ms and sum(c.memory for c in batch) <= bounds.max_memory)


def plan(pool: list[Candidate], bounds: Bounds) -> list[int]:
    """The indices of the batch that minimises the objective under the bounds ([] where none fits)."""
    if len(pool) <= EXACT_POOL:
        return exhaustive(pool, bounds)
    best: tuple[float, list[int]] | None = None
    for b in range(1, len(pool) + 1):
        chosen = solve_for_size(pool, bounds, b)
        if chosen is not None:
            value = objective([pool[i] for i in chosen], bounds)
            if best is None or value < best[0] - 1e-12:
                best = (value, chosen)
    return [] if best is None else best[1]


def exhaustive(pool: list[Candidate], bounds: Bounds) -> list[int]:
    best: tuple[float, list[int]] | None = None
    for b in range(1, len(pool) + 1):
        for chosen in itertools.combinations(range(len(pool)), b):
            batch = [pool[i] for i in chosen]
            if feasible(batch, bounds):
                value = objective(batch, bounds)
                if best is None or value < best[0] - 1e-12:
                    best = (value, list(chosen))
    return [] if best is None else best[1]


def solve_for_size(pool: list[Candidate], bounds: Bounds, b: int) -> list[int] | None:
    """The best batch of exactly b requests, by MILP: variables x_1..x_n (binary) and t (the longest draft);
    minimise t / b + Σ (verify_ms_per_token / b + λ) tokens_i x_i (+ the constant verify_base_ms / b)."""
    try:
        from scipy.optimize import Bounds as VarBounds, LinearConstraint, milp
    except ImportError:
        raise RuntimeError(f"cosine's scheduler needs SciPy for a pool of more than {EXACT_POOL} requests: "
                           "pip install scipy (or the serve extra)") from None
    n = len(pool)
    tokens = np.array([c.tokens for c in pool], dtype=float)
    draft = np.array([c.draft_ms for c in pool], dtype=float)
    memory = np.array([c.memory for c in pool], dtype=float)
    cost = np.append(tokens * (bounds.verify_ms_per_token / b + bounds.lam), 1.0 / b)
    rows, low, high = [], [], []
    rows.append(np.append(np.ones(n), 0.0)), low.append(b), high.append(b)                  # b requests
    for i in range(n):                                                                      # t >= draft_i x_i
        row = np.zeros(n + 1)
        row[i], row[n] = draft[i], -1.0
        rows.append(row), low.append(-np.inf), high.append(0.0)
    rows.append(np.append(tokens, 0.0)), low.append(-np.inf), high.append(bounds.max_tokens)    # Γ
    if np.isfinite(bounds.max_ms):                                                          # T_ttl
        rows.append(np.append(tokens * bounds.verify_ms_per_token, 1.0))
        low.append(-np.inf), high.append(bounds.max_ms - bounds.verify_base_ms)
    if np.isfinite(bounds.max_memory):
        rows.append(np.append(memory, 0.0)), low.append(-np.inf), high.append(bounds.max_memory)
    result = milp(cost, constraints=LinearConstraint(np.array(rows), low, high),
                  integrality=np.append(np.ones(n), 0.0),
                  bounds=VarBounds(np.zeros(n + 1), np.append(np.ones(n), np.inf)))
    if not result.success:
        return None
    return [i for i in range(n) if result.x[i] > 0.5]


@dataclass
class DepthRecord:
    """What the steps that drafted to one depth measured, as running means (the newest step weighs ETA)."""
    accepted: float             # draft tokens a speculating row accepted
    tokens: float               # tokens a speculating row sent to verification (its tree, root included)
    draft_ms: float             # the step's drafting

    def blend(self, step: "DepthRecord", eta: float) -> "DepthRecord":
        mix = lambda old, new: (1 - eta) * old + eta * new
        return DepthRecord(mix(self.accepted, step.accepted), mix(self.tokens, step.tokens),
                           mix(self.draft_ms, step.draft_ms))


class WindowFit:
    """Least squares y = slope x + intercept over the last `size` points (x integers), from running sums: a fit of
    64 points in Python cost ~30 µs a step."""

    def __init__(self, size: int):
        self.points: deque[tuple[int, float]] = deque(maxlen=size)
        self.sx = self.sy = self.sxx = self.sxy = 0.0

    def __len__(self) -> int:
        return len(self.points)

    def add(self, x: int, y: float) -> None:
        if len(self.points) == self.points.maxlen:
            self._sum(*self.points[0], -1)
        self.points.append((x, y))
        self._sum(x, y, 1)

    def _sum(self, x: int, y: float, sign: int) -> None:
        self.sx += sign * x
        self.sy += sign * y
        self.sxx += sign * x * x
        self.sxy += sign * x * y

    def line(self, min_slope: float = -float("inf")) -> tuple[float, float]:
        """(slope, intercept); slope 0 where x does not vary (n·Σx² − (Σx)² is exact for integer x), and at least
        `min_slope` (the line then still through the means)."""
        n = len(self.points)
        spread = n * self.sxx - self.sx * self.sx
        slope = max((n * self.sxy - self.sx * self.sy) / spread if spread > 0 else 0.0, min_slope)
        return slope, (self.sy - slope * self.sx) / n


class Scheduled:
    """cosine's speculation policy (the engine's DraftDepth interface). Each step it picks the draft depth d that
    maximises the expected committed tokens per ms of the running rows,

        rows (1 + accepted(d)) / (draft_ms(d) + base + per_token rows tokens(d)),

    then `plan` picks the requests that speculate to d (the others decode plainly this step). Given the target's
    forward time by width (`target_ms`, measured), d = 0, plain decoding, wherever rows / target_ms(rows) beats
    the best d priced the same way, rows (1 + accepted(d)) / (draft_ms(d) + target_ms(rows tokens(d))): a batch's
    trees verify many tokens, and past the widths a CPU computes in one pass over the weights, drafts the target
    rejects cost more than they bring. After PLAIN_RUN plain steps one step drafts again, to measure what drafting
    gives now. Costs are measured: verification fitted as base + per token over the last WINDOW steps;
    accepted, tokens and draft_ms as running means per depth drafted (`DepthRecord`). A depth not drafted yet is predicted from the
    measured one nearest to it: acceptance shifted by the geometric model (a level accepted with probability
    α given the one before, α measured over every verdict), so accepted(d) = accepted(D) + α^(D+1) + ... (or
    minus α^(d+1) + ... + α^D below D); the tree's tokens taken as D's (a conservative guess: a shallower tree
    would cost less); drafting by a line through the depths measured (proportional to d while one is). So a
    depth is only tried where the model says it pays, and judged by what it then measures; a record not
    renewed for WINDOW steps is dropped (acceptance drifts as requests come and go). With `choose_depth` off (a
    depth the user gave), and while one request runs, every step drafts `depth`: alone, a request's steps ran
    as fast at the full depth as at the chosen ones, with more tokens a verification (docs/cosine.md)."""
    WINDOW = 64
    ETA = 0.1
    PLAIN_RUN, EVIDENCE, MARGIN = 16, 16, 1.1

    def __init__(self, depth: int, tree_tokens: int, lam: float, max_tokens: int, max_ms: float,
                 choose_depth: bool = True, target_ms: dict[int, float] | None = None):
        self.depth, self.tree_tokens, self.choose_depth = depth, tree_tokens, choose_depth     # False: always `depth`
        self.lam, self.max_tokens, self.max_ms = lam, max_tokens, max_ms
        self.verified = WindowFit(self.WINDOW)            # ms by tokens of recent verifications
        self.record: dict[int, DepthRecord] = {}           # depth drafted -> what its steps measured
        self.renewed: dict[int, int] = {}                  # depth -> the step its record was last renewed
        self.steps = 0
        self.levels = [0.0, 0.0]                           # levels accepted, levels rejected (running sums)
        self.current = depth                               # the depth of the last plan
        self.chosen: list[int] = []                        # the last plan (for stats and tests)
        self.costs: tuple[float, float, float] | None = None   # given (base, per token, a level's ms): not measured
        self.target_ms = by_width(target_ms) if target_ms else None    # width -> ms: prices plain decoding
        self.plain = 0                                     # plain steps in a row
        self.verdicts = 0                                  # drafted rows verified so far

    def idle(self) -> None:
        pass

    def budgets(self, seqs) -> list[int]:
        self.current = self.depth
        if len(seqs) == 1 or self.costs is None and (len(self.verified) < 2 or not self.record):
            return [max(0, min(self.depth, s.remaining - 1)) for s in seqs]
        base, per_token = self.verify_fit() if self.costs is None else self.costs[:2]
        self.current = depth = self.best_depth(len(seqs), base, per_token) if self.choose_depth else self.depth
        if self.choose_depth and self.costs is None and self.target_ms and self.plain_pays(len(seqs), depth):
            self.current = 0
            return [0] * len(seqs)
        depths = [max(0, min(depth, s.remaining - 1)) for s in seqs]
        pool = [Candidate(round(self.tokens(d)) if d else 1, self.draft_ms(d) if d else 0.0) for d in depths]
        self.chosen = plan(pool, Bounds(base, per_token, self.lam, self.max_tokens, self.max_ms))
        chosen = set(self.chosen)
        return [d if i in chosen else 0 for i, d in enumerate(depths)]

    def best_depth(self, rows: int, base: float, per_token: float) -> int:
        rate = lambda d: rows * (1 + self.accepted(d)) / (self.draft_ms(d) + base + per_token * rows * self.tokens(d))
        return max(range(1, self.depth + 1), key=lambda d: (rate(d), d))      # ties: the deeper

    def plain_pays(self, rows: int, depth: int) -> bool:
        """Whether decoding plainly this step beats drafting to `depth` by MARGIN, both priced by the target's
        measured forward by width, once EVIDENCE drafted rows were verified (one request's first steps say little);
        a PLAIN_RUN of plain steps, then drafting is tried again."""
        ms = self.target_ms
        drafted = rows * (1 + self.accepted(depth)) / (self.draft_ms(depth) + ms(rows * self.tokens(depth)))
        if self.verdicts >= self.EVIDENCE and rows / ms(rows) > self.MARGIN * drafted and self.plain < self.PLAIN_RUN:
            self.plain += 1
            return True
        self.plain = 0
        return False

    def nearest(self, depth: int) -> int:
        return min(self.record, key=lambda d: (abs(d - depth), -d))

    def alpha(self) -> float:
        accepted, rejected = self.levels
        return accepted / (accepted + rejected) if accepted + rejected else 0.0

    def accepted(self, depth: int) -> float:
        if not self.record:
            return float(depth)
        known, alpha = self.nearest(depth), self.alpha()
        lo, hi, sign = (known, depth, 1) if depth > known else (depth, known, -1)
        return max(0.0, self.record[known].accepted + sign * sum(alpha ** k for k in range(lo + 1, hi + 1)))

    def tokens(self, depth: int) -> float:
        return self.record[self.nearest(depth)].tokens if self.record else float(self.tree_tokens)

    def draft_ms(self, depth: int) -> float:
        if self.costs is not None:
            return depth * self.costs[2]
        if depth in self.record:
            return self.record[depth].draft_ms
        if len(self.record) == 1:
            (known, record), = self.record.items()
            return record.draft_ms * depth / known
        level, fixed = fit_line(list(self.record), [r.draft_ms for r in self.record.values()])
        return max(0.0, fixed + level * depth)

    def observe(self, draft_s: float, verify_s: float, trees: list[tuple[int, int, int]]) -> None:
        """A step: its drafting, its verification, and each row's (depth drafted, tree tokens, draft tokens
        accepted)."""
        self.verified.add(sum(t for _, t, _ in trees), verify_s * 1e3)
        drafted = [(d, t, a) for d, t, a in trees if d]
        if not drafted:
            return
        # a row's chain of levels: min(a, d) accepted, then one rejected where a < d
        self.levels = [(1 - self.ETA) * self.levels[0] + sum(min(a, d) for d, _, a in drafted),
                       (1 - self.ETA) * self.levels[1] + sum(a < d for d, _, a in drafted)]
        n = len(drafted)
        self.verdicts += n
        step = DepthRecord(sum(a for *_, a in drafted) / n, sum(t for _, t, _ in drafted) / n, draft_s * 1e3)
        old = self.record.get(self.current)
        self.record[self.current] = step if old is None else old.blend(step, self.ETA)
        self.steps += 1
        self.renewed[self.current] = self.steps
        for depth in [d for d, renewed in self.renewed.items() if renewed <= self.steps - self.WINDOW]:
            del self.record[depth], self.renewed[depth]

    def verify_fit(self) -> tuple[float, float]:
        """Least squares ms = base + per_token * tokens over the recent verifications (per_token >= 0)."""
        per_token, base = self.verified.line(min_slope=0.0)
        return max(base, 0.0), per_token


def fit_line(xs, ys) -> tuple[float, float]:
    """Least squares y = slope x + intercept over a few points (slope 0 where x does not vary); np.polyfit costs
    about 0.2 ms a call, and the scheduler fits several lines a step."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return slope, my - slope * mx

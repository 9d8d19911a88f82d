"""cosine's scheduler (methods/cosine_schedule.py): every bound holds, and the MILP finds brute force's optimum."""
import random

import pytest

from specmesh.methods.cosine_schedule import (EXACT_POOL, Bounds, Candidate, exhaustive, feasible, objective, plan,
                                              solve_for_size, total_ms)
from specmesh.proposers.fused_drafters import trim


def random_pool(rng: random.Random, n: int) -> list[Candidate]:
    return [Candidate(rng.randint(1, 17), rng.uniform(1, 12), rng.uniform(10, 200)) for _ in range(n)]


def random_bounds(rng: random.Random) -> Bounds:
    return Bounds(verify_base_ms=rng.uniform(5, 30), verify_ms_per_token=rng.uniform(0.05, 1.0),
                  lam=rng.uniform(0, 0.5), max_tokens=rng.randint(10, 80), max_ms=rng.uniform(20, 90),
                  max_memory=rng.uniform(100, 900))


def test_the_objective_by_hand():
    batch = [Candidate(5, 3.0), Candidate(2, 7.0)]
    b = Bounds(verify_base_ms=10, verify_ms_per_token=0.5, lam=0.1)
    assert total_ms(batch, b) == pytest.approx(7.0 + 10 + 0.5 * 7)
    assert objective(batch, b) == pytest.approx((7.0 + 10 + 3.5) / 2 + 0.1 * 7)


def test_every_bound_holds_on_random_pools():
    rng = random.Random(0)
    for _ in range(60):
        pool, bounds = random_pool(rng, rng.randint(1, 20)), random_bounds(rng)
        chosen = plan(pool, bounds)
        if chosen:
            assert feasible([pool[i] for i in chosen], bounds)
        else:
            assert not any(feasible([c], bounds) for c in pool)     # not even one request fits


def test_the_milp_matches_brute_force_on_small_pools():
    rng = random.Random(1)
    for _ in range(40):
        pool, bounds = random_pool(rng, rng.randint(2, 9)), random_bounds(rng)
        brute = exhaustive(pool, bounds)
        sizes = [solve_for_size(pool, bounds, b) for b in range(1, len(pool) + 1)]
        found = [s for s in sizes if s is not None]
        if not brute:
            assert not found
            continue
        best = min(objective([pool[i] for i in s], bounds) for s in found)
        assert best == pytest.approx(objective([pool[i] for i in brute], bounds), rel=1e-6)


def test_large_pools_go_to_the_solver():
    rng = random.Random(2)
    pool, bounds = random_pool(rng, EXACT_POOL + 8), Bounds(10, 0.2, lam=0.05, max_tokens=60)
    chosen = plan(pool, bounds)
    assert chosen and feasible([pool[i] for i in chosen], bounds)


def test_adaptive_speculation_takes_from_the_longest_draft():
    assert trim([5, 9, 3], budget=14) == [5, 6, 3]
    assert trim([6, 6], budget=10) == [5, 5]
    assert trim([4, 2], budget=1) == [1, 1]          # never below the root
    assert trim([3, 3], budget=10) == [3, 3]


def test_the_scheduled_policy_plans_on_measured_costs():
    """Verification measured at 10 ms + 1 ms a token and drafting at 4 ms: with room for 20 tokens, trees of 8
    go to two of four requests (the others decode plainly, a token each); one request alone always drafts."""
    from types import SimpleNamespace
    from specmesh.methods.cosine_schedule import Scheduled
    policy = Scheduled(depth=5, tree_tokens=8, lam=0.0, max_tokens=20, max_ms=float("inf"))
    seq = SimpleNamespace(remaining=100)
    assert policy.budgets([seq] * 4) == [5] * 4            # nothing measured yet
    for rows in (1, 2, 3, 4):                               # every drafted token accepted: the full depth pays
        policy.observe(0.004, (10 + 8 * rows) / 1000, [(5, 8, 5)] * rows)
    assert policy.verify_fit() == pytest.approx((10.0, 1.0))
    budgets = policy.budgets([seq] * 4)
    assert sorted(budgets) == [0, 0, 5, 5] and sum(8 if b else 1 for b in budgets) <= 20
    assert policy.budgets([seq]) == [5]
    assert policy.budgets([SimpleNamespace(remaining=3)]) == [2]


def test_the_scheduled_policy_drafts_as_deep_as_the_costs_pay():
    """Depth 5 measured: rows accept 1 draft token on average, with α = 1/2 (2 levels accepted, 2 rejections).
    The geometric model shifts that to other depths: accepted(1) = 1 - (1/4 + 1/8 + 1/16 + 1/32) = 0.53125.
    On a cluster's costs (verification flat at 30 ms, a level 7 ms on the drafter nodes) two rows make
    2 (1 + accepted(d)) / (7 d + 30) tokens a ms: d = 1 (3.0625 / 37) beats d = 2 (3.5625 / 44) and d = 5 (4 / 65).
    Once depth 5's record is old and every level is accepted, with a level of 1 ms, all five."""
    from types import SimpleNamespace
    from specmesh.methods.cosine_schedule import Scheduled
    policy = Scheduled(depth=5, tree_tokens=16, lam=0.0, max_tokens=128, max_ms=float("inf"))
    policy.costs = (30.0, 0.0, 7.0)
    rows = [SimpleNamespace(remaining=100)] * 2
    assert policy.budgets(rows) == [5, 5]                   # nothing measured: the full depth
    policy.observe(0.035, 0.030, [(5, 16, 0), (5, 16, 2)])
    assert policy.alpha() == pytest.approx(0.5) and policy.accepted(1) == pytest.approx(0.53125)
    assert policy.accepted(5) == pytest.approx(1.0) and policy.tokens(1) == 16
    assert policy.budgets(rows) == [1, 1] and policy.current == 1
    policy.observe(0.007, 0.030, [(1, 3, 1), (1, 3, 1)])   # depth 1 measured: its own record, α higher
    assert policy.record[1].accepted == 1.0 and policy.record[5].accepted == 1.0
    assert policy.accepted(2) == pytest.approx(1.0 + policy.alpha() ** 2)      # shifted from depth 1, the nearest
    for _ in range(Scheduled.WINDOW - 1):                  # depth 5's record, not renewed, is dropped
        policy.observe(0.007, 0.030, [(1, 3, 1), (1, 3, 1)])
    assert list(policy.record) == [1] and policy.alpha() > 0.99
    policy.costs = (30.0, 0.0, 1.0)
    assert policy.best_depth(2, 30.0, 0.0) == 5
    policy.costs = (30.0, 0.0, 1000.0)                      # a level far dearer than its token
    assert policy.budgets(rows) == [1, 1]
    policy.choose_depth = False                             # a depth the user gave (--gamma)
    assert policy.budgets(rows) == [5, 5]


def test_the_scheduled_policy_judges_a_depth_by_what_it_measured():
    """Measured costs, as on a CPU where verification costs 1 ms a token (10 ms + 1 ms a token, fitted). Depth 5
    drafted in 10 ms, a row accepting 1 token (α = 1/2) of a 16-token tree. A shallower tree is assumed as large,
    so only drafting (proportional to depth while one is measured) is saved: for two rows 2 (1 + accepted(d)) /
    (2 d + 42) is highest at d = 3 (2 x 1.906 / 48), which is tried. Measured there, its record decides: no token
    accepted, so 2 / 48; depth 4, predicted from depth 5 (the nearer of equals is the deeper), wins at 2 x 1.992 /
    50 (α now 0.382); drafting is a line through the two depths measured: 2 ms a level. One request alone drafts
    the full depth."""
    from types import SimpleNamespace
    from specmesh.methods.cosine_schedule import Scheduled
    policy = Scheduled(depth=5, tree_tokens=16, lam=0.0, max_tokens=128, max_ms=float("inf"))
    rows = [SimpleNamespace(remaining=100)] * 2
    for n in (1, 2, 1):
        policy.observe(0.010, (10 + 16 * n) / 1000, [(5, 16, 1)] * n)
    assert policy.verify_fit() == pytest.approx((10.0, 1.0)) and policy.alpha() == pytest.approx(0.5)
    assert policy.draft_ms(3) == pytest.approx(6.0) and policy.tokens(3) == 16
    assert policy.budgets(rows) == [3, 3]
    policy.observe(0.006, 0.042, [(3, 16, 0)] * 2)
    assert policy.alpha() == pytest.approx(3.249 / 8.498) and policy.accepted(3) == 0.0
    assert policy.accepted(4) == pytest.approx(1 - policy.alpha() ** 5)
    assert policy.draft_ms(4) == pytest.approx(8.0) and policy.draft_ms(1) == pytest.approx(2.0)
    assert policy.budgets(rows) == [4, 4]
    assert policy.budgets(rows[:1]) == [5]


def test_plain_decoding_where_the_targets_forward_by_width_says_drafting_does_not_pay():
    """The target measured at 2.5 ms for up to 8 tokens and 0.4 ms a token past that (a CPU's compute-bound wide
    forwards). Seven rows whose 8-token trees accept 2 tokens: 7 x 3 / (8 + 22.4) ms drafting against 7 / 2.5 ms
    plainly, so they decode plainly once 16 drafted rows were verified, for PLAIN_RUN steps, then draft one step
    again. One row accepting 4 of its 8-token tree keeps drafting (5 / (2 + 2.5) against 1 / 2.5 at depth 5)."""
    from types import SimpleNamespace
    from specmesh.methods.cosine_schedule import Scheduled
    widths = {1: 2.5, 8: 2.5, 16: 5.7, 64: 24.9}
    policy = Scheduled(depth=5, tree_tokens=8, lam=0.0, max_tokens=128, max_ms=float("inf"), target_ms=widths)
    rows = [SimpleNamespace(remaining=100)] * 7
    policy.observe(0.008, 0.030, [(5, 8, 2)] * 7)
    policy.observe(0.008, 0.031, [(5, 8, 2)] * 7)
    assert policy.verdicts == 14 and policy.budgets(rows) == [5] * 7           # too little evidence yet
    policy.observe(0.008, 0.030, [(5, 8, 2)] * 7)
    assert [policy.budgets(rows) for _ in range(Scheduled.PLAIN_RUN)] == [[0] * 7] * Scheduled.PLAIN_RUN
    assert policy.current == 0 and policy.budgets(rows) == [5] * 7              # then one drafted step
    alone = Scheduled(depth=5, tree_tokens=8, lam=0.0, max_tokens=128, max_ms=float("inf"), target_ms=widths)
    for n in range(16):
        alone.observe(0.002, 0.0025, [(5, 8, 4)])
    assert alone.budgets([SimpleNamespace(remaining=100)])[0] > 0 and alone.plain == 0     # it drafts


def test_the_window_fit_forgets_points_past_its_window():
    from specmesh.methods.cosine_schedule import WindowFit
    fit = WindowFit(4)
    for x, y in [(1, 100.0), (9, -50.0), (2, 3.0), (4, 7.0), (6, 11.0), (8, 15.0)]:
        fit.add(x, y)
    assert fit.line() == pytest.approx((2.0, -1.0))      # the last 4: y = 2x - 1
    flat = WindowFit(3)
    for y in (1.0, 2.0, 6.0):
        flat.add(5, y)
    assert flat.line() == pytest.approx((0.0, 3.0))      # x never varies: slope 0, the mean

"""cosine's scheduler (engine/batch_plan.py): every bound holds, and the MILP finds brute force's optimum."""
import random

import pytest

from specmesh.engine.batch_plan import (EXACT_POOL, Bounds, Candidate, exhaustive, feasible, objective, plan,
                                        solve_for_size, total_ms, trim)


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
    from specmesh.engine.batch_plan import Scheduled
    policy = Scheduled(depth=5, tree_tokens=8, lam=0.0, max_tokens=20, max_ms=float("inf"))
    seq = SimpleNamespace(remaining=100)
    assert policy.budgets([seq] * 4) == [5] * 4            # nothing measured yet
    for tokens in (4, 8, 16, 32):
        policy.observe(0.004, (10 + tokens) / 1000, tokens)
    assert policy.verify_fit() == pytest.approx((10.0, 1.0))
    budgets = policy.budgets([seq] * 4)
    assert sorted(budgets) == [0, 0, 5, 5] and sum(8 if b else 1 for b in budgets) <= 20
    assert policy.budgets([seq]) == [5]
    assert policy.budgets([SimpleNamespace(remaining=3)]) == [2]

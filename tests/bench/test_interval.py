"""bench's paired bootstrap interval of a speed ratio."""
import pytest

from specmesh.bench.runner import speedup_interval
from specmesh.engine.stats import Stats


def runs(tokens_and_seconds):
    return [Stats(generated_tokens=t, elapsed_s=s) for t, s in tokens_and_seconds]


def test_a_ratio_the_same_on_every_prompt_has_no_spread():
    base = runs([(100, 1.0), (50, 0.4), (128, 2.0), (80, 0.7)])
    assert speedup_interval(base, base) == [1.0, 1.0]
    twice = runs([(100, 0.5), (50, 0.2), (128, 1.0), (80, 0.35)])
    assert speedup_interval(twice, base) == pytest.approx([2.0, 2.0])


def test_the_interval_holds_the_ratio_and_widens_with_the_spread():
    base = runs([(100, 1.0)] * 8)
    steady = runs([(100, 0.5), (100, 0.55)] * 4)
    spread = runs([(100, 0.3), (100, 0.9)] * 4)
    point = lambda r: sum(s.generated_tokens for s in r) / sum(s.elapsed_s for s in r) / 100   # noqa: E731
    for r in (steady, spread):
        lo, hi = speedup_interval(r, base)
        assert lo < point(r) < hi
    width = lambda r: speedup_interval(r, base)[1] - speedup_interval(r, base)[0]     # noqa: E731
    assert width(spread) > 3 * width(steady)


def test_too_few_prompts_give_no_interval():
    base = runs([(100, 1.0), (100, 1.0)])
    assert speedup_interval(base, base) is None

"""bench's summary of a method's runs, and the paired bootstrap interval of a speed ratio."""
import json
import warnings

import pytest

from specmesh.bench.report import main, ratio, speedup_interval
from specmesh.bench.runner import summarize
from specmesh.engine.stats import Stats


def test_a_ratio_the_same_on_every_prompt_has_no_spread():
    base = ([(100, 1.0), (50, 0.4), (128, 2.0), (80, 0.7)])
    assert speedup_interval(base, base) == [1.0, 1.0]
    twice = ([(100, 0.5), (50, 0.2), (128, 1.0), (80, 0.35)])
    assert speedup_interval(twice, base) == pytest.approx([2.0, 2.0])


def test_the_interval_holds_the_ratio_and_widens_with_the_spread():
    base = ([(100, 1.0)] * 8)
    steady = ([(100, 0.5), (100, 0.55)] * 4)
    spread = ([(100, 0.3), (100, 0.9)] * 4)
    point = lambda r: sum(t for t, _ in r) / sum(s for _, s in r) / 100   # noqa: E731
    for r in (steady, spread):
        lo, hi = speedup_interval(r, base)
        assert lo < point(r) < hi
    width = lambda r: speedup_interval(r, base)[1] - speedup_interval(r, base)[0]     # noqa: E731
    assert width(spread) > 3 * width(steady)


def test_too_few_prompts_give_no_interval():
    base = ([(100, 1.0), (100, 1.0)])
    assert speedup_interval(base, base) is None


def bench_result(seconds: dict[str, list[float]], tokens: int = 100) -> dict:
    return {"per_prompt": [{"method": name, "prompt": i, "new_tokens": tokens, "elapsed_s": s,
                            "tokens_per_s": tokens / s}
                           for name, times in seconds.items() for i, s in enumerate(times)]}


def test_a_ratio_between_two_methods_of_a_bench_file(tmp_path, capsys):
    result = bench_result({"ar": [1.0, 1.0, 1.0, 1.0], "sd": [0.5, 0.5, 0.5, 0.5], "tree": [0.5, 0.6, 0.4, 0.5]})
    value, ci, n = ratio(result, "tree", "sd")
    assert value == pytest.approx(1.0) and n == 4 and ci[0] < 1.0 < ci[1]
    assert ratio(result, "sd", "ar")[:2] == (pytest.approx(2.0), pytest.approx([2.0, 2.0]))
    for row in result["per_prompt"]:           # files written before elapsed_s: from tokens and tokens per second
        del row["elapsed_s"]
    assert ratio(result, "sd", "ar")[0] == pytest.approx(2.0)
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(result))
    main([str(path), "sd/ar"])
    assert capsys.readouterr().out == "sd vs ar: 2.000x (95% CI 2.00-2.00), 4 prompts\n"


@pytest.mark.parametrize("pair, message", [("sd/xx", "no method 'xx' in this bench (it ran ar, sd)"),
                                           ("sdar", "a pair is two method names with a slash")])
def test_a_bad_pair_is_named(tmp_path, capsys, pair, message):
    path = tmp_path / "bench.json"
    path.write_text(json.dumps(bench_result({"ar": [1.0] * 3, "sd": [0.5] * 3})))
    with pytest.raises(SystemExit) as exit_:
        main([str(path), pair])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_step_times_are_null_where_the_method_does_not_time_them():
    """pearl and the pipelines verify in loops of their own: no draft and verify split (null, as for ar), where the
    shared speculative step's are averaged per verification."""
    loop = Stats(generated_tokens=10, elapsed_s=1.0, target_forwards=4, verifications=4)
    step = Stats(generated_tokens=10, elapsed_s=1.0, target_forwards=4, verifications=4, draft_s=0.004, verify_s=0.008)
    summary = lambda stats: summarize("float32", 1, [([1], stats)], [[1]], 0, None)     # noqa: E731
    assert summary(loop)["draft_ms_per_step"] is None and summary(loop)["verify_ms_per_step"] is None
    assert summary(step)["draft_ms_per_step"] == pytest.approx(1.0) and summary(step)["verify_ms_per_step"] == 2.0


def test_more_threads_than_cores_are_warned_of():
    import os
    from specmesh.bench.runner import check_methods
    cores = len(os.sched_getaffinity(0))
    with pytest.warns(UserWarning, match=f"sd@{cores + 1}t: {cores + 1} threads oversubscribe"):
        assert check_methods([f"sd@{cores + 1}t"]) == ["ar", f"sd@{cores + 1}t"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_methods([f"sd@{cores}t"])

"""bench/project.py: a real run's token behaviour on a larger target's measured costs, labelled projected."""
import json

import pytest

from specmesh.bench.project import chain_gamma, main, project
from specmesh.bench.runner import summarize
from specmesh.engine.stats import Stats
from specmesh.timing import by_width

TARGET = {1: 100.0, 2: 110.0, 4: 130.0, 8: 200.0, 16: 320.0, 32: 600.0}    # ms by width


def run(**methods) -> dict:
    return {"methods": {"ar": {"tokens_per_forward": 1.0, "verifications": 0}} | methods}


def test_a_step_costs_its_draft_forwards_and_its_verification_width():
    sd = {"tokens_per_forward": 3.0, "verifications": 50, "rows_per_verification": 5.0,
          "draft_forwards_per_step": 4.0, "acceptance_rate": 0.7, "options": {"gamma": 4}}
    lookup = {"tokens_per_forward": 2.0, "verifications": 50, "rows_per_verification": 8.0,
              "draft_forwards_per_step": 0.0, "draft_ms_per_step": 0.5}
    (p_sd, p_lookup) = project(run(sd=sd, selfdraft=lookup), "real.json", TARGET, draft_ms=10.0)
    assert p_sd.step_ms == pytest.approx(4 * 10.0 + 130.0 + (200.0 - 130.0) / 4)     # width 5: between 4 and 8
    assert p_sd.speedup_vs_ar == pytest.approx(3.0 * 100.0 / p_sd.step_ms)
    assert p_lookup.step_ms == pytest.approx(0.5 + 200.0) and p_lookup.tokens_per_s == pytest.approx(2e3 / 200.5)
    assert p_sd.best_gamma == chain_gamma(0.7, 10.0, by_width(TARGET))[0] == 3
    assert p_lookup.best_gamma is None
    # no draft measured: a method that drafts with a model is left out, not priced at nothing
    assert [p.method for p in project(run(sd=sd, selfdraft=lookup), "real.json", TARGET, None)] == ["selfdraft"]


def test_the_best_gamma_grows_with_acceptance_and_shrinks_with_the_drafts_cost():
    flat = lambda w: 100.0 + w      # noqa: E731  (a verification costs about one row)
    assert chain_gamma(0.9, 5.0, flat)[0] > chain_gamma(0.5, 5.0, flat)[0]
    assert chain_gamma(0.8, 50.0, flat)[0] < chain_gamma(0.8, 5.0, flat)[0]
    gamma, rate = chain_gamma(0.0, 5.0, flat)
    assert gamma == 1 and rate == pytest.approx(1 / 107.0)


def test_the_bench_summary_carries_what_a_projection_reads():
    s = Stats(generated_tokens=30, elapsed_s=1.0, target_forwards=11, verifications=10, drafted_tokens=40,
              accepted_tokens=20, draft_forwards=40)
    out = summarize("float32", 1, [([1], s)], [[1]], 0, None)
    assert out["verifications"] == 10 and out["rows_per_verification"] == 5.0 and out["draft_forwards_per_step"] == 4.0


def test_the_command_measures_the_target_and_labels_its_output(tiny_checkpoint, tmp_path, capsys):
    real = tmp_path / "real.json"
    real.write_text(json.dumps(run(selfdraft={"tokens_per_forward": 2.0, "verifications": 5,
                                              "rows_per_verification": 3.0, "draft_forwards_per_step": 0.0,
                                              "draft_ms_per_step": 0.1})))
    out = tmp_path / "projected.json"
    assert main(["--target", str(tiny_checkpoint), "--run", str(real), "--out", str(out)]) == 0
    assert "PROJECTED" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["label"] == "projected" and [p["method"] for p in result["projections"]] == ["selfdraft"]
    assert set(map(int, result["target_ms_by_width"])) == {1, 2, 4, 8, 16, 32}
    with pytest.raises(SystemExit):
        main(["--target", str(tmp_path / "missing.gguf"), "--run", str(real)])

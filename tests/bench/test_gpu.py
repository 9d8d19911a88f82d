"""bench/gpu.py, the GPU check, on the CPU: its steps run in turn under one budget (a failed or timed-out step
recorded, the next one run, what is past the budget skipped) and a shape's costs come out of a tiny Llama shape
(transformers' model saved, loaded by specmesh, both timed on the same weights)."""
import dataclasses
import json
import sys

from specmesh.bench import gpu
from specmesh.bench.shapes import SHAPES


def test_the_steps_run_in_turn_under_one_budget(tmp_path):
    plan = {"ok": ([sys.executable, "-c", "print('done')"], 1.0),
            "fails": ([sys.executable, "-c", "raise SystemExit(3)"], 1.0),
            "slow": ([sys.executable, "-c", "import time; time.sleep(30)"], 0.1),
            "late": ([sys.executable, "-c", "import time; time.sleep(30)"], 1.0),
            "never": ([sys.executable, "-c", "print('never')"], 1.0)}
    summary = gpu.run_steps(tmp_path, 8, plan)
    steps = json.loads((tmp_path / "summary.json").read_text())["steps"]
    assert steps == summary["steps"]
    assert steps["ok"]["rc"] == 0 and "done" in steps["ok"]["tail"]
    assert steps["fails"]["rc"] == 3
    assert steps["slow"]["rc"] == "timeout" and steps["slow"]["seconds"] < 3       # its share: 0.8 s
    assert steps["late"]["rc"] == "timeout"                                         # what was left of the 8 s
    assert steps["never"] == {"skipped": "the budget is spent"}


def test_every_step_is_known_and_writes_into_the_folder(tmp_path):
    plan = gpu.steps(tmp_path, "cuda")
    assert list(plan) == ["environment", "cuda-tests", "embedded-fp32", "smollm2-fp32", "smollm2-bf16",
                          "smollm2-fp32-graphs", "shape-1b", "shape-8b"]
    assert sum(share for _, share in plan.values()) <= 1.5
    for argv, _ in plan.values():
        assert any(str(tmp_path) in a for a in argv)


def test_the_environment_step_names_what_is_missing(tmp_path, monkeypatch):
    assert gpu.main(["--environment", "--device", "cpu", "--json", str(tmp_path / "env.json")]) == 0
    found = json.loads((tmp_path / "env.json").read_text())
    assert found["missing"] == [] and found["device"] == "cpu" and found["torch"] == gpu.torch.__version__
    monkeypatch.setattr(gpu, "MODULES", (*gpu.MODULES, "no_such_module_here"))
    assert gpu.main(["--environment", "--device", "cpu", "--json", str(tmp_path / "env.json")]) == 1
    assert json.loads((tmp_path / "env.json").read_text())["missing"] == ["no_such_module_here"]


def test_a_shapes_costs_on_the_same_weights_in_specmesh_and_transformers():
    tiny = dataclasses.replace(SHAPES["Llama-3.2-1B"], name="tiny", hidden=256, layers=2, heads=4, kv_heads=2,
                               intermediate=512, vocab=1000, head_dim=64)
    costs = gpu.shape_costs(tiny, "cpu")
    assert set(costs["forward_ms_by_rows"]) == set(gpu.ROWS) and all(ms > 0 for ms in costs["forward_ms_by_rows"].values())
    assert costs["ar_tok_s"] > 0 and costs["transformers_tok_s"] > 0 and costs["transformers_compiled"] is False
    assert costs["ar_vs_transformers"] == round(costs["ar_tok_s"] / costs["transformers_tok_s"], 3)
    assert set(costs["graphs"]["forward_ms_by_rows"]) == set(gpu.ROWS) and costs["graphs_ar_vs_eager"] > 0

"""`specmesh simulate`: the real algorithms' tokens on a virtual clock."""
import json

import pytest

from specmesh import LLM, SamplingParams
from specmesh.bench.simulate import Profile
from specmesh.cli import main

KEYS = {"method", "stages", "simulated", "profile", "ms_per_token", "tokens_per_s", "tokens_per_timestep",
        "hit_rate", "tokens"}


def simulate(tmp_path, *args):
    out = tmp_path / "sim.json"
    assert main(["simulate", *args, "--max-new-tokens", "20", "--json", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.mark.parametrize("method", ["pp", "pipedec", "stpp"])
def test_json_contract_and_ar_tokens(tmp_path, tiny_checkpoint, method):
    result = simulate(tmp_path, "def add(a, b):", "--method", method, "--stages", "7", "--target",
                      str(tiny_checkpoint), "--draft", str(tiny_checkpoint))
    assert set(result) == KEYS and result["simulated"] is True and result["stages"] == 7
    ar = LLM(target=tiny_checkpoint).generate("def add(a, b):", SamplingParams(max_new_tokens=20))
    assert result["tokens"] == ar.tokens


def test_gpu_cluster_clock_arithmetic(tmp_path, tiny_checkpoint):
    common = ["def add(a, b):", "--stages", "14", "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint)]
    pp = simulate(tmp_path, *common, "--method", "pp")
    assert pp["ms_per_token"] == pytest.approx(14 * (10 + 0.5)) and pp["tokens_per_timestep"] == pytest.approx(1 / 14)
    pd = simulate(tmp_path, *common, "--method", "pipedec", "--tree-width", "8", "--max-children", "4")
    assert pd["hit_rate"] == 1.0                           # the target as its own draft
    n = len(pd["tokens"])
    timesteps = 14 + (n - 2)                               # the first root crosses 14 stages, then 1 per hit
    # every timestep: the stage step (10 ms, <= 64 tokens) beats the draft (4 ms), plus hop and broadcast
    assert pd["ms_per_token"] == pytest.approx(timesteps * 11.0 / n)
    assert pd["ms_per_token"] < pp["ms_per_token"] / 5


def test_profiles_load_and_fail_clearly(tmp_path):
    gpu = Profile.load("gpu-cluster")
    assert gpu.stage_ms(64, 14) == 10.0 and gpu.stage_ms(100, 14) == pytest.approx(13.6) and gpu.draft_ms(32) == 4.0
    local = Profile.load("local")                          # shipped, measured by --calibrate
    assert local.stage_ms(1, 2) == pytest.approx(local.stage["ms"][0] / 2) and local.hop_ms > 0
    with pytest.raises(FileNotFoundError, match="profile not found"):
        Profile.load(str(tmp_path / "missing.json"))


def test_plot_sweeps_three_methods_over_depths(tmp_path, tiny_checkpoint):
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    assert main(["simulate", "x", "--max-new-tokens", "8", "--tree-width", "4", "--max-children", "2", "--target",
                 str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--plot", str(png), "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["simulated"] is True and table["stages"] == [7, 14, 21] and set(table["ms_per_token"]) == {
        "pipedec", "pp", "stpp"}
    pp = table["ms_per_token"]["pp"]
    assert pp == pytest.approx([n * 10.5 for n in (7, 14, 21)]) and png.stat().st_size > 1000

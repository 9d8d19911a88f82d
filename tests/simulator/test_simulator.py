"""`specmesh simulate`: the real algorithms' tokens on a virtual clock."""
import dataclasses
import json

import pytest

from specmesh import LLM, SamplingParams
from specmesh.cli import main
from specmesh.simulator.pipelines import LOCAL, Profile

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
    pd = simulate(tmp_path, *common, "--method", "pipedec", "--tree-width", "1", "--max-children", "1")
    assert pd["hit_rate"] == 1.0                           # the target as its own draft, a chain: never cut
    n = len(pd["tokens"])
    timesteps = 14 + (n - 2)                               # the first root crosses 14 stages, then 1 per hit
    # the prompt's pass (14 stage steps and hops), then every timestep: the stage step (10 ms, <= 64 tokens) beats
    # the draft (4 ms), plus hop and broadcast
    assert pd["ms_per_token"] == pytest.approx((14 * 10.5 + timesteps * 11.0) / n)
    assert pd["ms_per_token"] < pp["ms_per_token"] / 5


@pytest.mark.parametrize("gamma, round_ms", [(4, 0.5 + 4 * 4.0 + 0.5), (2, 10.0)])
def test_pearl_simulated_gives_ars_tokens_and_prices_each_round(tmp_path, tiny_checkpoint, gamma, round_ms):
    """The gpu-cluster profile: the target's forward 10 ms, a drafted token 4 ms, a hop 0.5 ms. A round lasts the
    longer of the target's forward and the draft's γ tokens between two hops; rank 0's own work, timed as this
    process runs it, adds a little."""
    result = simulate(tmp_path, "def add(a, b):", "--method", "pearl", "--gamma", str(gamma), "--target",
                      str(tiny_checkpoint), "--draft", str(tiny_checkpoint))
    assert set(result) == KEYS | {"gamma"} and result["gamma"] == gamma and result["simulated"] is True
    ar = LLM(target=tiny_checkpoint).generate("def add(a, b):", SamplingParams(max_new_tokens=20))
    assert result["tokens"] == ar.tokens
    n = len(result["tokens"])
    rounds = round(n / result["tokens_per_timestep"])
    modelled = 10.0 + rounds * round_ms                     # the prompt's pass, then the rounds
    assert modelled <= result["ms_per_token"] * n <= 1.1 * modelled


SPLIT = {"world": 2, "layers": 4, "hidden": 64, "tokens": [1, 64], "shard_ms": [2.0, 2.0], "draft_ms": [0.5, 0.5],
         "forward_ms": 1.0}


def split_profile(tmp_path, **fields):
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps({"name": "t", "stage": {"base_ms": 1.0, "flat_tokens": 1, "per_token_ms": 0.0},
                                   "draft": {"per_layer_ms": 1.0}, "hop_ms": 0.01, "broadcast_ms": 0.01,
                                   "link_ms": 0.1} | fields))
    return profile


def test_a_split_targets_forward_is_its_shard_its_sums_and_its_message():
    """Rank 0's shard 2 ms; 2 sums a layer (4 layers) and the forward's message, each a hop of 0.1 ms plus its bytes
    at 1 Gbit (a sum: w x 64 float32); the runtime's 1 ms a forward."""
    from specmesh.simulator.split_hosts import Split
    p = Profile("t", {}, {}, hop_ms=0.01, broadcast_ms=0.01, link_ms=0.1, link_gbit=1.0)
    for w in (1, 8):
        assert Split(**SPLIT).target_ms(w, p) == pytest.approx(2.0 + 9 * 0.1 + 8 * (4 * w * 64) * 8 / 1e6 + 1.0)
    assert Split(**SPLIT).draft_step_ms(3) == 0.5


def test_sd_with_its_target_split_over_hosts_gives_sds_tokens_and_prices_its_forwards(tmp_path, tiny_checkpoint):
    """`simulate --method sd --link 1gbit`: the real sd here, each target and draft forward priced by the profile,
    the rest of rank 0's work as this process runs it."""
    from specmesh.simulator import split_hosts
    prompt = "def add(a, b):"
    result = simulate(tmp_path, prompt, "--method", "sd", "--link", "1gbit", "--profile",
                      str(split_profile(tmp_path, split=SPLIT)), "--target", str(tiny_checkpoint), "--draft",
                      str(tiny_checkpoint))
    ar = LLM(target=tiny_checkpoint).generate(prompt, SamplingParams(max_new_tokens=20))
    assert result["tokens"] == ar.tokens and result["simulated"] is True and result["tp"] == 2
    profile = dataclasses.replace(Profile.load(str(split_profile(tmp_path, split=SPLIT))), link_gbit=1.0)
    sim = split_hosts.Simulator(profile, 20, 4, str(tiny_checkpoint), str(tiny_checkpoint))
    answer, ms, forwards = sim(sim.llm.encode(prompt))
    assert answer.tokens == ar.tokens and forwards == answer.stats.verifications + 1     # the prompt's, the rounds'
    assert sim.draft.forwards == answer.stats.draft_forwards and sim.draft.ms == 0.5 * sim.draft.forwards
    priced = sim.target.ms + sim.draft.ms
    assert priced > forwards * 3.9 and priced <= ms <= priced + 50


def test_cosine_with_its_drafters_on_hosts_gives_cosines_tokens_and_prices_its_reads(tmp_path):
    """`simulate --method cosine --link 1gbit`: the real cosine here (γ fixed, no scheduler), each read of its model
    drafter priced as a hop (10 ms), its part and a hop back plus 1 ms of the protocol's own work; its forwards
    0.5 ms."""
    from specmesh.simulator import drafter_hosts
    drafters = {"tokens": [1, 64], "ms": {"specmesh-drafter-lib": [0.5, 0.5]}, "read_ms": 1.0}
    profile = split_profile(tmp_path, drafters=drafters, link_ms=10.0)
    prompt = "def fibonacci(n):"
    result = simulate(tmp_path, prompt, "--method", "cosine", "--link", "1gbit", "--profile", str(profile),
                      "--target", "embedded")
    cosine = LLM(target="embedded", method="cosine", drafters=drafter_hosts.DRAFTERS, gamma=drafter_hosts.GAMMA,
                 no_scheduler=True)
    assert result["tokens"] == cosine.generate(prompt, SamplingParams(max_new_tokens=20)).tokens
    assert result["simulated"] is True and result["gamma"] == drafter_hosts.GAMMA
    p = dataclasses.replace(Profile.load(str(profile)), link_gbit=1.0)
    sim = drafter_hosts.Simulator(p, 20, "embedded")
    answer, ms, reads = sim(sim.llm.encode(prompt))
    [priced] = sim.priced.values()
    assert reads > 0 and priced.ms == 0.5 * priced.forwards and priced.forwards >= reads
    least = reads * (0.5 + 2 * 10.0 + 1.0)                 # a forward at least, two hops and the protocol's work
    assert least <= sim.reads.ms <= least + reads * 5.0 and ms >= least + sim.target.ms
    with pytest.raises(ValueError, match="no costs of cosine's drafters"):
        drafter_hosts.Simulator(dataclasses.replace(p, drafters=None), 20, "embedded")


def test_sd_over_hosts_needs_one_tp_and_a_profile_measured_for_it(tmp_path, capsys):
    def refused(*args) -> str:
        with pytest.raises(SystemExit):
            main(["simulate", "def f():", "--method", "sd", "--link", "1gbit", *args])
        return capsys.readouterr().err
    assert "give one --tp N" in refused("--tp", "2,4")
    assert "has no costs of a split target: run `specmesh simulate --calibrate --hosts`" in refused(
        "--profile", str(split_profile(tmp_path)))
    assert "measured over 2 ranks, not 4: --tp 2" in refused("--tp", "4", "--profile",
                                                             str(split_profile(tmp_path, split=SPLIT)))


@pytest.mark.parametrize("method, extra", [("cosine", ["--concurrency", "2"]), ("tree", []), ("easyspec", [])])
def test_link_is_refused_where_the_simulation_has_no_hosts(method, extra, capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "def f():", "--method", method, "--link", "1gbit", *extra])
    assert f"{method}'s simulation has no hosts to put them on: drop --link" in capsys.readouterr().err


def test_profiles_load_and_fail_clearly(tmp_path):
    gpu = Profile.load("gpu-cluster")
    assert gpu.stage_ms(64) == 10.0 and gpu.stage_ms(100) == pytest.approx(13.6) and gpu.draft_ms(32) == 4.0
    assert gpu.stage_ms(0) == 0.0 and gpu.layers("pipedec", 14, 8, 32) == [8 / 14] * 14
    local = Profile.load("local")                          # shipped, measured by --calibrate
    layer, head = local.stage["layer_ms"][0], local.stage["head_ms"][0]
    assert local.stage_ms(1, 3, last=True) == pytest.approx(3 * layer + head) and local.hop_ms > 0
    assert local.draft_beside_stage0 and sum(local.layers("pipedec", 2, 8, 4)) == 8
    with pytest.raises(FileNotFoundError, match="profile not found"):
        Profile.load(str(tmp_path / "missing.json"))
    from specmesh.simulator.cluster import ClusterProfile
    from specmesh.simulator.split_target import TPProfile
    (tmp_path / "empty.json").write_text("{}")
    (tmp_path / "text.json").write_text("not json")
    for load, spec, message in [(Profile.load, tmp_path / "empty.json", "it needs broadcast_ms, draft, hop_ms"),
                                (Profile.load, tmp_path / "text.json", "text.json is not valid JSON"),
                                (TPProfile.load, "local", "--profile local holds the pipeline methods"),
                                (ClusterProfile.load, "local", "--profile local holds the pipeline methods"),
                                (TPProfile.load, str(LOCAL), "unknown: broadcast_ms")]:
        with pytest.raises(ValueError, match=message):
            load(str(spec))


def test_balanced_split_evens_out_the_steady_state():
    from specmesh.runtime.pipeline import balanced_layers
    # stage 0 also carries S (3 ms) and processes 4-node layers (1 ms a layer); the last a root (0.5) + head (1)
    assert balanced_layers(8, 2, 3.0, 1.0, 0.5, 1.0) == [range(0, 1), range(1, 8)]     # 4 ms vs 4.5 ms
    assert balanced_layers(8, 2, 0.0, 1.0, 1.0, 0.0) == [range(0, 4), range(4, 8)]
    counts = [len(r) for r in balanced_layers(9, 4, 0.0, 1.0, 1.0, 2.0)]        # the head weighs 2 layers
    assert sum(counts) == 9 and min(counts) >= 1 and max(max(counts[:3]), counts[3] + 2) == 3


def test_pipedec_splits_each_request_for_its_context():
    from specmesh.methods.pipeline.pipedec import StageCosts
    # a tree layer's attention grows fast with the context: long requests move layers off stage 0
    costs = StageCosts(8, 2, (64, 512), wide=(1.0, 5.0), root=(0.5, 0.6), head=(1.0, 1.0), draft=2.0)
    assert costs.split(64) == [range(0, 2), range(2, 8)] and costs.split(512) == [range(0, 1), range(1, 8)]


def test_plot_sweeps_three_methods_over_depths(tmp_path, tiny_checkpoint):
    out, png = tmp_path / "sweep.json", tmp_path / "sweep.png"
    assert main(["simulate", "x", "--max-new-tokens", "8", "--tree-width", "4", "--max-children", "2", "--target",
                 str(tiny_checkpoint), "--draft", str(tiny_checkpoint), "--plot", str(png), "--json", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["simulated"] is True and table["stages"] == [7, 14, 21] and set(table["ms_per_token"]) == {
        "pipedec", "pp", "stpp"}
    pp = table["ms_per_token"]["pp"]
    assert pp == pytest.approx([n * 10.5 for n in (7, 14, 21)]) and png.stat().st_size > 1000


def test_tp_clock_arithmetic():
    """The TP clock by hand: a target split over N devices, exact and layer-parallel draft forwards."""
    from specmesh.simulator.split_target import TPProfile, clock
    p = TPProfile("test", target_layers=10, target_layer_ms=2.0, flat_tokens=64, all_reduce_ms={"1": 0, "2": 0.1, "8": 0.4},
                  draft_layers=8, draft_attention_ms=0.5, draft_mlp_ms=1.0)
    assert p.collective_ms(4) == pytest.approx(0.25)                 # log2-interpolated (2 -> 0.1, 8 -> 0.4)
    assert p.target_ms(2, 5) == pytest.approx(10 * (2.0 / 2 + 2 * 0.1))
    assert p.exact_draft_ms() == pytest.approx(12.0)
    # 8 layers in groups of up to 2: 1, 2, 2, 2, 1 -> 5 attentions, 8 MLPs, 3 all-gathers over 2
    assert p.fuzzy_draft_ms(2) == pytest.approx(5 * 0.5 + 8 * 1.0 + 3 * 0.1)
    assert p.fuzzy_draft_ms(1) == pytest.approx(p.exact_draft_ms())
    counts = {"tokens": 30, "rounds": 10, "draft_forwards": 40, "drafted": 90, "accepted": 20, "exact_reads": 10}
    tree, es = clock("tree", counts, p, 2), clock("easyspec", counts, p, 2)
    assert tree["draft_ms_per_round"] == pytest.approx(4 * 12.0)
    assert es["draft_ms_per_round"] == pytest.approx(12.0 + 3 * p.fuzzy_draft_ms(2))     # the first read is exact
    some = clock("easyspec", counts | {"exact_reads": 4}, p, 2)      # 4 of 10 rounds calibrated (mismatch)
    assert some["draft_ms_per_round"] == pytest.approx(0.4 * 12.0 + 3.6 * p.fuzzy_draft_ms(2))
    assert tree["ms_per_token"] == pytest.approx(10 * (48.0 + p.target_ms(2, 10)) / 30)
    assert tree["speedup_vs_tp"] == pytest.approx(30 * p.target_ms(2, 1) / (10 * (48.0 + p.target_ms(2, 10))))


def test_tp_simulation_runs_the_real_methods(tmp_path, tiny_checkpoint):
    result = simulate(tmp_path, "def add(a, b):", "--method", "easyspec", "--tp", "1,2", "--target",
                      str(tiny_checkpoint), "--draft", str(tiny_checkpoint))
    assert result["simulated"] is True and [r["devices"] for r in result["rows"]] == [1, 2]
    one, two = result["rows"]
    assert one["easyspec"]["layer_groups"] == "1,1,1"          # one device: no group, exact drafting
    assert one["draft_speedup_vs_tree"] == pytest.approx(1.0)
    assert two["tree"]["tokens_per_round"] > 1 and two["easyspec"]["acceptance"] is not None
    assert result["calibration"] == "round" and two["easyspec"]["exact_forwards_per_round"] >= 1   # every round's first
    never = simulate(tmp_path, "def add(a, b):", "--method", "easyspec", "--tp", "2", "--calibration", "never",
                     "--target", str(tiny_checkpoint), "--draft", str(tiny_checkpoint))
    assert never["rows"][0]["easyspec"]["exact_forwards_per_round"] == 0      # never: every draft forward fuzzy
    with pytest.raises(SystemExit):
        main(["simulate", "x", "--method", "tree", "--tp", "0"])


def test_cluster_clock_arithmetic():
    from specmesh.simulator.cluster import ClusterProfile
    p = ClusterProfile("test", verify_base_ms=30, verify_per_token_ms=0.1, flat_tokens=100, drafter_ms=6,
                       server_draft_ms=4, hop_ms=0.5)
    assert p.verify_ms(80) == 30 and p.verify_ms(150) == pytest.approx(35)
    assert p.step_ms("cosine", 150, 5) == pytest.approx(5 * (6 + 1) + 0.5 + 35)      # drafter nodes, hops
    assert p.step_ms("sd", 40, 5) == pytest.approx(5 * 4 + 30)                          # draft on the server
    assert p.step_ms("cosine", 150, 5, pipelined=True) == pytest.approx(2 * max(5 * 7 + 0.5, 30))   # halves overlap


def test_cluster_simulation_runs_the_real_methods_concurrency_at_a_time(tmp_path, tiny_checkpoint,
                                                                         tiny_draft_checkpoint):
    """Three prompts, two at a time: the third takes the row of the first to finish."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in ("def add(a, b):", "class P:", "x = 1\n")))
    out = tmp_path / "sim.json"
    assert main(["simulate", "--prompts", str(prompts), "--method", "cosine", "--concurrency", "2", "--target",
                 str(tiny_checkpoint), "--draft", str(tiny_checkpoint),
                 "--drafters", f"{tiny_checkpoint},{tiny_draft_checkpoint}", "--max-new-tokens", "16",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["simulated"] is True and set(result["methods"]) == {"cosine pipelined", "cosine", "sd"}
    assert result["methods"]["sd"]["vs_sd"] == pytest.approx(1.0)
    assert result["requests"] == 3 and result["concurrency"] == 2
    for r in result["methods"].values():
        assert 2 * 16 < r["tokens"] <= 3 * 16 and r["steps"] > 0 and r["most_rows"] == 2


def test_pipedec_needs_a_draft_with_the_targets_vocabulary(tiny_checkpoint, capsys):
    """Without --draft the target's own draft (the embedded draft served SmolLM2 before: a hit rate of 0)."""
    for more, error in (([], "pipedec needs a draft model"), (["--draft", "specmesh-draft"], "different vocabularies")):
        with pytest.raises(SystemExit) as exit:
            main(["simulate", "def f():", "--method", "pipedec", "--target", str(tiny_checkpoint), *more])
        assert exit.value.code == 2 and error in capsys.readouterr().err


def test_the_crossing_bench_runs_each_method_as_the_simulator_and_its_calibration_do():
    from specmesh.bench import crossing
    from specmesh.simulator import calibration
    assert {m: crossing.OPTIONS[m] for m in calibration.OPTIONS} == calibration.OPTIONS

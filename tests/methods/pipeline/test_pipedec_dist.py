"""`pipedec` and `stpp` on the pipeline runtime: stage processes, the draft S, decisions from the last stage."""
import json
import re
import subprocess
import sys
from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency

from conftest import fail_rank_mid_stream

from specmesh import LLM, SamplingParams
from specmesh.methods.pipeline import schedule
from specmesh.model.loader import load_model

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x"]


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.fixture(scope="module")
def pipelines(tiny_checkpoint, tiny_draft_checkpoint):
    """Pipelines started once per configuration: (method, stages, S apart, draft "random" or "perfect")."""
    started = {}

    def get(method, stages, apart, draft="random"):
        key = (method, stages, apart, draft)
        if key not in started:
            path = tiny_draft_checkpoint if draft == "random" else tiny_checkpoint
            started[key] = LLM(target=tiny_checkpoint, draft=path, method=method, stages=stages, draft_apart=apart,
                               timeout=20, tree_width=3, max_children=2)
        return started[key]

    yield get
    for llm in started.values():
        llm.close()


PLACEMENTS = [(2, False), (3, True)]          # S beside stage 0 / S in a process of its own


@pytest.mark.parametrize("method", ["pipedec", "stpp"])
@pytest.mark.parametrize("stages, apart", PLACEMENTS)
def test_greedy_equals_ar(ar, pipelines, method, stages, apart):
    """With a random draft (mostly misses) and with the target as its own draft (mostly hits)."""
    for draft in ("random", "perfect"):
        llm = pipelines(method, stages, apart, draft)
        for prompt in PROMPTS[:2]:
            for max_new in (1, 17):
                params = SamplingParams(max_new_tokens=max_new, ignore_eos=True)
                out = llm.generate(prompt, params)
                assert out.tokens == ar.generate(prompt, params).tokens, (method, stages, draft, prompt)


@pytest.mark.parametrize("stages, apart", PLACEMENTS)
def test_the_simulator_runs_exactly_what_the_pipeline_runs(ar, pipelines, tiny_draft_checkpoint, stages, apart):
    """pipedec.run (the simulator's algorithm) and the distributed runtime: the same tokens, hits and
    timesteps, greedy and sampled, whatever the placement of S."""
    draft = load_model(tiny_draft_checkpoint, torch.float32, "cpu", draft=True)
    llm = pipelines("pipedec", stages, apart)
    for prompt in PROMPTS:
        for params in (SamplingParams(max_new_tokens=25, ignore_eos=True),
                       SamplingParams(max_new_tokens=25, ignore_eos=True, temperature=0.9, seed=3)):
            out = llm.generate(prompt, params)
            with torch.inference_mode():
                sim = schedule.run(ar.models.target, draft, ar.encode(prompt), params, 25, stages, 3, 2)
            assert out.tokens == sim.tokens
            assert (out.stats.timesteps, out.stats.hits, out.stats.decisions) == (
                sim.timesteps, sim.hits, len(sim.outcomes)), (prompt, params.temperature)


@pytest.mark.parametrize("method", ["pipedec", "stpp"])
def test_sampling_matches_ar_and_seeds_reproduce(ar, pipelines, method):
    samples = 200
    params = dict(max_new_tokens=2, temperature=1.0, n=samples)
    llm = pipelines(method, 2, False)
    got = llm.generate("def", SamplingParams(seed=1, **params))
    again = [llm.generate("def", SamplingParams(max_new_tokens=10, temperature=1.0, seed=s)).tokens for s in (3, 3, 4)]
    assert again[0] == again[1] != again[2]
    ref = ar.generate("def", SamplingParams(seed=2, **params))
    a, b = Counter(tuple(s.tokens) for s in ref.samples), Counter(tuple(s.tokens) for s in got.samples)
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rest = (samples - sum(a[k] for k in keys), samples - sum(b[k] for k in keys))
    assert chi2_contingency([[a[k] for k in keys] + [rest[0]], [b[k] for k in keys] + [rest[1]]])[1] > 0.001


def test_a_perfect_draft_hits_and_the_stats_say_so(tiny_checkpoint):
    with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="pipedec", tree_width=1, max_children=1) as llm:
        out = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=20, ignore_eos=True))
    stats = out.stats
    assert stats.decisions == 19 and stats.hits == 19            # a chain of the target's own argmaxes
    assert stats.timesteps == 2 + 18                             # the first root crosses 2 stages, then 1 per hit


@pytest.mark.parametrize("method", ["pp", "pipedec", "stpp"])
def test_a_killed_stage_fails_within_the_timeout(tiny_checkpoint, tiny_draft_checkpoint, method):
    draft = None if method == "pp" else tiny_draft_checkpoint
    llm = LLM(target=tiny_checkpoint, draft=draft, method=method, stages=3, timeout=3)
    assert llm.models.remote.link.roles == ["stage0" if method == "pp" else "draft+stage0", "stage1", "stage2"]
    fail_rank_mid_stream(llm, 2, "was killed by signal 9", max_new_tokens=400, within_s=5)
    llm.close()


def test_bad_pipelines_are_refused_before_any_process_starts(tiny_checkpoint, tiny_draft_checkpoint):
    with pytest.raises(ValueError, match="pipedec needs at least 2 stages"):
        LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="pipedec", stages=1)
    with pytest.raises(ValueError, match="cannot split 3 layers into 4 stages"):
        LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="stpp", stages=4)
    with pytest.raises(ValueError, match="draft_apart must be true or false"):
        LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="pipedec", draft_apart=2)


# pp, stpp and (across hosts) pearl under torchrun: tests/runtime/test_hosts.py
TORCHRUN_ROLES = {"pipedec": (r"draft\+stage0", "stage1"), "pearl": ("target", "draft")}


@pytest.mark.parametrize("method", ["pipedec", pytest.param("pearl", marks=pytest.mark.slow)])
def test_torchrun_starts_every_rank_with_the_same_command(ar, tiny_checkpoint, tiny_draft_checkpoint, tmp_path,
                                                          method):
    """Every rank of every multi-process method is served by the CLI under torchrun: greedy output equals ar's."""
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           "-m", "specmesh.cli", "generate", "def add(a, b):", "--method", method, "--target",
                           str(tiny_checkpoint), "--draft", str(tiny_draft_checkpoint), "--max-new-tokens", "12",
                           "--json", str(out)], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    first, second = TORCHRUN_ROLES[method]
    assert re.search(rf"rank 0 role {first} pid \d+", proc.stderr), proc.stderr[-3000:]
    assert re.search(rf"rank 1 role {second} pid \d+", proc.stderr), proc.stderr[-3000:]
    expected = ar.generate("def add(a, b):", SamplingParams(max_new_tokens=12)).tokens
    assert json.loads(out.read_text())["tokens"] == expected

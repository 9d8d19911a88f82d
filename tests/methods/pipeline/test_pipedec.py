"""PipeDec's schedule in one process: ar's tokens, hits and the timesteps they cost."""
from collections import Counter

import pytest
import torch
from scipy.stats import chi2_contingency

from specmesh import LLM, SamplingParams
from specmesh.methods.pipeline import schedule
from specmesh.model.loader import load_model

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x"]


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.fixture(scope="module")
def random_draft(tiny_draft_checkpoint):
    return load_model(tiny_draft_checkpoint, torch.float32, "cpu")


def decode(ar, draft, prompt, stages, width, children, max_new=30, **params):
    params = SamplingParams(max_new_tokens=max_new, ignore_eos=True, **params)
    with torch.inference_mode():
        return schedule.run(ar.models.target, draft, ar.encode(prompt), params, max_new, stages, width, children)


@pytest.mark.parametrize("stages, width, children", [(2, 1, 1), (2, 4, 2), (3, 8, 4), (5, 32, 16)])
def test_greedy_equals_ar_and_a_perfect_draft_always_hits(ar, random_draft, stages, width, children):
    for prompt in PROMPTS:
        expected = ar.generate(prompt, SamplingParams(max_new_tokens=30, ignore_eos=True)).tokens
        perfect = decode(ar, ar.models.target, prompt, stages, width, children)
        assert perfect.tokens == expected and perfect.hit_rate == 1.0
        # the first decision waits for the root to cross every stage; each hit then costs one timestep
        assert perfect.timesteps == stages + len(expected) - 2
        guess = decode(ar, random_draft, prompt, stages, width, children)
        assert guess.tokens == expected and guess.hit_rate < 1.0
        # a hit makes the next token wait one timestep, a miss `stages` (the last decision waits for nothing)
        assert guess.timesteps == stages + sum(1 if hit else stages for hit in guess.outcomes[:-1])


def test_a_pipeline_needs_two_stages(ar):
    with pytest.raises(ValueError, match="at least 2 stages"):
        decode(ar, ar.models.target, "def", 1, 4, 4)


def test_sampling_draws_from_the_target_and_seeds_reproduce(ar, random_draft):
    """Every token is the last stage's draw at a root, hit or miss: the first tokens' joint distribution
    is ar's (two-sample chi-square), and a seed gives the same tokens again."""
    samples = 300
    got = Counter(tuple(decode(ar, random_draft, "def", 2, 4, 2, temperature=1.0, seed=s, max_new=2).tokens)
                  for s in range(samples))
    ref = ar.generate("def", SamplingParams(max_new_tokens=2, temperature=1.0, seed=0, n=samples))
    want = Counter(tuple(sample.tokens) for sample in ref.samples)
    keys = [k for k in set(got) | set(want) if got[k] + want[k] >= 10]
    rest = (samples - sum(want[k] for k in keys), samples - sum(got[k] for k in keys))
    assert chi2_contingency([[want[k] for k in keys] + [rest[0]], [got[k] for k in keys] + [rest[1]]])[1] > 0.001
    again = [decode(ar, random_draft, "def", 3, 8, 4, temperature=1.0, seed=7).tokens for _ in range(2)]
    assert again[0] == again[1] != decode(ar, random_draft, "def", 3, 8, 4, temperature=1.0, seed=8).tokens


def test_pruning_regrows_the_newest_layer_from_the_kept_outputs(ar):
    """A hit leaves only the hit branch; the newest layer is regrown from its outputs, so it is as
    wide as the width allows again (not just the survivors of the old layer)."""
    target = ar.models.target
    with torch.inference_mode():
        drafter = schedule.TreeDrafter(target, ar.encode("def add(a, b):"), 64, width=4, children=4)
        drafter.start(5)
        for _ in range(3):
            drafter.grow()
        assert drafter.tree.layers == [1, 4, 4, 4]
        hit = 0
        child = int(drafter.tree.X[1])
        drafter.prune(hit)
        assert int(drafter.tree.X[0]) == child and drafter.tree.layers[-1] == 4
        assert len(drafter.q) == int(drafter.cache.spec[0]) == len(drafter.tree) - drafter.tree.layers[-1]

"""`pp`: plain pipeline-parallel decoding over stage processes (the PipeDec runtime's first piece)."""
from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from specmesh import LLM, SamplingParams
from specmesh.runtime.pipeline import stage_layers

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x"]


def test_stage_layers_split_contiguously():
    assert stage_layers(8, 3) == [range(0, 3), range(3, 6), range(6, 8)]
    assert stage_layers(3, 3) == [range(0, 1), range(1, 2), range(2, 3)]
    with pytest.raises(ValueError, match="cannot split 3 layers into 4 stages"):
        stage_layers(3, 4)


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.mark.parametrize("stages", [2, 3])
def test_greedy_equals_ar(ar, tiny_checkpoint, stages):
    with LLM(target=tiny_checkpoint, method="pp", stages=stages, timeout=20) as pp:
        for prompt in PROMPTS:
            for max_new in (1, 17):
                params = SamplingParams(max_new_tokens=max_new)
                out = pp.generate(prompt, params)
                assert out.tokens == ar.generate(prompt, params).tokens, (stages, prompt)
                assert out.stats.target_forwards == len(out.tokens)          # one full pass per token


def test_sampling_matches_ar_and_seeds_reproduce(ar, tiny_checkpoint):
    params = dict(max_new_tokens=2, temperature=1.0, n=300)
    with LLM(target=tiny_checkpoint, method="pp", stages=2) as pp:
        got = pp.generate("def", SamplingParams(seed=1, **params))
        again = [pp.generate("def", SamplingParams(max_new_tokens=10, temperature=1.0, seed=s)).tokens for s in (3, 3)]
    assert again[0] == again[1]
    ref = ar.generate("def", SamplingParams(seed=2, **params))
    a, b = Counter(tuple(s.tokens) for s in ref.samples), Counter(tuple(s.tokens) for s in got.samples)
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= 10]
    rest = (300 - sum(a[k] for k in keys), 300 - sum(b[k] for k in keys))
    assert chi2_contingency([[a[k] for k in keys] + [rest[0]], [b[k] for k in keys] + [rest[1]]])[1] > 0.001


def test_one_stage_is_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="at least 2 stages"):
        LLM(target=tiny_checkpoint, method="pp", stages=1)

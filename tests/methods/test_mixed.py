"""Several methods in one engine step (methods/mixed.py): each row gives exactly what its method gives alone."""
import pytest

from specmesh import LLM, SamplingParams

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x", "self.y = y\n\n" * 3,
           "import os\n", "while True:", "# a comment\n"]
METHODS = ["ar", "sd", "selfdraft", "suffix", "tree"]


@pytest.fixture(scope="module")
def mixed(tiny_checkpoint):
    return LLM(target=tiny_checkpoint, draft=tiny_checkpoint, methods=METHODS, gamma=3)   # a draft accepted


@pytest.fixture(scope="module")
def alone(tiny_checkpoint):
    """Each method alone, with the same options."""
    return {m: LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method=m, gamma=3) for m in METHODS}


def test_a_batch_of_rows_of_every_method_gives_each_row_what_it_gives_alone(mixed, alone):
    params = SamplingParams(max_new_tokens=30)
    chosen = [METHODS[i % len(METHODS)] for i in range(len(PROMPTS))]
    outs = mixed.generate(PROMPTS, params, method=chosen)
    for prompt, method, out in zip(PROMPTS, chosen, outs):
        solo = alone[method].generate(prompt, params)
        assert out.tokens == solo.tokens == alone["ar"].generate(prompt, params).tokens, (method, prompt)
        if method in ("sd", "tree"):        # the draft's state followed its own row: it proposed as it did alone
            assert (out.stats.accepted_tokens, out.stats.target_forwards) == \
                (solo.stats.accepted_tokens, solo.stats.target_forwards), (method, prompt)
    assert sum(o.stats.accepted_tokens for o in outs) > 0


def test_a_method_not_loaded_is_refused_by_name(mixed, tiny_checkpoint):
    from specmesh.lossless.sampling import InvalidParameter
    with pytest.raises(InvalidParameter, match="'pearl' is not one this engine runs: it runs ar, sd, selfdraft"):
        mixed.generate("x", SamplingParams(max_new_tokens=2), method="pearl")
    with pytest.raises(ValueError, match="this LLM runs ar"):
        LLM(target=tiny_checkpoint, method="ar").generate("x", SamplingParams(max_new_tokens=2), method="sd")
    with pytest.raises(ValueError, match="'pp' cannot share a step"):
        LLM(target=tiny_checkpoint, methods="ar,pp")


def test_auto_runs_the_choice_for_the_prompts_kind_among_the_methods_loaded(mixed, alone):
    from specmesh.tuning import Candidate, Choice
    measured = lambda m, ms: Candidate(m, {}, ms, "measured")
    before = mixed.choice
    try:
        mixed.choice = Choice("sd", {}, [measured("sd", 1.0), measured("ar", 2.0)])
        assert mixed.auto_method([1, 2, 3]) == "sd"
        out = mixed.generate(PROMPTS[4], SamplingParams(max_new_tokens=30), method="auto")
        assert out.tokens == alone["ar"].generate(PROMPTS[4], SamplingParams(max_new_tokens=30)).tokens
        assert out.stats.accepted_tokens > 0            # sd's rows (its draft is the target): it speculated
        # a choice this LLM does not run: the fastest measured candidate it runs, else ar
        mixed.choice = Choice("cosine", {}, [measured("cosine", 0.5), measured("easyspec", 0.7), measured("sd", 0.8),
                                             measured("ar", 2.0)])
        assert mixed.auto_method([1, 2, 3]) == "sd"
        mixed.choice = Choice("cosine", {}, [measured("cosine", 0.5), measured("ar", 2.0)])
        assert mixed.auto_method([1, 2, 3]) == "ar"
        mixed.choice = Choice("ar", {}, [measured("ar", 2.0)], kinds={"text": Choice("tree", {})})
        assert mixed.auto_method([1, 2, 3]) == "tree"       # the kind's own choice over the overall one
    finally:
        mixed.choice = before

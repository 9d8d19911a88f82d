"""`sd` and `tree`: greedy output identical to `ar`, sampling from the target's distribution."""

import pytest
import torch
from conftest import assert_same_distribution, sampled_pairs

from specmesh import LLM, SamplingParams

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x", "self.y = y\n\n" * 3]
GAMMA = 3


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.fixture(scope="module")
def restricted_draft(tiny_checkpoint, tmp_path_factory):
    """The target as a draft whose head computes a third of the vocabulary (-inf elsewhere)."""
    import shutil
    from safetensors.torch import save_file
    from specmesh.model.loader import HEAD_TOKENS
    path = tmp_path_factory.mktemp("restricted") / "draft"
    shutil.copytree(tiny_checkpoint, path)
    save_file({"ids": torch.arange(0, 300, 3)}, path / HEAD_TOKENS)
    return path


@pytest.fixture(scope="module", params=["random-draft", "perfect-draft", "restricted-head-draft"])
def draft_dir(request, tiny_checkpoint, tiny_draft_checkpoint, restricted_draft):
    return {"random-draft": tiny_draft_checkpoint, "perfect-draft": tiny_checkpoint,
            "restricted-head-draft": restricted_draft}[request.param]


VARIANTS = {"sd": ("sd", {}), "sd-stop": ("sd", {"stop_below": 0.3}), "sd-lookup": ("sd", {"lookup": 1}),
            "tree": ("tree", {}), "tree-pruned": ("tree", {"min_prob": 0.1, "lookup": 1})}


@pytest.fixture(scope="module", params=list(VARIANTS))
def spec(request, tiny_checkpoint, draft_dir):
    method, options = VARIANTS[request.param]
    return LLM(target=tiny_checkpoint, draft=draft_dir, method=method, gamma=GAMMA, tree_width=3, max_children=2,
               **options)


@pytest.mark.parametrize("max_new", [1, GAMMA - 1, GAMMA, GAMMA + 1, 17, 40])
def test_greedy_equals_ar(ar, spec, max_new):
    for prompt in PROMPTS:
        params = SamplingParams(max_new_tokens=max_new)
        assert spec.generate(prompt, params).tokens == ar.generate(prompt, params).tokens, prompt


def test_greedy_equals_ar_in_a_batch(ar, spec):
    params = SamplingParams(max_new_tokens=24)
    assert [o.tokens for o in spec.generate(PROMPTS, params)] == [o.tokens for o in ar.generate(PROMPTS, params)]


def test_perfect_draft_accepts_everything(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="sd", gamma=GAMMA)
    out = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=1 + 4 * (GAMMA + 1)))
    s = out.stats
    assert s.acceptance_rate == 1.0
    assert s.target_forwards == 1 + 4          # prefill, then γ+1 tokens per verification
    assert s.tokens_per_forward == (1 + 4 * (GAMMA + 1)) / 5


@pytest.mark.parametrize("method", ["sd", "tree"])
def test_draft_window_limits_the_draft_prefill_and_stays_lossless(ar, tiny_checkpoint, method):
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method=method, gamma=GAMMA, draft_window=4)
    widths = {"target": [], "draft": []}            # new tokens of each forward
    for role, seen in widths.items():
        model = getattr(llm.models, role)
        model.forward = lambda x, *a, _real=model.forward, _seen=seen, **kw: (_seen.append(x.shape[1]),
                                                                             _real(x, *a, **kw))[1]
    prompt = PROMPTS[-1]
    params = SamplingParams(max_new_tokens=30)
    assert llm.generate(prompt, params).tokens == ar.generate(prompt, params).tokens
    assert widths["target"][0] == len(llm.encode(prompt)) > 4
    # the window and the root in one forward (a lone row), then a token or a level at a time
    assert widths["draft"][0] == 4 + 1 and max(widths["draft"]) <= 4 + 1


def test_stop_below_ends_unsure_chains_early(ar, tiny_checkpoint, tiny_draft_checkpoint):
    params = SamplingParams(max_new_tokens=40)
    runs = {stop: LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=GAMMA,
                      stop_below=stop).generate(PROMPTS[0], params) for stop in (0.0, 0.99)}
    assert runs[0.0].tokens == runs[0.99].tokens == ar.generate(PROMPTS[0], params).tokens
    s = runs[0.99].stats            # a random draft is never sure: one draft forward and token per step at most
    assert s.draft_forwards <= s.verifications and s.drafted_tokens <= s.verifications
    assert runs[0.99].stats.draft_forwards < runs[0.0].stats.draft_forwards


def test_stop_below_seeded_sample_same_in_a_batch(tiny_checkpoint, tiny_draft_checkpoint):
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="sd", gamma=GAMMA, stop_below=0.5)
    params = SamplingParams(max_new_tokens=20, temperature=1.0, seed=7)
    alone = llm.generate(PROMPTS[1], params).tokens
    batch = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2]], params)
    assert batch[1].tokens == alone


def test_random_draft_rarely_accepted(tiny_checkpoint, tiny_draft_checkpoint):
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=GAMMA)
    s = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=40)).stats
    assert s.acceptance_rate < 0.3 and s.draft_forwards > 0


def test_eos_inside_an_accepted_block_stops_there(ar, tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="sd", gamma=4)
    params = SamplingParams(max_new_tokens=30)
    base = ar.generate("def add(a, b):", params).tokens
    eos = base[6]
    for model in (ar.models.target, llm.models.target):
        model.config.eos_token_id = eos
    try:
        got = llm.generate("def add(a, b):", params)
        want = ar.generate("def add(a, b):", params)
    finally:
        for model in (ar.models.target, llm.models.target):
            model.config.eos_token_id = 0
    assert got.tokens == want.tokens == base[:base.index(eos) + 1]


def test_seeded_sampling_reproducible(tiny_checkpoint, tiny_draft_checkpoint):
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=GAMMA)
    run = lambda seed: llm.generate("def", SamplingParams(max_new_tokens=12, temperature=1, seed=seed)).tokens
    assert run(3) == run(3) and run(3) != run(4)


@pytest.mark.parametrize("method, draft, options, kw", [
    ("sd", "random", {}, {}), ("sd", "random", {}, {"top_k": 4}), ("sd", "random", {"stop_below": 0.5}, {}),
    ("sd", "random", {"lookup": 1}, {}),
    ("sd", "restricted", {}, {}), ("tree", "random", {}, {"top_p": 0.9}),
    ("tree", "restricted", {"min_prob": 0.05, "lookup": 1}, {})])
def test_sampling_two_sample_test_against_ar(tiny_checkpoint, tiny_draft_checkpoint, restricted_draft, method, draft,
                                             options, kw):
    ar = LLM(target=tiny_checkpoint)
    spec = LLM(target=tiny_checkpoint, draft=restricted_draft if draft == "restricted" else tiny_draft_checkpoint,
               method=method, gamma=2, tree_width=3, max_children=2, **options)
    assert_same_distribution(sampled_pairs(ar, 1500, 0, **kw), sampled_pairs(spec, 1500, 1, **kw))


def test_n_samples_share_the_prompt_prefill(ar, tiny_checkpoint, tiny_draft_checkpoint):
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=GAMMA)
    params = SamplingParams(max_new_tokens=9, n=3)
    out = llm.generate("def add(a, b):", params)
    want = ar.generate("def add(a, b):", SamplingParams(max_new_tokens=9)).tokens
    assert [s.tokens for s in out.samples] == [want] * 3
    one = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=9)).stats
    assert out.stats.target_forwards == 3 * one.target_forwards - 2      # one prompt prefill, not three

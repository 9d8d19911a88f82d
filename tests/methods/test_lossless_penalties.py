"""Penalties and logit bias inside verification: greedy equals `ar` with the same penalties for every
batched method, sampling draws from the penalised target (two-sample test), and a verifier that
leaves them out fails both."""
from collections import Counter

import pytest
from scipy.stats import chi2_contingency

from specmesh import LLM, SamplingParams
from specmesh.lossless.verify import verify as real_verify
from specmesh.methods import speculative

PROMPT = "class Point:"
PROMPTS = ["def add(a, b):", "class Point:\n    def", "x", "self.y = y\n\n" * 3]
PENALTIES = {
    "frequency": {"frequency_penalty": 1.2},
    "presence": {"presence_penalty": 1.5},
    "repetition": {"repetition_penalty": 1.8},
    "bias": {"logit_bias": {5: 4.0, 17: -100, 40: 2.5}},
    "all": {"frequency_penalty": 0.7, "presence_penalty": -0.4, "repetition_penalty": 1.3, "logit_bias": {9: 3.0}},
}


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.fixture(scope="module", params=["sd", "tree", "selfdraft", "sd-perfect-draft", "tree-perfect-draft"])
def llm(request, tiny_checkpoint, tiny_draft_checkpoint):
    method, _, perfect = request.param.partition("-")
    draft = None if method == "selfdraft" else tiny_checkpoint if perfect else tiny_draft_checkpoint
    return LLM(target=tiny_checkpoint, draft=draft, method=method, gamma=3, tree_width=3, max_children=2)


def unpenalised_verify(tree, logits, params, generator=None, penalty=None):
    """A broken verifier: the target's logits as they are (the draft still applies the penalties)."""
    return real_verify(tree, logits, params, generator)


@pytest.mark.parametrize("kind", PENALTIES)
def test_greedy_with_penalties_equals_ar(ar, llm, kind):
    params = SamplingParams(max_new_tokens=30, **PENALTIES[kind])
    changed = False
    for prompt in PROMPTS:
        want = ar.generate(prompt, params).tokens
        assert llm.generate(prompt, params).tokens == want, prompt
        changed |= want != ar.generate(prompt, SamplingParams(max_new_tokens=30)).tokens
    assert changed, "the penalties changed no output: the test would not see them ignored"


def test_an_unpenalised_verifier_fails_greedy(ar, tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(speculative, "verify", unpenalised_verify)
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="sd", gamma=3)
    params = SamplingParams(max_new_tokens=30, **PENALTIES["all"])
    assert any(llm.generate(p, params).tokens != ar.generate(p, params).tokens for p in PROMPTS)


def test_a_batch_mixing_penalised_and_plain_requests(ar, tiny_checkpoint):
    requests = [(p, SamplingParams(max_new_tokens=20, **PENALTIES[k])) for p in PROMPTS for k in ("all", "bias")]
    requests += [(p, SamplingParams(max_new_tokens=20)) for p in PROMPTS]
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="sd", gamma=3, max_batch=len(requests))
    ids = [llm.encode(p) for p, _ in requests]
    engine = llm.engine_for(llm.method)
    seqs = [engine.sequences(i, params)[0] for i, (_, params) in zip(ids, requests)]
    engine.complete([seqs])
    assert [s.tokens for s in seqs] == [ar.generate(p, params).tokens for p, params in requests]


def sampled_penalties(ar) -> dict:
    """Penalties that move this prompt's distribution a lot: the greedy tokens pushed down."""
    greedy = ar.generate(PROMPT, SamplingParams(max_new_tokens=3)).tokens
    return {"frequency_penalty": 2.0, "repetition_penalty": 2.0, "logit_bias": {t: -3.0 for t in greedy}}


def joint_counts(llm, n, seed, penalties):
    """Joint counts of the first three tokens (top-k keeps the outcomes few enough to compare)."""
    params = SamplingParams(max_new_tokens=3, temperature=1.0, top_k=4, seed=seed, n=n, **penalties)
    return Counter(tuple(s.tokens) for s in llm.generate(PROMPT, params).samples)


def two_sample_pvalue(a: Counter, b: Counter) -> float:
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 20]        # pool rare triples
    rest = [sum(c.values()) - sum(c[k] for k in common) for c in (a, b)]
    table = [[c[k] for k in common] + ([r] if sum(rest) else []) for c, r in zip((a, b), rest)]
    assert len(common) >= 3, "too few outcomes for a meaningful test"
    return chi2_contingency(table).pvalue


@pytest.fixture(scope="module")
def ar_samples(ar):
    penalties = sampled_penalties(ar)
    return penalties, joint_counts(ar, 1500, 0, penalties)


@pytest.mark.parametrize("draft", ["random-draft", "perfect-draft"])
def test_sd_samples_the_penalised_target(ar_samples, tiny_checkpoint, tiny_draft_checkpoint, draft):
    penalties, want = ar_samples
    sd = LLM(target=tiny_checkpoint, draft=tiny_checkpoint if draft == "perfect-draft" else tiny_draft_checkpoint,
             method="sd", gamma=2)
    assert two_sample_pvalue(want, joint_counts(sd, 1500, 1, penalties)) > 1e-3


def test_an_unpenalised_verifier_fails_the_two_sample_test(ar_samples, tiny_checkpoint, monkeypatch):
    monkeypatch.setattr(speculative, "verify", unpenalised_verify)
    penalties, want = ar_samples
    sd = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="sd", gamma=2)
    assert two_sample_pvalue(want, joint_counts(sd, 1500, 1, penalties)) < 1e-6

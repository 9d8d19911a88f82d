"""`suffix`: the suffix tree's counts, matches and bound; greedy output identical to `ar`, sampling from the
target's distribution, across requests that share the tree."""
import random

import pytest
from conftest import assert_same_distribution, sampled_pairs

from specmesh import LLM, SamplingParams
from specmesh.lossless.token_tree import TokenTree
from specmesh.proposers.suffix_tree import SuffixTree

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "x", "self.y = y\n\n" * 3]


def test_counts_say_how_often_each_continuation_followed():
    tree = SuffixTree(depth=4, cache_tokens=100)
    tree.extend(tree.open(), [1, 2, 3, 1, 2, 4, 1, 2, 3])
    node, m = tree.match([7, 1, 2], longest=3)
    assert m == 2 and tree.count[node] == 3             # "1 2" three times: followed by 3 twice, 4 once
    grown = tree.grow(TokenTree.root(2), node, nodes=8, levels=2, min_prob=0.0)
    # best first: 3 (2/3), then 3's one continuation, 1 (2/3 * 1), then 4 (1/3), then 4's 1 (1/3)
    assert grown.tokens == [2, 3, 1, 4, 1] and grown.parents == [-1, 0, 1, 0, 3]
    assert grown.prob == pytest.approx([1.0, 2 / 3, 1.0, 1 / 3, 1.0])
    assert tree.grow(TokenTree.root(2), node, nodes=2, levels=2, min_prob=0.0).tokens == [2, 3, 1]
    assert tree.grow(TokenTree.root(2), node, nodes=8, levels=1, min_prob=0.5).tokens == [2, 3]


def test_the_longest_suffix_with_a_continuation_is_matched():
    tree = SuffixTree(depth=8, cache_tokens=100)
    tree.extend(tree.open(), [5, 6, 7, 8, 9, 6, 7, 1])
    assert tree.match([5, 6, 7], longest=6)[1] == 3     # "5 6 7" -> 8, though "6 7" goes on too
    assert tree.match([0, 6, 7], longest=6)[1] == 2
    assert tree.match([4, 4], longest=6) == (0, 0)
    assert tree.match([7, 1], longest=6) == (0, 0)      # "7 1" and "1" end the text: nothing followed them


def test_dropping_every_sequence_frees_every_node():
    rng = random.Random(0)
    tree = SuffixTree(depth=5, cache_tokens=10_000)
    texts = [[rng.randrange(6) for _ in range(rng.randrange(1, 60))] for _ in range(20)]
    ids = [tree.open() for _ in texts]
    for sid, text in zip(ids, texts):
        for i in range(0, len(text), 7):
            tree.extend(sid, text[i:i + 7])
    fresh = SuffixTree(depth=5, cache_tokens=10_000)
    fresh.extend(fresh.open(), texts[-1])
    for sid in ids[:-1]:
        tree.drop(sid)
    assert tree.nodes == fresh.nodes and tree.tokens == len(texts[-1])
    assert tree.match(texts[-1][:3], 4) == (0, 0) or tree.count[tree.match(texts[-1][:3], 4)[0]] == \
        fresh.count[fresh.match(texts[-1][:3], 4)[0]]
    tree.drop(ids[-1])
    assert tree.nodes == 0 and tree.kids[0] is None and tree.tokens == 0


def test_the_bound_holds_under_a_long_run():
    rng = random.Random(1)
    tree = SuffixTree(depth=6, cache_tokens=500)
    for _ in range(200):
        sid = tree.open()
        tree.extend(sid, [rng.randrange(50) for _ in range(rng.randrange(1, 120))])
        assert tree.tokens <= 500 and tree.nodes <= 500 * 6
    assert len(tree.count) <= 500 * 6 + 1                   # freed nodes are reused: the arrays stop growing


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.fixture(scope="module", params=[{}, {"gamma": 3, "tree_tokens": 5}, {"private": True, "min_prob": 0.0}])
def suffix(request, tiny_checkpoint):
    return LLM(target=tiny_checkpoint, method="suffix", **request.param)


@pytest.mark.parametrize("max_new", [1, 2, 5, 40])
def test_greedy_equals_ar(ar, suffix, max_new):
    params = SamplingParams(max_new_tokens=max_new)
    accepted = 0
    for prompt in PROMPTS + PROMPTS:                        # the second time, the first's outputs are in the tree
        out = suffix.generate(prompt, params)
        assert out.tokens == ar.generate(prompt, params).tokens, prompt
        accepted += out.stats.accepted_tokens
    assert max_new < 40 or accepted > 0                     # the test verified proposals


def test_greedy_equals_ar_in_a_batch(ar, suffix):
    params = SamplingParams(max_new_tokens=30)
    assert [o.tokens for o in suffix.generate(PROMPTS, params)] == [o.tokens for o in ar.generate(PROMPTS, params)]


def test_the_engine_keeps_its_bound_over_requests(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint, method="suffix", cache_tokens=200)
    for i in range(12):
        llm.generate(f"{PROMPTS[i % len(PROMPTS)]} {i}", SamplingParams(max_new_tokens=40))
    tree = llm.engine_for(llm.method).method.proposer.shared
    assert 0 < tree.tokens <= 200 and tree.nodes <= 200 * tree.depth


@pytest.mark.parametrize("kw", [{}, {"top_k": 4}])
def test_sampling_two_sample_test_against_ar(tiny_checkpoint, kw):
    ar = LLM(target=tiny_checkpoint)
    spec = LLM(target=tiny_checkpoint, method="suffix", gamma=2, min_prob=0.0)   # every row speculates
    assert_same_distribution(sampled_pairs(ar, 1500, 0, **kw), sampled_pairs(spec, 1500, 1, **kw))
    assert spec.engine_for(spec.method).method.proposer.shared.tokens > 0

"""Self-Draft: n-gram caches, branch masks, losslessness."""
from collections import Counter

import numpy as np
import pytest
import torch

from specmesh import LLM, SamplingParams
from specmesh.lossless.token_tree import TokenTree
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.proposers.multibranch import candidates
from specmesh.proposers.ngram import ContextCache, build_corpus_cache


def test_context_cache_is_lru_and_bounded_per_key():
    cache = ContextCache(gram=3, per_key=2)
    cache.add([1, 2, 3])
    cache.add([1, 4, 5])
    cache.add([1, 2, 3])          # refreshed: now the most recent
    cache.add([1, 6, 7])          # evicts (4, 5), the least recently used
    assert cache.lookup(1, 5) == [(6, 7), (2, 3)]
    assert cache.lookup(9, 5) == []


def test_corpus_cache_prefers_longer_prefix_then_frequency():
    docs = [np.array([5, 1, 2, 3, 9] * 3 + [7, 1, 4, 4, 4] * 8 + [8, 1, 2, 3, 9] * 2, dtype=np.int32)]
    cache = build_corpus_cache(docs, cont_len=3, max_prefix=2, per_prefix=(4, 4), min_count=2)
    # after "... 1": (4,4,4) is the most frequent continuation
    assert cache.lookup([3, 1], 3)[0] == (4, 4, 4)
    # after "5 1": the 2-token prefix wins over the 1-token one
    assert cache.lookup([9, 5, 1], 3)[0] == (2, 3, 9)


def test_planted_ngram_is_proposed(tmp_path):
    rng = np.random.default_rng(0)
    planted = [11, 12, 13, 14]
    docs = [np.concatenate([rng.integers(20, 200, 50), planted]).astype(np.int32) for _ in range(30)]
    build_corpus_cache(docs, cont_len=3).save(tmp_path / "c.npz")
    from specmesh.proposers.ngram import CorpusCache
    cache = CorpusCache.load(tmp_path / "c.npz")
    assert (12, 13, 14) in cache.lookup([99, 11], 4)


def test_a_corpus_cache_of_another_tokenizer_is_refused(tiny_checkpoint, tmp_path):
    """A cache records the tokenizer that counted it; one counted with another (or with ids past the target's
    vocabulary, which its embedding cannot take) is refused with a message naming the file."""
    from specmesh.model.loader import load_tokenizer
    from specmesh.proposers.ngram import CorpusCache
    tokenizer = load_tokenizer(tiny_checkpoint)
    docs = [np.array([5, 1, 2, 3, 9] * 6, dtype=np.int32)]
    for name, fingerprint, shift in [("ours", tokenizer.fingerprint, 0), ("theirs", "0123456789abcdef", 0),
                                     ("unrecorded", "", 0), ("past", "", tokenizer.vocab_size)]:
        cache = build_corpus_cache([d + shift for d in docs], cont_len=3)
        cache.tokenizer = fingerprint
        cache.save(tmp_path / f"{name}.npz")
        assert CorpusCache.load(tmp_path / f"{name}.npz").tokenizer == fingerprint
    params = SamplingParams(max_new_tokens=4)
    for name in ("ours", "unrecorded"):
        LLM(target=tiny_checkpoint, method="selfdraft", ngram_cache=str(tmp_path / f"{name}.npz")).generate("x", params)
    for name in ("theirs", "past"):
        with pytest.raises(ValueError, match=f"{name}.npz was counted with another tokenizer"):
            LLM(target=tiny_checkpoint, method="selfdraft", ngram_cache=str(tmp_path / f"{name}.npz")).generate(
                "x", params)


@torch.no_grad()
def test_branch_logits_do_not_see_other_branches_or_candidates(tiny_model):
    """A branch is a path of the verified tree: its tokens see the root and the branch's earlier tokens only."""
    prefix = [3, 1, 4, 1, 5, 9, 2, 6]

    def branch0_logits(other_branch, candidates):
        cache = KVCache.for_model(tiny_model, 1, 64)
        tiny_model(torch.tensor([prefix]), cache)
        cache.commit_all()
        tree = TokenTree.from_paths(10, candidates + [[7, 8, 9], other_branch])
        logits = tiny_model(torch.tensor([tree.tokens]), cache, Batch(tree.depth_tensor(),
                            tree.ancestor_mask()))[0]
        return logits[[tree.node([7, 8, 9][:j + 1]) for j in range(3)]]

    a = branch0_logits([20, 21], [[30, 31, 32]])
    b = branch0_logits([40, 41, 42, 43], [[50], [51, 52], [7, 8]])
    assert (a - b).abs().max() <= 1e-5
    plain = tiny_model(torch.tensor([prefix + [10, 7, 8, 9]]))[0, -3:]
    assert (a - plain).abs().max() <= 1e-5


PROMPTS = ["def add(a, b):\n    return a + b\n\ndef add(", "class Point:\n    def", "x", "for i in range(10):\n" * 3]


@pytest.mark.parametrize("options", [{}, {"branches": 6, "branch_len": 6, "gram": 4, "max_candidates": 6},
                                     {"branches": 1, "branch_len": 2, "gram": 2, "max_candidates": 1}])
@pytest.mark.parametrize("max_new", [1, 3, 25])
def test_greedy_equals_ar(tiny_checkpoint, options, max_new):
    ar, sd = LLM(target=tiny_checkpoint), LLM(target=tiny_checkpoint, method="selfdraft", **options)
    for prompt in PROMPTS:
        params = SamplingParams(max_new_tokens=max_new)
        assert sd.generate(prompt, params).tokens == ar.generate(prompt, params).tokens, prompt


def test_candidates_come_from_the_context_then_the_corpus():
    context = ContextCache(gram=4)
    context.add_sequence([5, 6, 7, 8, 1, 9, 9, 9])
    docs = [np.array([2, 5, 1, 1, 1] * 4, dtype=np.int32)]
    corpus = build_corpus_cache(docs, cont_len=3)
    assert candidates(5, [3, 5], context, corpus, k=2, room=10) == [[6, 7, 8], [1, 1, 1]]
    assert candidates(5, [3, 5], context, corpus, k=2, room=2) == [[6, 7], [1, 1]]
    assert candidates(5, [3, 5], context, None, k=2, room=0) == []


def test_sampling_two_sample_test_against_ar(tiny_checkpoint):
    from scipy.stats import chi2_contingency
    ar, sd = LLM(target=tiny_checkpoint), LLM(target=tiny_checkpoint, method="selfdraft")
    prompt = "class Point:\n    def __init__(self, x, y):\n        self.x = x\n"
    counts = [Counter(tuple(s.tokens) for s in llm.generate(
        prompt, SamplingParams(max_new_tokens=2, temperature=1.0, seed=seed, n=1500)).samples)
        for llm, seed in ((ar, 0), (sd, 1))]
    a, b = counts
    common = [k for k in set(a) | set(b) if a[k] + b[k] >= 20]
    rest = [sum(c.values()) - sum(c[k] for k in common) for c in (a, b)]
    table = [[c[k] for k in common] + ([r] if sum(rest) else []) for c, r in zip((a, b), rest)]
    assert len(common) >= 3
    assert chi2_contingency(table).pvalue > 1e-3

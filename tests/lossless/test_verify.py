"""The verification core: crafted distributions, hand-built trees, and mutants that must fail."""
import math

import pytest
import torch
from scipy.stats import chisquare

from specmesh.lossless import verify as V
from specmesh.lossless.sampling import SamplingParams, sample
from specmesh.lossless.token_tree import TokenTree

SAMPLE = SamplingParams(temperature=1.0)
GREEDY = SamplingParams()
TRIALS = 12000

P = torch.tensor([0.35, 0.25, 0.2, 0.1, 0.06, 0.04])
CASES = {
    "q=p": P.clone(),
    "q disjoint": torch.tensor([0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.5])[:6] + torch.tensor([0, 0, 0, 0, 0, 1.0]),
    "q zero where p>0": torch.tensor([0.0, 0.0, 0.5, 0.5, 0.0, 0.0]),
    "q skewed": torch.tensor([0.02, 0.03, 0.05, 0.1, 0.3, 0.5]),
}


def logits_of(p):
    return torch.where(p > 0, p.log(), torch.tensor(-math.inf))


def first_tokens(p, q, children, trials=TRIALS, seed=0):
    """Empirical distribution of the first emitted token when `children` drafts are drawn i.i.d. from q."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.zeros(len(p))
    logits = logits_of(p).expand(children + 1, -1)
    for _ in range(trials):
        tree = TokenTree.root(0)
        tree.sampled = True
        tree.q = {0: q}
        for x in torch.multinomial(q, children, replacement=True, generator=g).tolist():
            tree.add(x, 0, float(q[x]))
        counts[V.verify(tree, logits, SAMPLE, g).tokens[0]] += 1
    return counts


def pvalue(counts, p):
    keep = p > 0
    assert counts[~keep].sum() == 0, "emitted a token the target gives probability 0"
    return chisquare(counts[keep].numpy(), (p[keep] * counts.sum()).numpy()).pvalue


def test_a_draw_follows_its_distribution_row_by_row_and_never_gives_a_zero():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.1, 0.0, 0.45, 0.0, 0.3, 0.15])
    drawn = sample(p.expand(TRIALS, -1), g)                   # [TRIALS] rows at once, one draw each
    assert drawn.shape == (TRIALS,) and pvalue(torch.bincount(drawn, minlength=6).float(), p) > 1e-3
    assert int(sample(torch.tensor([0.0, 0.0, 1.0, 0.0]), g)) == 2 and sample(p * 3, g).shape == ()


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("children", [1, 3])
def test_rejection_sampling_reproduces_the_target(case, children):
    assert pvalue(first_tokens(P, CASES[case], children), P) > 1e-3


def test_deterministic_proposals_reproduce_the_target():
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(6)
    tree = TokenTree.from_paths(0, [[0, 1], [3], [5]])     # top-k style children, not drawn from q
    logits = logits_of(P).expand(len(tree), -1)
    for _ in range(TRIALS):
        counts[V.verify(tree, logits, SAMPLE, g).tokens[0]] += 1
    assert pvalue(counts, P) > 1e-3


def test_always_accept_mutant_fails(monkeypatch):
    monkeypatch.setattr(V, "accepts", lambda p_x, q_x, u: True)
    assert pvalue(first_tokens(P, CASES["q skewed"], 1), P) < 1e-6


def test_a_residual_that_forgets_q_fails(monkeypatch):
    """After a rejection the token comes from norm(max(0, p - q)); drawing it from p over-weights what q proposes.
    (An unnormalised residual is no fault: the draw scales its uniform by the distribution's total.)"""
    monkeypatch.setattr(V, "residual", lambda p, q: p)
    for children in (1, 3):
        assert pvalue(first_tokens(P, CASES["q skewed"], children), P) < 1e-6


# -- hand-built trees, greedy -----------------------------------------------------------------------
def onehot_logits(targets, vocab=10):
    """Logits whose argmax at node i is targets[i]."""
    logits = torch.zeros(len(targets), vocab)
    logits[torch.arange(len(targets)), torch.tensor(targets)] = 5.0
    return logits


def test_greedy_single_path_fully_accepted_gives_bonus():
    tree = TokenTree.chain(1, [2, 3, 4])
    v = V.verify(tree, onehot_logits([2, 3, 4, 7]), GREEDY)
    assert v.path == [0, 1, 2, 3] and v.tokens == [2, 3, 4, 7] and v.accepted == 3


def test_greedy_rejects_at_first_mismatch():
    tree = TokenTree.chain(1, [2, 3, 4])
    v = V.verify(tree, onehot_logits([2, 9, 4, 7]), GREEDY)
    assert v.path == [0, 1] and v.tokens == [2, 9] and v.next_token == 9


def test_greedy_follows_the_right_branch_with_duplicate_siblings():
    #       root
    #     /  |   \
    #    2   5    2(dup)
    #    |        |
    #    3        6
    tree = TokenTree.root(1)
    a, _, c = tree.add(2, 0), tree.add(5, 0), tree.add(2, 0)
    d = tree.add(3, a)
    tree.add(6, c)
    # argmax: root->2, node a->3, node 3->8 ; duplicate branch never reached
    v = V.verify(tree, onehot_logits([2, 3, 0, 0, 8, 0]), GREEDY)
    assert v.tokens == [2, 3, 8] and v.path == [0, a, d]


def test_deep_chain_and_empty_tree():
    tree = TokenTree.chain(0, list(range(1, 9)))
    v = V.verify(tree, onehot_logits(list(range(1, 10)), vocab=12), GREEDY)
    assert v.accepted == 8 and v.tokens[-1] == 9
    v = V.verify(TokenTree.root(4), onehot_logits([6]), GREEDY)
    assert v.tokens == [6] and v.accepted == 0


def test_from_paths_merges_shared_prefixes_in_bfs_order():
    tree = TokenTree.from_paths(0, [[1, 2, 3], [1, 2, 4], [5], [1, 6]])
    assert tree.tokens == [0, 1, 5, 2, 6, 3, 4]
    assert all(p < i for i, p in enumerate(tree.parents))
    mask = tree.ancestor_mask()
    assert mask[5].nonzero().flatten().tolist() == [0, 1, 3, 5]
    assert tree.depths == [0, 1, 1, 2, 2, 3, 3]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_argmax_is_the_first_maximum_in_every_dtype(dtype):
    from specmesh.lossless.sampling import argmax
    logits = torch.randn(9, 513).to(dtype)
    logits[:, 7] = logits[:, 400] = logits.max() + 1      # a tie: the first one wins, as torch's argmax
    logits[3, 2] = logits.max() + 2
    assert argmax(logits).tolist() == [7, 7, 7, 2, 7, 7, 7, 7, 7]
    assert torch.equal(argmax(logits), logits.float().argmax(-1))

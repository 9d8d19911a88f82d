"""The draft's top-k tree (proposers/draft_model.py): each level keeps the `width` best children by path
probability and, with `min_prob`, only those at least that likely, as many in every row; a level with none
ends the tree. Losslessness with these trees is tested in tests/methods/test_speculative.py."""
import math
from types import SimpleNamespace

import pytest
import torch

from specmesh import LLM, SamplingParams
from specmesh.lossless.token_tree import TokenTree
from specmesh.proposers.draft_model import DraftModel


def level_logits(*rows: list[float], vocab: int) -> torch.Tensor:
    """Logits [B, 1, V] whose softmax puts the given probabilities on tokens 1, 2, ... (the rest spread evenly)."""
    out = []
    for probs in rows:
        rest = (1 - sum(probs)) / (vocab - len(probs))
        p = torch.full((vocab,), rest)
        p[1:1 + len(probs)] = torch.tensor(probs)
        out.append(p.log())
    return torch.stack(out)[:, None]


@pytest.fixture(scope="module")
def draft(tiny_draft_checkpoint):
    return LLM(target=tiny_draft_checkpoint).models.target


def grow(draft, min_prob: float, *rows: list[float]) -> tuple[list[int], list[TokenTree]]:
    model = DraftModel(draft, len(rows), 64, 16, width=3, max_children=2, min_prob=min_prob)
    seqs = [SimpleNamespace(penalty=None, params=SamplingParams(max_new_tokens=4)) for _ in rows]   # greedy
    trees = [TokenTree.root(6) for _ in rows]
    level = model._grow(seqs, trees, [0], level_logits(*rows, vocab=draft.config.vocab_size), [True] * len(rows))
    return level, trees


def test_a_level_keeps_the_children_likely_enough_as_many_in_every_row(draft):
    # row 0's children: 0.6 and 0.35; row 1's: 0.9 and 0.05
    level, trees = grow(draft, 0.0, [0.6, 0.35], [0.9, 0.05])
    assert level == [1, 2] and [t.tokens for t in trees] == [[6, 1, 2], [6, 1, 2]]     # top-2 of a root
    level, trees = grow(draft, 0.3, [0.6, 0.35], [0.9, 0.05])
    assert level == [1, 2] and len(trees[1]) == 3           # row 0 passes two: row 1 keeps two as well
    level, trees = grow(draft, 0.7, [0.6, 0.35], [0.9, 0.05])
    assert level == [1] and [t.tokens for t in trees] == [[6, 1], [6, 1]]
    assert trees[1].logp[1] == pytest.approx(math.log(0.9), abs=1e-5)
    level, trees = grow(draft, 0.95, [0.6, 0.35], [0.9, 0.05])
    assert level == [] and all(len(t) == 1 for t in trees)  # none likely enough: the tree ends at its root


def test_min_prob_drafts_less_where_the_draft_is_unsure_and_stays_lossless(tiny_checkpoint, tiny_draft_checkpoint):
    ar = LLM(target=tiny_checkpoint)
    params = SamplingParams(max_new_tokens=30)
    prompt = "def add(a, b):"
    runs = {p: LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="tree", gamma=3, tree_width=3,
                   max_children=2, min_prob=p).generate(prompt, params) for p in (0.0, 0.2, 0.99)}
    assert all(r.tokens == ar.generate(prompt, params).tokens for r in runs.values())
    drafted = [runs[p].stats.drafted_tokens for p in (0.0, 0.2, 0.99)]
    assert drafted[0] > drafted[1] > drafted[2]             # a random draft's paths are unlikely
    # at most the root's read a step (a lone row reads its prompt window in it too), no level
    assert runs[0.99].stats.draft_forwards <= runs[0.99].stats.verifications

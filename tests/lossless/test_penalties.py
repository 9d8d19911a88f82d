"""Penalty.apply against the formulas computed token by token, and at every node of a tree."""
import pytest
import torch

from specmesh.lossless.penalties import Penalty
from specmesh.lossless.sampling import InvalidParameter, SamplingParams
from specmesh.lossless.token_tree import TokenTree

V = 12
PARAMS = dict(frequency_penalty=0.5, presence_penalty=0.25, repetition_penalty=1.5, logit_bias={3: 2.0, 7: -1.0})


def direct(logits: torch.Tensor, prompt: list[int], generated: list[int], p: SamplingParams) -> torch.Tensor:
    """The formulas of lossless/penalties.py, one token at a time."""
    z = logits.clone()
    for t in range(V):
        if t in prompt or t in generated:
            z[t] = z[t] / p.repetition_penalty if z[t] > 0 else z[t] * p.repetition_penalty
        z[t] -= p.frequency_penalty * generated.count(t) + p.presence_penalty * (t in generated)
        z[t] += p.logit_bias.get(t, 0.0)
    return z


def test_apply_after_the_generated_tokens():
    p = SamplingParams(**PARAMS)
    prompt, generated = [1, 2, 3], [4, 4, 5]
    logits = torch.randn(1, V)
    penalty = Penalty(p, prompt, generated)
    torch.testing.assert_close(penalty.apply(logits)[0], direct(logits[0], prompt, generated, p))
    generated.append(4)                                     # the list grows in place: counts follow
    torch.testing.assert_close(penalty.apply(logits)[0], direct(logits[0], prompt, generated, p))


def test_each_tree_node_counts_its_own_path():
    p = SamplingParams(**PARAMS)
    prompt, generated = [1, 2], [6, 9]
    tree = TokenTree.root(9)                                # the newest generated token
    a = tree.add(4, 0)
    b = tree.add(9, 0)
    tree.add(4, a)
    tree.add(11, b)
    logits = torch.randn(len(tree), V)
    got = Penalty(p, prompt, generated).apply(logits, tree)
    for node in range(len(tree)):
        path = [tree.tokens[i] for i in tree.path_to(node)[1:]]
        torch.testing.assert_close(got[node], direct(logits[node], prompt, generated + path, p))
    some = Penalty(p, prompt, generated).apply(logits[[2, 3]], tree, nodes=[2, 3])   # rows of given nodes
    torch.testing.assert_close(some, got[[2, 3]])


@pytest.mark.parametrize("field, value", [("frequency_penalty", 2.5), ("presence_penalty", -3),
                                          ("repetition_penalty", 0), ("repetition_penalty", "1"), ("logit_bias", {"3": 1.0}),
                                          ("logit_bias", {3: 101}), ("logit_bias", {-1: 1.0}), ("logit_bias", [1])])
def test_bad_values_name_their_field(field, value):
    with pytest.raises(InvalidParameter) as e:
        SamplingParams(**{field: value})
    assert e.value.param == field


def test_penalties_lists_the_fields_that_change_the_logits():
    assert SamplingParams().penalties == []
    assert SamplingParams(presence_penalty=0.1, logit_bias={1: 0.5}).penalties == ["presence_penalty", "logit_bias"]


def test_a_list_cut_and_grown_again_is_recounted():
    """The draft rank drops rejected drafts from its chain, then drafts on."""
    p = SamplingParams(frequency_penalty=1.0)
    generated = [1, 2, 3]
    penalty = Penalty(p, [0], generated)
    logits = torch.zeros(1, V)
    penalty.apply(logits)
    del generated[1:]
    generated += [4, 5, 6]
    torch.testing.assert_close(penalty.apply(logits)[0], direct(logits[0], [0], generated, p))

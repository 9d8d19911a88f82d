"""PipeDec's dynamic prediction tree (§3.3) on hand-worked examples of its equations."""
import math

import numpy as np
import torch

from specmesh.proposers.dynamic_tree import DynamicTree

# root 7; layer 2 from c = 2 candidates of the root; layer 3 from c = 2 candidates of each
Q1, Y1 = torch.tensor([[0.6, 0.3]]), torch.tensor([[11, 12]])
Q2, Y2 = torch.tensor([[0.5, 0.4], [0.9, 0.05]]), torch.tensor([[21, 22], [23, 24]])


def grown() -> DynamicTree:
    tree = DynamicTree(7)
    tree.grow(Q1, Y1, width=3)
    tree.grow(Q2, Y2, width=3)
    return tree


def test_initialization():
    tree = DynamicTree(42)
    assert tree.X.tolist() == [42] and tree.P.tolist() == [1.0] and tree.C.tolist() == [0]
    assert tree.M.tolist() == [[True]] and tree.layers == [1]


def test_layer_update_keeps_the_top_w_by_cumulative_probability():
    tree = grown()
    # B^(3) = log Q2 + B(layer 2): 0.6*0.5 = .30, 0.6*0.4 = .24, 0.3*0.9 = .27, 0.3*0.05 = .015 -> keep
    # .30, .24, .27 (w = 3), in BFS order: 21, 22 (children of 11), 23 (child of 12)
    assert tree.X.tolist() == [7, 11, 12, 21, 22, 23]
    assert np.allclose(tree.P, [1.0, 0.6, 0.3, 0.5, 0.4, 0.9])
    assert tree.C.tolist() == [2, 2, 1, 0, 0, 0] and tree.layers == [1, 2, 3]
    assert np.allclose(np.exp(tree.cumulative()), [1.0, 0.6, 0.3, 0.30, 0.24, 0.27])


def test_mask_growth_by_blocks():
    M = grown().M.astype(int).tolist()
    assert M == [[1, 0, 0, 0, 0, 0],
                 [1, 1, 0, 0, 0, 0],
                 [1, 0, 1, 0, 0, 0],
                 [1, 1, 0, 1, 0, 0],      # bottom-left: row of 11 repeated C = 2 times, then I
                 [1, 1, 0, 0, 1, 0],
                 [1, 0, 1, 0, 0, 1]]      # row of 12 repeated once


def test_width_larger_than_the_candidates_keeps_them_all():
    tree = DynamicTree(7)
    tree.grow(Q1, Y1, width=32)
    assert tree.layers == [1, 2] and tree.C.tolist() == [2, 0, 0]


def test_prune_on_hit_keeps_the_subtree_with_M_h():
    tree = grown()
    assert tree.hit(11) == 0 and tree.hit(12) == 1 and tree.hit(21) == -1     # only the second layer counts
    keep = tree.prune(tree.hit(11))
    assert keep.tolist() == [False, True, False, True, True, False]            # M[:, 1]
    assert tree.X.tolist() == [11, 21, 22] and tree.layers == [1, 2] and tree.C.tolist() == [2, 0, 0]
    assert np.allclose(tree.P, [1.0, 0.5, 0.4])                                # the new root is certain
    assert tree.M.astype(int).tolist() == [[1, 0, 0], [1, 1, 0], [1, 0, 1]]   # M_h M M_h^T
    assert math.isclose(float(np.exp(tree.cumulative()[1])), 0.5, rel_tol=1e-6)
    tree.grow(torch.tensor([[0.7], [0.2]]), torch.tensor([[31], [32]]), width=1)   # growth goes on from there
    assert tree.X.tolist() == [11, 21, 22, 31] and tree.C.tolist() == [2, 1, 0, 0]


def test_reset_on_miss_starts_from_the_emitted_token():
    tree = grown()
    assert tree.hit(99) == -1
    tree = DynamicTree(99)
    assert tree.X.tolist() == [99] and tree.layers == [1]


def test_token_tree_view_has_the_same_ancestor_mask():
    tree = grown()
    tokens = tree.to_token_tree()
    assert tokens.tokens == tree.X.tolist() and tokens.parents == [-1, 0, 0, 1, 1, 2]
    assert torch.equal(tokens.ancestor_mask(), torch.from_numpy(tree.M))

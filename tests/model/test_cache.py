"""Tree attention over the KV cache: commit, prune, rollback, batched rows."""
import random

import pytest
import torch

from specmesh.model.cache import ContextOverflowError, KVCache
from specmesh.model.execution import Batch


def random_tree(n: int, vocab: int, seed: int):
    """BFS-ordered random tree: tokens [n], parents [n] (-1 = child of the committed prefix)."""
    rng = random.Random(seed)
    parents = [-1]
    for i in range(1, n):
        parents.append(rng.randrange(-1, i))
    parents.sort()
    tokens = [rng.randrange(vocab) for _ in range(n)]
    return tokens, parents


def paths_of(parents):
    def path(i):
        out = []
        while i >= 0:
            out.append(i)
            i = parents[i]
        return out[::-1]
    return [path(i) for i in range(len(parents))]


def tree_inputs(parents):
    paths = paths_of(parents)
    n = len(parents)
    mask = torch.zeros(n, n, dtype=torch.bool)
    for i, p in enumerate(paths):
        mask[i, p] = True
    depths = torch.tensor([len(p) - 1 for p in paths])
    return mask, depths, paths


def prefill(model, ids, max_len=64):
    cache = KVCache.for_model(model, 1, max_len)
    logits = model(torch.tensor([ids]), cache)
    cache.commit_all()
    return cache, logits


@pytest.mark.parametrize("seed", range(4))
@torch.no_grad()
def test_tree_forward_matches_path_forward_and_commit_equals_prefill(tiny_model, seed):
    prefix = [5, 17, 3, 44, 9, 60, 2]
    tokens, parents = random_tree(12, 97, seed)
    mask, depths, paths = tree_inputs(parents)
    cache, _ = prefill(tiny_model, prefix)
    tree_logits = tiny_model(torch.tensor([tokens]), cache, Batch(depths, mask))[0]
    for i, path in enumerate(paths):
        plain = tiny_model(torch.tensor([prefix + [tokens[j] for j in path]]))[0, -1]
        assert (tree_logits[i] - plain).abs().max() <= 1e-5, f"node {i}"
    leaf = max(range(len(paths)), key=lambda i: len(paths[i]))
    cache.commit(0, paths[leaf])
    fresh, _ = prefill(tiny_model, prefix + [tokens[j] for j in paths[leaf]])
    L = fresh.lengths[0]
    assert cache.lengths == [L] and cache.spec == [0]
    for a, b in zip(cache.k + cache.v, fresh.k + fresh.v):
        assert (a[:, :, :L] - b[:, :, :L]).abs().max() <= 1e-5


@torch.no_grad()
def test_commit_with_keep_then_grow_the_kept_subtree(tiny_model):
    """PipeDec's pattern: commit the root, keep its subtree speculative, add a layer."""
    prefix = [1, 2, 3, 4]
    cache, _ = prefill(tiny_model, prefix)
    # tree: 0:a  1:b(parent 0)  2:c(parent 0)  3:d(-1, a sibling of a)
    tiny_model(torch.tensor([[10, 11, 12, 13]]), cache, Batch(depths=torch.tensor([0, 1, 1, 0]),
               tree_mask=torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], dtype=torch.bool)))
    cache.commit(0, [0], keep=[1, 2])            # a accepted; b, c stay speculative at depth 0
    assert cache.lengths == [5] and cache.spec == [2]
    # a child of c (speculative slot 1), depth 1 below the new prefix
    out = tiny_model(torch.tensor([[20]]), cache, Batch(depths=torch.tensor([1]),
                     tree_mask=torch.tensor([[0, 1, 1]], dtype=torch.bool)))[0, -1]
    plain = tiny_model(torch.tensor([prefix + [10, 12, 20]]))[0, -1]
    assert (out - plain).abs().max() <= 1e-5


@torch.no_grad()
def test_rollback_and_batched_rows_of_different_lengths(tiny_model):
    a, b = [3, 4, 5, 6, 7, 8], [9, 10, 11]
    cache = KVCache.for_model(tiny_model, 2, 32)
    for row, ids in enumerate((a, b)):          # prefill each row alone, then decode both together
        single, _ = prefill(tiny_model, ids, max_len=32)
        for layer in range(len(cache.k)):
            cache.k[layer][row] = single.k[layer][0]
            cache.v[layer][row] = single.v[layer][0]
        cache.lengths[row] = len(ids)
    out = tiny_model(torch.tensor([[20, 21], [22, 23]]), cache)
    assert (out[0, 1] - tiny_model(torch.tensor([a + [20, 21]]))[0, -1]).abs().max() <= 1e-5
    assert (out[1, 1] - tiny_model(torch.tensor([b + [22, 23]]))[0, -1]).abs().max() <= 1e-5
    cache.rollback(1, len(b) + 1)                # keep the first drafted token of row 1 only
    cache.commit_all(0)
    out = tiny_model(torch.tensor([[30], [31]]), cache)
    assert (out[0, 0] - tiny_model(torch.tensor([a + [20, 21, 30]]))[0, -1]).abs().max() <= 1e-5
    assert (out[1, 0] - tiny_model(torch.tensor([b + [22, 31]]))[0, -1]).abs().max() <= 1e-5


def test_overflow_and_bad_indices(tiny_model):
    cache = KVCache.for_model(tiny_model, 1, 8)
    with pytest.raises(ContextOverflowError):
        tiny_model(torch.zeros(1, 9, dtype=torch.long), cache)
    with pytest.raises(IndexError):
        cache.commit(0, [0])


def test_a_cpu_cache_costs_memory_only_where_it_is_written():
    """A server sizes its cache for full contexts (GBs for a real model); allocating it writes nothing, and a
    row written costs that row's pages."""
    from conftest import rss_mb
    before = rss_mb()
    cache = KVCache(num_layers=4, batch=16, max_len=8192, num_kv_heads=4, head_dim=64, dtype=torch.float32,
                    device="cpu")                                     # 2 GiB of keys and values
    assert rss_mb() - before < 64
    assert not cache.k[3][15].any() and not cache.v[0][0].any()         # zeros, as torch.zeros gave
    cache.k[0][0].fill_(1.0)                                           # one row of one layer: 8 MiB
    assert 8 <= rss_mb() - before < 72 and cache.k[0][0].dtype == torch.float32


def test_stacked_layers_are_views_of_one_tensor_and_behave_as_apart():
    """Layers stacked for a layer-parallel group live in one [B, g*Hkv, L, hd] tensor, layer-major, each layer's
    cache a view of its heads; writing the group at once, committing, moving rows and taking row views give
    what a cache with the layers apart gives."""
    torch.manual_seed(0)
    caches = [KVCache(3, 2, 16, 2, 4, torch.float32, "cpu", stacked=stacked) for stacked in ([range(1, 3)], [])]
    stacked, apart = caches
    k_stack, _ = stacked.stacks[range(1, 3)]
    assert k_stack.shape == (2, 4, 16, 4) and stacked.k[2].data_ptr() == k_stack[:, 2:].data_ptr()
    for step in range(3):
        k, v = torch.randn(2, 4, 2, 4), torch.randn(2, 4, 2, 4)         # layers 1 and 2, 2 heads each
        for cache in caches:
            cache.slots(2)
            cache.write(0, k[:, :2], v[:, :2])
            got = cache.write_group(range(1, 3), k, v)
            assert got[0].shape == (2, 4, cache.kv_len, 4)
            cache.advance(2)
            cache.commit(0, [1]) if step else cache.commit_all()
        assert all(torch.equal(a, b) for a, b in zip(stacked.k + stacked.v, apart.k + apart.v))
    for cache in caches:
        cache.move_row(0, 1)
        cache.view(1, 2).rollback(0, 2)
    assert all(torch.equal(a, b) for a, b in zip(stacked.k + stacked.v, apart.k + apart.v))
    assert stacked.lengths.tolist() == apart.lengths.tolist() == [4, 2]
    assert torch.equal(stacked.view(1, 2).stacks[range(1, 3)][0], k_stack[1:])

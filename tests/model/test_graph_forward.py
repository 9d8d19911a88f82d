"""model/graph_forward.py's static forward, run eagerly on the CPU (capture=False: what a CUDA graph of it
replays): the same logits as the model's own path for a first prefill, a decoding step, a chain after held
speculative slots and a tree, rows of different lengths in one batch; every method given it stays lossless; and the
forwards it does not take are left to the model's own path."""
from dataclasses import replace

import pytest
import torch

from specmesh import LLM, SamplingParams
from specmesh.bench.prompts import load_prompts
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.graph_forward import GraphForward


def with_static(model):
    """model with the static forward as its fast_forward (its own, e.g. the C forward, set aside)."""
    model.run_on(replace(model.execution, fast=GraphForward(model, capture=False)))
    return model


@pytest.fixture(scope="module")
def pair():
    llm = LLM(target="embedded", method="ar", dtype="float32")
    model = llm.models.target
    own = replace(model.execution)
    model.run_on(replace(own, fast=None))
    return model, own


def test_the_static_forward_gives_the_models_own_logits(pair):
    model, own = pair
    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    steps = [(ids[:, :6], Batch()), (ids[:, 6:7], Batch()), (ids[:, 7:9], Batch()),       # prefill, step, chain
             (ids[:, 9:12], Batch(last_only=True)),                                        # after 2 held slots
             (ids[:, 8:12], Batch(depths=torch.tensor([0, 1, 1, 2]), tree_mask=tree))]     # a tree, none held
    results = []
    for fast in (None, GraphForward(model, capture=False)):
        model.run_on(replace(own, fast=fast))
        cache = KVCache.for_model(model, 2, 64)
        out = []
        for i, (x, batch) in enumerate(steps):
            with torch.no_grad():
                out.append(model(x, cache, batch))
            if i == 1:
                cache.commit_all()
                cache.rollback(1, 5)                    # rows of different lengths from here on
            if i == 3:
                cache.commit_all()
        results.append(out)
    model.run_on(replace(own, fast=None))
    for a, b in zip(*results):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()


@pytest.mark.parametrize("method", ["sd", "tree", "selfdraft"])
def test_every_method_given_the_static_forward_gives_ars_tokens(method):
    prompts, params = load_prompts(limit=3), SamplingParams(max_new_tokens=32)
    ar = [out.tokens for out in LLM(target="embedded", method="ar", dtype="float32").generate(prompts, params)]
    llm = LLM(target="embedded", method=method, dtype="float32")
    for model in (llm.models.target, llm.models.draft):
        if model is not None:
            with_static(model)
    assert [out.tokens for out in llm.generate(prompts, params)] == ar
    assert [llm.generate(p, params).tokens for p in prompts] == ar


def test_forwards_it_does_not_take_are_left_to_the_model(pair):
    model, _ = pair
    fast = GraphForward(model, capture=False)
    cache = KVCache.for_model(model, 1, 128)
    assert fast(torch.zeros(1, 65, dtype=torch.int64), cache, Batch()) is None          # a prefill
    assert fast(torch.zeros(1, 4, dtype=torch.int64), None, Batch()) is None           # no cache
    assert fast(torch.zeros(1, 4, dtype=torch.int64), cache, Batch(layers=range(2))) is None
    assert cache.lengths[0] == 0 and cache.spec[0] == 0                                  # nothing claimed

"""model/graph_forward.py's static forward, run eagerly on the CPU (capture=False: what a CUDA graph of it
replays): the same logits as the model's own path for a first prefill, a decoding step, a chain after held
speculative slots and a tree, rows of different lengths in one batch, Gemma 3's sliding layers past their window
too; every method given it stays lossless; and the forwards it does not take are left to the model's own path."""
from dataclasses import replace

import pytest
import torch

from conftest import tiny_config
from specmesh import LLM, SamplingParams
from specmesh.bench.prompts import load_prompts
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.graph_forward import GraphForward
from specmesh.model.model import Transformer


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


def same_logits(model, own) -> None:
    """The model's logits through its own path and through the static forward agree, step by step."""
    ids = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    tree = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
    steps = [(ids[:, :10], Batch()), (ids[:, 10:11], Batch()), (ids[:, 11:13], Batch()),   # prefill, step, chain
             (ids[:, 13:16], Batch(last_only=True)),                                       # after 2 held slots
             (ids[:, 12:16], Batch(depths=torch.tensor([0, 1, 1, 2]), tree_mask=tree))]    # a tree, none held
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
                cache.rollback(1, 9)                    # rows of different lengths from here on
            if i == 3:
                cache.commit_all()
        results.append(out)
    model.run_on(replace(own, fast=None))
    for a, b in zip(*results):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-4, rtol=1e-4), (a - b).abs().max()


def test_the_static_forward_gives_the_models_own_logits(pair):
    same_logits(*pair)


def test_the_static_forward_gives_gemma_3s_sliding_layers_their_window():
    cfg = tiny_config(model_type="gemma3_text", qk_norm=True, norm_offset=True, post_norms=True,
                      hidden_act="gelu_pytorch_tanh", scale_embeddings=True, query_pre_attn_scalar=16,
                      sliding_window=6, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                      rope_theta=1e6, rope_local_theta=1e4)
    torch.manual_seed(0)
    model = Transformer(cfg).eval()
    same_logits(model, replace(model.execution))


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

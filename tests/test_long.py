"""Long and GPU runs, deselected by the default test command:
    python -m pytest -m "slow or cuda"
"""
import pytest
import torch

from specmesh import LLM, SamplingParams
from specmesh.bench.prompts import load_prompts


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sd", "tree"])
def test_greedy_equals_ar_on_twenty_shipped_prompts(method):
    ar, spec = LLM(method="ar"), LLM(method=method)
    for prompt in load_prompts(limit=20):
        params = SamplingParams(max_new_tokens=128)
        assert spec.generate(prompt, params).tokens == ar.generate(prompt, params).tokens, prompt[-80:]


def need_cuda() -> None:
    if not torch.cuda.is_available():
        pytest.fail("this test needs a CUDA GPU (torch.cuda.is_available() is False)")


@pytest.mark.cuda
@pytest.mark.parametrize("method", ["ar", "sd", "tree"])
def test_cuda_greedy_equals_cpu(method):
    need_cuda()
    prompt = load_prompts(limit=1)[0]
    params = SamplingParams(max_new_tokens=48)
    cpu = LLM(method=method).generate(prompt, params).tokens
    assert LLM(method=method, device="cuda").generate(prompt, params).tokens == cpu


@pytest.mark.cuda
@pytest.mark.parametrize("method", ["sd", "tree", "easyspec", "selfdraft", "pearl", "cosine"])
def test_cuda_greedy_equals_ar_on_cuda(method):
    """Lossless on the GPU itself: every method's float32 greedy output equals `ar`'s there, one prompt at a
    time and as one batch (the server's path)."""
    need_cuda()
    prompts, params = load_prompts(limit=4), SamplingParams(max_new_tokens=64)
    ar = [out.tokens for out in LLM(method="ar", device="cuda").generate(prompts, params)]
    with LLM(method=method, device="cuda") as llm:
        assert [llm.generate(p, params).tokens for p in prompts] == ar
        assert [out.tokens for out in llm.generate(prompts, params)] == ar


@pytest.mark.cuda
def test_cuda_graph_replays_give_the_static_forwards_logits_and_a_new_shape_is_captured():
    """model/graph_forward.py on CUDA: replays of captured graphs equal the same static forward run eagerly, for
    a prefill, a decoding step, a chain and a tree (the chain's shape: one graph), and a shape first seen after
    others is captured and replayed too."""
    from dataclasses import replace
    from specmesh.model.cache import KVCache
    from specmesh.model.execution import Batch
    from specmesh.model.graph_forward import GraphForward
    need_cuda()
    model = LLM(target="embedded", method="ar", device="cuda").models.target
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0)).cuda()
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool, device="cuda")
    steps = [(ids[:, :8], Batch()), (ids[:, 8:9], Batch()), (ids[:, 9:10], Batch()), (ids[:, 10:13], Batch()),
             (ids[:, 13:16], Batch(depths=torch.tensor([0, 1, 1]), tree_mask=tree)), (ids[:, 9:11], Batch())]
    results, graphs = [], GraphForward(model)
    for fast in (GraphForward(model, capture=False), graphs):
        model.run_on(replace(model.execution, fast=fast))
        cache, out = KVCache.for_model(model, 2, 64), []
        for i, (x, batch) in enumerate(steps):
            with torch.no_grad():
                out.append(model(x, cache, batch))
            if i == 4:                          # the tree's slots dropped
                for row in range(2):
                    cache.rollback(row, 13)
            else:
                cache.commit_all()
        results.append(out)
    assert all(s.graph is not None for s in graphs.shapes.values()) and len(graphs.shapes) == 4
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.cuda
@pytest.mark.parametrize("method", ["sd", "tree", "selfdraft"])
def test_cuda_graphs_keep_every_method_lossless(method, monkeypatch):
    """With SPECMESH_KERNELS=cuda-graphs (model/kernel_choice.py) every forward of up to 64 new tokens replays a graph:
    float32 greedy output still equals `ar`'s (itself on graphs), one prompt at a time and as one batch (the
    embedded pair: it travels with the tree)."""
    need_cuda()
    monkeypatch.setenv("SPECMESH_KERNELS", "cuda-graphs")
    prompts, params = load_prompts(limit=4), SamplingParams(max_new_tokens=64)
    ar = [out.tokens for out in LLM(target="embedded", method="ar", device="cuda").generate(prompts, params)]
    with LLM(target="embedded", method=method, device="cuda") as llm:
        assert [llm.generate(p, params).tokens for p in prompts] == ar
        assert [out.tokens for out in llm.generate(prompts, params)] == ar

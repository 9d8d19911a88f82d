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

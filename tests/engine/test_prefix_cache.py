"""The server's prefix cache (serve/prefix_cache.py): a prompt read partly from the cache gives the
same bits as one prefill of the whole prompt; the pool evicts the least recently used blocks."""
import threading

import pytest
import torch
from torch import nn

from specmesh import kernels
from specmesh.engine.prefix_cache import BLOCK, MIN_REST, PrefixCache, unsupported
from specmesh.model import kernel_choice
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.model import Transformer


def tile_model(seed: int = 3) -> Transformer:
    from conftest import tiny_config
    torch.manual_seed(seed)
    model = Transformer(tiny_config(head_dim=64, max_position_embeddings=512)).eval()
    for p in model.parameters():
        nn.init.normal_(p, std=0.2)
    return kernel_choice.use_c_kernels(model.bfloat16())


def exact_prefills_here() -> bool:
    """Whether this CPU runs a bf16 prefill row by row in C: on AMX tiles, or with the C attention of a decoding
    step (AVX2's or AVX-512's): on every x86 CPU with AVX2 where gcc builds the kernels (AMX's included)."""
    return kernels.kernel_lib() is not None


def test_a_cached_prefix_gives_the_bits_of_a_whole_prefill():
    model = tile_model()
    if not exact_prefills_here():            # nothing to reuse exactly here
        assert unsupported(model) is not None
        return
    assert unsupported(model) is None
    pool = PrefixCache(model, budget_mb=4)
    cache = KVCache.for_model(model, 2, 512)
    torch.manual_seed(0)
    shared = torch.randint(1, 97, (150,)).tolist()                  # a prefix common to several prompts
    prompts = [shared + torch.randint(1, 97, (n,)).tolist() for n in (0, 1, 30, 81, 200)]
    reused = 0
    with torch.inference_mode():
        for prompt in prompts:
            whole, row = cache.view(0, 1), cache.view(1, 2)
            whole.rollback(0, 0)
            expected = model(torch.tensor([prompt]), whole, Batch(last_only=True))
            whole.commit_all()
            row.rollback(0, 0)
            cached = pool.load(prompt, cache, 1)
            assert cached % BLOCK == 0 and len(prompt) - cached >= MIN_REST
            reused += cached
            logits = model(torch.tensor([prompt[cached:]]), row, Batch(last_only=True))
            row.commit_all()
            assert torch.equal(logits, expected), (len(prompt), cached)
            n = len(prompt)
            for k in cache.k + cache.v:
                assert torch.equal(k[0, :, :n], k[1, :, :n]), (len(prompt), cached)
            pool.store(prompt, cache, 1)
    assert reused > 0                                                # the later prompts read the shared prefix


def test_the_pool_evicts_the_least_recently_used_blocks():
    model = tile_model()
    if not exact_prefills_here():
        assert unsupported(model) is not None
        return                              # nothing to run here: the cache is off
    per_block = 2 * model.config.num_layers * model.config.num_kv_heads * BLOCK * 64 * 2     # bytes
    pool = PrefixCache(model, budget_mb=12 * per_block / 2**20)                             # 12 blocks
    assert pool.blocks == 12
    cache = KVCache.for_model(model, 1, 512)
    torch.manual_seed(1)
    a, b, c = (torch.randint(1, 97, (6 * BLOCK,)).tolist() for _ in range(3))
    with torch.inference_mode():
        def serve(prompt) -> int:
            view = cache.view(0, 1)
            view.rollback(0, 0)
            cached = pool.load(prompt, cache, 0)
            model(torch.tensor([prompt[cached:]]), view, Batch(last_only=True))
            view.commit_all()
            pool.store(prompt, cache, 0)
            return cached
        assert serve(a) == 0 and serve(b) == 0                       # 12 blocks: full
        reusable = (6 * BLOCK - MIN_REST) // BLOCK * BLOCK
        assert serve(a) == reusable                                  # a is now the most recently used
        assert serve(c) == 0                                         # evicts b's blocks, not a's
        assert serve(a) == reusable and serve(b) == 0
        long = torch.randint(1, 97, (20 * BLOCK,)).tolist()          # more blocks than the pool holds
        assert serve(long) == 0 and serve(long) == 12 * BLOCK


def test_the_server_reads_cached_prompts_and_answers_the_same():
    """Through the engine: a prompt served again, and one that shares its beginning, read their
    prefix from the cache and get the tokens they get without one (the embedded target, bf16)."""
    from specmesh.bench.prompts import load_prompts
    from specmesh.lossless.sampling import SamplingParams
    from specmesh.serve import ServeConfig, build

    def answers(prefix_cache_mb):
        server, _ = build(ServeConfig(prefix_cache_mb=prefix_cache_mb, dtype="bfloat16"))
        engine = server.engine.start()
        tokenizer = engine.tokenizer
        base = tokenizer.encode(load_prompts(None)[0])[:300]
        prompts = [base, base, base[:200] + base[-120:]]          # the same prompt again; one that shares 200 tokens
        out = []
        try:
            for prompt in prompts:
                done = threading.Event()
                [seq] = engine.sequences(prompt, SamplingParams(max_new_tokens=12, temperature=0))
                seq.emit = lambda event: event.finish_reason and done.set()
                engine.submit([seq])
                assert done.wait(60), "the engine did not answer"
                out.append(seq.tokens)
        finally:
            engine.stop()
        return out, engine.stats.cached_prompt_tokens, engine.runner.prefix_cache

    plain, none_cached, off = answers(0)
    assert off is None and none_cached == 0
    cached, reused, pool = answers(64)
    assert cached == plain
    if pool is None:                        # not exact here: off, and said so
        assert reused == 0 and not exact_prefills_here()
        return
    assert reused == (300 - MIN_REST) // BLOCK * BLOCK + 200 // BLOCK * BLOCK     # the repeat; the shared blocks


def test_a_negative_budget_is_refused():
    from specmesh.serve import ServeConfig, build
    with pytest.raises(ValueError, match="prefix-cache-mb"):
        build(ServeConfig(prefix_cache_mb=-1))

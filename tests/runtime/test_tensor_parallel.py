"""`--tp N`: the target split over N processes (model/shard.py, runtime/tensor_parallel.py)."""
import copy

import pytest
import torch
from conftest import assert_same_distribution, fail_rank_mid_stream, sampled_pairs

from specmesh import LLM, SamplingParams
from specmesh.bench.prompts import load_prompts
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.loader import load_model
from specmesh.model.shard import shard
from specmesh.runtime.link import PeerError

CODE = load_prompts(limit=6)            # held-out standard-library code


def test_the_shards_parts_add_up_to_the_whole_layer(tiny_model):
    """Each shard's attention and MLP give its part of the output: the parts sum to the unsplit layer's."""
    x = torch.randn(1, 5, tiny_model.config.hidden_size)
    cos, sin = tiny_model.rotary(torch.arange(5)[None], x.dtype)
    shards = [shard(copy.deepcopy(tiny_model), rank, 2) for rank in range(2)]
    for layer, block in enumerate(tiny_model.layers):
        parts = [s.layers[layer] for s in shards]
        attn = sum(p.attn(p.attn_norm(x), cos, sin, None, None) for p in parts)
        torch.testing.assert_close(attn, block.attn(block.attn_norm(x), cos, sin, None, None), rtol=1e-5, atol=1e-5)
        mlp = sum(p.mlp(p.mlp_norm(x)) for p in parts)
        torch.testing.assert_close(mlp, block.mlp(block.mlp_norm(x)), rtol=1e-5, atol=1e-5)
    assert shards[1].lm_head.out_features == 1 and shards[0].config.num_heads == 2


def test_tp_logits_equal_one_process(tiny_checkpoint):
    """float32: the same logits as one process up to rounding (the output projections sum over their inputs in
    two parts: about 1e-6 relative), over a prefill, decode steps and a tree."""
    one = load_model(tiny_checkpoint)
    with LLM(target=tiny_checkpoint, method="ar", tp=2) as llm:
        split = llm.models.target
        ids = torch.tensor([[5, 17, 33, 2, 90, 41, 8]])
        tree = Batch(depths=torch.tensor([0, 1, 1, 2]), tree_mask=torch.tensor(
            [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 1, 0, 1]], dtype=torch.bool))
        caches = [KVCache.for_model(m, 1, 64) for m in (one, split)]
        for step in (ids, ids[:, :1], ids[:, 2:3], (ids[:, 3:7], tree)):
            x, batch = step if isinstance(step, tuple) else (step, Batch())
            a, b = (m(x, c, batch) for m, c in zip((one, split), caches))
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-5)
            for c in caches:
                c.commit(0, list(range(x.shape[1]))[:1 if batch.depths is not None else None])


@pytest.fixture(scope="module")
def reference():
    with LLM(target="embedded", method="ar", dtype="bfloat16") as llm:
        yield llm.generate(CODE, SamplingParams(max_new_tokens=48))


@pytest.mark.parametrize("method", ["ar", "sd", "tree", "easyspec", "cosine"])
def test_greedy_under_tp2_equals_ar_in_one_process(reference, method):
    """Held-out code prompts, batched, on the embedded pair (bfloat16, its kernels): token for token."""
    with LLM(target="embedded", method=method, dtype="bfloat16", tp=2) as llm:
        out = llm.generate(CODE, SamplingParams(max_new_tokens=48))
    assert [o.samples[0].tokens for o in out] == [r.samples[0].tokens for r in reference]


def test_long_prompts_and_shared_prompts_under_tp(tiny_checkpoint, tiny_draft_checkpoint):
    """A prompt longer than a prefill chunk (staged, then copied into its row) and n samples sharing one
    prompt: every rank keeps and copies its own part of the keys and values."""
    prompt = "def add(a, b):\n    return a + b\n" * 10
    params = SamplingParams(max_new_tokens=24, temperature=0.9, seed=5, n=3)
    with LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd") as llm:
        want = llm.generate([prompt, "class Point:"], params)
    with LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", tp=2) as llm:
        assert len(llm.tokenizer.encode(prompt)) > 128
        got = llm.generate([prompt, "class Point:"], params)
    assert [[s.tokens for s in o.samples] for o in got] == [[s.tokens for s in o.samples] for o in want]


def test_sampling_under_tp2_draws_from_the_target(tiny_checkpoint, tiny_draft_checkpoint):
    with LLM(target=tiny_checkpoint, method="ar") as llm:
        want = sampled_pairs(llm, 1500, seed=1)
    with LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", tp=2) as llm:
        got = sampled_pairs(llm, 1500, seed=2)
    assert_same_distribution(want, got)


def test_a_killed_rank_fails_the_request_within_the_timeout_naming_it(tiny_checkpoint):
    llm = LLM(target=tiny_checkpoint, method="ar", tp=2, timeout=3)
    assert llm.models.remote.link.roles == ["tp0", "tp1"]
    fail_rank_mid_stream(llm, 1, "was killed by signal 9", max_new_tokens=200, within_s=5)
    with pytest.raises(PeerError):                  # the split target stays failed: no wrong logits later
        llm.generate("def", SamplingParams(max_new_tokens=2))
    llm.close()


def test_bad_tp_is_refused_before_any_process_starts(tiny_checkpoint, tiny_draft_checkpoint):
    with pytest.raises(ValueError, match="cannot split the model over 3 tensor-parallel ranks: 4 attention heads, "
                                         "2 kv heads do not divide by 3"):
        LLM(target=tiny_checkpoint, method="ar", tp=3)
    with pytest.raises(ValueError, match="--tp needs a method"):
        LLM(target=tiny_checkpoint, tp=2)
    with pytest.raises(ValueError, match="pearl runs its own processes"):
        LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="pearl", tp=2)
    with pytest.raises(ValueError, match="tp must be a positive integer"):
        LLM(target=tiny_checkpoint, method="ar", tp=0)


def test_the_cli_splits_the_target_with_tp_and_under_torchrun(tiny_checkpoint):
    """`--tp 2` launched by specmesh, and the same command as every rank of torchrun: ar's tokens."""
    import json
    import subprocess
    import sys
    args = ["generate", "def add(a, b):", "--target", tiny_checkpoint, "--max-new-tokens", "12", "--json", "-"]
    run = lambda *cmd: subprocess.run([*map(str, cmd)], capture_output=True, text=True, timeout=300)
    launched = run(sys.executable, "-m", "specmesh.cli", *args, "--method", "tree", "--draft", tiny_checkpoint, "--tp", "2")
    torchrun = run(sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "specmesh.cli", *args,
                   "--method", "sd", "--draft", tiny_checkpoint, "--tp", "2")
    for r in (launched, torchrun):
        assert r.returncode == 0, r.stderr
    tokens = LLM(target=tiny_checkpoint).generate("def add(a, b):", SamplingParams(max_new_tokens=12)).tokens
    assert json.loads(launched.stdout)["tokens"] == tokens and json.loads(torchrun.stdout)["tokens"] == tokens
    assert "rank 1 role tp1" in launched.stderr and "rank 1 role tp1" in torchrun.stderr


def test_easyspec_spreads_its_draft_groups_over_the_ranks(tiny_checkpoint):
    """Under --tp 2 easyspec's draft runs on both ranks: in the group of layers 1-2, rank 0 computes layer 1's
    attention and rank 1 layer 2's, and they exchange outputs, keys and values. Logits and the whole draft
    cache match one process's fuzzy forward (float32; the C group forward and PyTorch's round apart)."""
    one = load_model(tiny_checkpoint, draft=True)
    groups = [range(0, 1), range(1, 3)]
    with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", layer_groups="1,2", tp=2) as llm:
        spread = llm.models.draft
        assert spread.tp is not None and spread.tp.name == "draft"
        caches = [KVCache.for_model(m, 2, 64) for m in (one, spread)]
        for x in (torch.tensor([[5, 17, 33, 2], [90, 41, 8, 8]]), torch.tensor([[7], [9]])):
            a, b = (m(x, c, Batch(groups=groups)) for m, c in zip((one, spread), caches))
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
            for c in caches:
                c.commit_all()
        for k1, k2 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
            torch.testing.assert_close(k2[:, :, :5], k1[:, :, :5], rtol=1e-4, atol=1e-4)
        out = llm.generate(["def add(a, b):", "class Point:"],
                           SamplingParams(max_new_tokens=24))
    with LLM(target=tiny_checkpoint, method="ar") as ar:
        want = ar.generate(["def add(a, b):", "class Point:"], SamplingParams(max_new_tokens=24))
    assert [o.tokens for o in out] == [w.tokens for w in want]
    assert out[0].stats.mean_accepted_length > 1        # the draft (the target itself) is accepted: it drafted


def test_a_group_larger_than_the_ranks_is_shared_round_robin(tiny_checkpoint):
    """A group of 3 layers over 2 ranks: rank 0 computes layers 0 and 2's attentions, rank 1 layer 1's, all
    on the group's input: the same fuzzy forward as one process."""
    one = load_model(tiny_checkpoint, draft=True)
    with LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", layer_groups="3", tp=2) as llm:
        caches = [KVCache.for_model(m, 1, 32) for m in (one, llm.models.draft)]
        x = torch.tensor([[5, 17, 33, 2]])
        a, b = (m(x, c, Batch(groups=[range(0, 3)])) for m, c in zip((one, llm.models.draft), caches))
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        for k1, k2 in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v):
            torch.testing.assert_close(k2[:, :, :4], k1[:, :, :4], rtol=1e-4, atol=1e-4)

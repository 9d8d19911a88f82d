"""`easyspec`: layer-parallel (fuzzy) drafting and bonus calibration, lossless through the one verifier."""

import pytest
import torch
from conftest import assert_same_distribution, sampled_pairs

from specmesh import LLM, SamplingParams
from specmesh.model.cache import KVCache
from specmesh.model.execution import Batch
from specmesh.model.loader import load_model
from specmesh.model.model import group_attention
from specmesh.options import POLICIES
from specmesh.proposers.fuzzy_draft import default_groups, layer_groups

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n", "self.y = y\n\n" * 3]


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


def test_default_groups_keep_the_ends_exact_and_pair_the_middle():
    assert default_groups(4) == [1, 2, 1] and default_groups(3) == [1, 1, 1] and default_groups(1) == [1]
    assert default_groups(32) == [1] * 4 + [2] * 12 + [1] * 4 and default_groups(7) == [1, 2, 2, 1, 1]
    assert layer_groups("1,2", 3) == [range(0, 1), range(1, 3)]
    for bad in ("1,1", "0,3", "a,b", "2,-1,2"):
        with pytest.raises(ValueError, match="layer_groups"):
            layer_groups(bad, 3)


def test_bad_options_name_the_problem(tiny_checkpoint):
    """... when the LLM is made, as every other method option is (not at its first generate)."""
    with pytest.raises(ValueError, match="calibration must be one of never, prefill, round, mismatch"):
        LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", calibration="often")
    with pytest.raises(ValueError, match="adding up to the draft's 3 layers"):
        LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", layer_groups="2,2")


def forward(model, x, groups=None):
    cache = KVCache.for_model(model, 1, 32)
    return model(x, cache, Batch(groups=groups)), cache


@pytest.mark.parametrize("pack", [False, True])
def test_one_layer_groups_are_the_exact_forward_bit_for_bit(tiny_checkpoint, pack):
    model = load_model(tiny_checkpoint, pack=pack, draft=True)
    x = torch.tensor([[5, 17, 42, 7, 9]])
    (a, ca), (b, cb) = forward(model, x), forward(model, x, [range(i, i + 1) for i in range(3)])
    assert torch.equal(a, b) and all(torch.equal(k, l) for k, l in zip(ca.k + ca.v, cb.k + cb.v))


def test_a_two_layer_group_is_the_hand_computation(tiny_checkpoint):
    model = load_model(tiny_checkpoint, pack=False)
    x = torch.tensor([[5, 17, 42, 7, 9]])
    got, _ = forward(model, x, [range(0, 2), range(2, 3)])
    with torch.no_grad():
        h = model.embed(x)
        cos, sin = model.rotary(torch.arange(5)[None], h.dtype)
        l0, l1, l2 = model.layers
        a0 = l0.attn(l0.attn_norm(h), cos, sin, None, None)         # both attentions read the group's input h
        a1 = l1.attn(l1.attn_norm(h), cos, sin, None, None)
        h = h + a0
        h = h + l0.mlp(l0.mlp_norm(h))
        h = h + a1
        h = h + l1.mlp(l1.mlp_norm(h))
        h = l2(h, cos, sin, None, None)
        want = model.lm_head(model.norm(h))
    assert torch.allclose(got, want, atol=1e-5)
    assert not torch.allclose(got, forward(model, x)[0], atol=1e-3)          # and it is not the exact forward


def draft_cache_after_steps(tiny_checkpoint, calibration, steps=6):
    """Run easyspec (a 2+1 grouping, the target as its own draft) for `steps` steps; the draft cache's
    committed keys and values against an exact prefill of the tokens it committed."""
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", layer_groups="2,1",
              calibration=calibration, gamma=3, tree_width=1, max_children=1)
    ids = llm.encode(PROMPTS[0])
    engine = llm.engine_for(llm.method)
    seqs = engine.sequences(ids, SamplingParams(max_new_tokens=40))
    engine.submit(seqs)
    for _ in range(steps):
        engine.step()
    draft = engine.method.proposer
    L = int(draft.cache.lengths[0])
    got = [c[0, :, :L] for c in draft.cache.k + draft.cache.v]
    _, exact = forward_long(draft.model, (seqs[0].ids + seqs[0].tokens)[:L])
    return got, [c[0, :, :L] for c in exact.k + exact.v]


def forward_long(model, ids):
    cache = KVCache.for_model(model, 1, len(ids) + 1)
    return model(torch.tensor([ids]), cache), cache


def test_after_calibration_the_draft_cache_is_an_exact_prefill(tiny_checkpoint):
    got, want = draft_cache_after_steps(tiny_checkpoint, "round")
    assert all(torch.allclose(g, w, atol=1e-4) for g, w in zip(got, want))
    got, want = draft_cache_after_steps(tiny_checkpoint, "never")                # fuzzy entries stay: not exact
    assert not all(torch.allclose(g, w, atol=1e-4) for g, w in zip(got, want))


def grouping(kind: str, layers: int) -> str:
    """"": the default; "pair": the first two layers together; "all": one group of every layer."""
    return {"": "", "pair": ",".join(["2"] + ["1"] * (layers - 2)), "all": str(layers)}[kind]


@pytest.mark.parametrize("calibration, groups", [(c, "pair") for c in POLICIES] + [("mismatch", "all"),
                                                                                 ("round", "")])
@pytest.mark.parametrize("shape", ["chain", "tree"])
def test_greedy_equals_ar(ar, tiny_checkpoint, tiny_draft_checkpoint, calibration, groups, shape):
    tree = {"tree_width": 1, "max_children": 1} if shape == "chain" else {"tree_width": 3, "max_children": 2}
    params = SamplingParams(max_new_tokens=30)
    for draft in (tiny_checkpoint, tiny_draft_checkpoint):
        layers = load_model(draft, pack=False).config.num_layers
        llm = LLM(target=tiny_checkpoint, draft=draft, method="easyspec", gamma=3, calibration=calibration,
                  layer_groups=grouping(groups, layers), **tree)
        for prompt in PROMPTS:
            assert llm.generate(prompt, params).tokens == ar.generate(prompt, params).tokens, (draft, prompt)
    batch = llm.generate(PROMPTS, params)                   # rows of a batch: the same tokens as alone
    assert [o.tokens for o in batch] == [ar.generate(p, params).tokens for p in PROMPTS]


def test_greedy_equals_ar_on_the_pytorch_path(ar, tiny_checkpoint, monkeypatch):
    """Without this CPU's kernels (the path a GPU runs) the draft holds its groups' caches stacked and runs each
    group as one attention: still `ar`'s tokens, alone and in a batch."""
    import specmesh.model.loader as loader
    monkeypatch.setattr(loader, "select_kernels", lambda model, draft=False: model)
    params = SamplingParams(max_new_tokens=30)
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", gamma=3, layer_groups="2,1",
              tree_width=3, max_children=2)
    assert llm.models.draft.fast_forward is None and llm.generate(PROMPTS[0], params).stats.mean_accepted_length > 1
    assert [o.tokens for o in llm.generate(PROMPTS, params)] == [ar.generate(p, params).tokens for p in PROMPTS]


def test_a_wide_bf16_batch_equals_ar(tiny_checkpoint):
    """Six rows reading their roots are more rows than the kernels' one-call forward takes: the draft's groups then
    run through PyTorch over the kernels' packed weights, one attention a layer (it had read them as plain
    matrices and failed)."""
    prompts = [f"x = {i}\n" * (i + 1) for i in range(6)]
    params = SamplingParams(max_new_tokens=12)
    ar16 = LLM(target=tiny_checkpoint, dtype="bfloat16", method="ar")
    llm = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, dtype="bfloat16", method="easyspec", gamma=3,
              layer_groups="2,1")
    assert [o.tokens for o in llm.generate(prompts, params)] == [ar16.generate(p, params).tokens for p in prompts]


def test_the_fuzzy_draft_is_still_accepted_often(tiny_checkpoint):
    """The target as its own draft: exact drafting is always accepted, fuzzy drafting mostly."""
    params = SamplingParams(max_new_tokens=40)
    rate = {groups: LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", layer_groups=groups,
                        gamma=3, tree_width=1, max_children=1).generate(PROMPTS[0], params).stats.acceptance_rate
            for groups in ("1,1,1", "2,1")}
    assert rate["1,1,1"] == 1.0 and 0.15 < rate["2,1"] < 1.0


@pytest.mark.parametrize("shape, kw", [("chain", {}), ("chain", {"top_k": 4}), ("tree", {"top_p": 0.9})])
def test_sampling_two_sample_test_against_ar(tiny_checkpoint, shape, kw):
    tree = {"tree_width": 1, "max_children": 1} if shape == "chain" else {"tree_width": 3, "max_children": 2}
    ar = LLM(target=tiny_checkpoint)
    spec = LLM(target=tiny_checkpoint, draft=tiny_checkpoint, method="easyspec", gamma=2, layer_groups="3",
               calibration="never", **tree)
    assert_same_distribution(sampled_pairs(ar, 1500, 0, **kw), sampled_pairs(spec, 1500, 1, **kw))


def test_layer_similarity_table(tiny_checkpoint):
    from specmesh.bench.similarity import layer_similarity
    model = load_model(tiny_checkpoint, pack=False)
    windows = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    table = layer_similarity(model, windows, [2, 3, 4])
    assert set(table) == {2, 3}                                  # a 3-layer model has no group of 4
    assert all(-1 <= v <= 1 for row in table.values() for v in row.values())
    assert table[2]["hidden"] < 0.9999                            # the layers change the stream
    for block in model.layers:                                     # layers that add nothing: no fuzziness
        for p in (block.attn.o.weight, block.mlp.down.weight):
            p.data.zero_()
    same = layer_similarity(model, windows, [2, 3])
    assert same[2]["hidden"] == pytest.approx(1, abs=1e-5) and same[3]["hidden"] == pytest.approx(1, abs=1e-5)


@pytest.mark.parametrize("stacked", [False, True])
def test_a_group_attends_in_one_batch_as_its_layers_do_one_by_one(tiny_checkpoint, stacked):
    """group_attention (one attention with the group's heads: one product for every layer's q, k and v, norm
    weights folded in) gives each layer's attention output and cache entries as computing them one by one does,
    with a cache, two rows at different offsets and a tree mask; the group's caches held apart (joined for the
    attention) or stacked (one tensor, as a fuzzy draft on the PyTorch path holds them)."""
    model = load_model(tiny_checkpoint, pack=False)
    parts = list(model.layers[:2])
    torch.manual_seed(0)
    h = torch.randn(2, 3, model.config.hidden_size)
    caches = []
    for groups in ([range(0, 2)] if stacked else [], []):
        cache = KVCache.for_model(model, 2, 32, groups=groups)
        with torch.no_grad():
            model(torch.tensor([[5, 17, 42, 7], [9, 3, 8, 1]]), cache)
        cache.commit(0, [0, 1, 2, 3]), cache.commit(1, [0, 1])          # rows at different lengths
        caches.append(cache)
    assert (range(0, 2) in caches[0].stacks) == stacked
    tree = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    outs = []
    for cache, run in zip(caches, ("batched", "one by one")):
        positions, mask = cache.prepare(3, torch.tensor([0, 1, 1]), tree)
        cos, sin = model.rotary(positions, h.dtype)
        with torch.no_grad():
            outs.append(group_attention(parts, h, cos, sin, cache, mask) if run == "batched" else
                        [p.attn(p.attn_norm(h), cos, sin, cache, mask) for p in parts])
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(*outs))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(caches[0].k + caches[0].v, caches[1].k + caches[1].v))
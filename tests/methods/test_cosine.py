"""`cosine`: routing score, explore/exploit, fusion, the tree budget; lossless through the one verifier."""
import math
import random

import pytest
import torch
from conftest import assert_same_distribution, sampled_pairs

from specmesh import LLM, SamplingParams
from specmesh.lossless.token_tree import TokenTree
from specmesh.proposers import fused_drafters
from specmesh.proposers.fused_drafters import FusedDrafters, Round, cross_entropy, keep_best, round_score, route

PROMPTS = ["def add(a, b):", "class Point:\n    def", "for i in range(10):\n"]
LONG = "def add(a, b):\n    return a + b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n"


def test_the_routing_score_on_hand_worked_numbers():
    # c = 0.8, d = 0.9: 0.72 / (0.72 + 0.2 * 0.1) = 0.72 / 0.74; c = 0.5, d = 0.6: 0.3 / (0.3 + 0.5 * 0.4) = 0.6;
    # past the accepted length d = 0: 0. Mean over K = 3.
    assert round_score([0.8, 0.5, 0.9], [0.9, 0.6, 0.99], accepted=2) == pytest.approx((0.72 / 0.74 + 0.6 + 0) / 3)
    assert round_score([0.3], [1.0], accepted=1) == pytest.approx(1.0)       # the accepted token itself
    assert round_score([0.7], [-0.4], accepted=1) == 0.0                     # d clamped to [0, 1]
    assert round_score([], [], accepted=0) == 0.0


def test_the_similarity_is_the_cosine_of_the_targets_embeddings_where_both_drafted():
    embeddings = torch.randn(10, 4)
    fused = FusedDrafters([], torch.nn.Embedding.from_pretrained(embeddings), rows=1)
    accepted, own = [3, 5, 7], [3, 6, 7, 2, 9]
    want = torch.nn.functional.cosine_similarity(embeddings[accepted], embeddings[own[:3]], dim=-1).tolist()
    assert fused._similarity(accepted, own) == pytest.approx(want + [0.0, 0.0])      # 0 past the accepted length
    assert fused._similarity([4, 4], [4]) == [1.0] and fused._similarity([], [1, 2]) == [0.0, 0.0]


def test_explore_below_tau_exploit_above():
    scores = [0.9, 0.1, 0.5, 0.2]
    # exploit (last accepted >= τ, or no round yet): the two best by score
    assert route(scores, 2, 3, explore_below=2, rng=random.Random(0)) == [0, 2]
    assert route(scores, 2, None, explore_below=2, rng=random.Random(0)) == [0, 2]
    # explore (last accepted < τ): the best one and one of the others at random, which varies
    picks = {tuple(route(scores, 2, 1, explore_below=2, rng=random.Random(s))) for s in range(40)}
    assert all(0 in p for p in picks) and len(picks) == 3
    assert route(scores, 9, 0, 2, random.Random(0)) == [0, 1, 2, 3]          # never more than there are


def test_fusion_on_scripted_drafters():
    """Level 1: drafters 0, 1, 2 propose 5 (0.6), 7 (0.9), 5 (0.4): 7 is fused; 5 hangs beside it as 0's and
    2's own token. Level 2: candidates continue the spine, and 0 and 2's own token 5 gets a child each."""
    cos = FusedDrafters.__new__(FusedDrafters)
    cos.fusion = True
    tree, r, spine, own = TokenTree.root(1), Round([0, 1, 2]), {0: 0, 1: 0, 2: 0}, {}
    cos._grow(tree, r, {0: (0.6, 5), 1: (0.9, 7), 2: (0.4, 5)}, {}, spine, own)
    assert tree.tokens == [1, 7, 5] and tree.parents == [-1, 0, 0]
    assert spine == {0: 1, 1: 1, 2: 1} and own == {0: 2, 2: 2}
    cos._grow(tree, r, {0: (0.5, 8), 1: (0.7, 9), 2: (0.3, 9)}, {0: (0.8, 11), 2: (0.6, 12)}, spine, own)
    assert tree.tokens == [1, 7, 5, 11, 12, 9, 8] and tree.parents == [-1, 0, 0, 2, 2, 1, 1]
    assert r.own == {0: [5, 8], 1: [7, 9], 2: [5, 9]} and r.confidence[1] == [0.9, 0.7]
    # without fusion each drafter follows its own tokens: a union of chains
    cos.fusion = False
    tree, spine = TokenTree.root(1), {0: 0, 1: 0}
    cos._grow(tree, Round([0, 1]), {0: (0.6, 5), 1: (0.9, 7)}, {}, spine, {})
    cos._grow(tree, Round([0, 1]), {0: (0.6, 6), 1: (0.9, 6)}, {}, spine, {})
    assert tree.tokens == [1, 5, 7, 6, 6] and tree.parents == [-1, 0, 0, 1, 2]


def test_the_budget_keeps_the_most_confident_nodes_and_their_ancestors():
    tree = TokenTree.root(0)
    a = tree.add(1, 0, 0.9)
    tree.add(2, 0, 0.05)
    tree.add(3, a, 0.8)
    tree.add(4, a, 0.1)
    best = keep_best(tree, 3)
    assert best.tokens == [0, 1, 3] and best.parents == [-1, 0, 1]
    assert keep_best(tree, 10) is tree


def test_the_prompts_cross_entropy_on_hand_worked_numbers():
    # q = softmax([0, ln 3]) = [1/4, 3/4]; the target's top tokens 1 (p 0.9) and 0 (p 0.1): -(0.9 ln 3/4 + 0.1 ln 1/4)
    logits = torch.tensor([[0.0, math.log(3)]])
    want = -(0.9 * math.log(0.75) + 0.1 * math.log(0.25))
    assert cross_entropy(logits, torch.tensor([[1, 0]]), torch.tensor([[0.9, 0.1]])) == pytest.approx(want)


@pytest.fixture(scope="module")
def ar(tiny_checkpoint):
    return LLM(target=tiny_checkpoint)


@pytest.mark.parametrize("options", [{}, {"no_fusion": True}, {"no_routing": True}, {"tree_budget": 4},
                                     {"context": True}, {"context": True, "no_fusion": True}])
def test_greedy_equals_ar(ar, tiny_checkpoint, tiny_draft_checkpoint, tiny_draft_copy, options):
    drafters = f"{tiny_checkpoint},{tiny_draft_checkpoint},{tiny_draft_copy}"
    if options.pop("context", False):
        drafters += ",context"
    llm = LLM(target=tiny_checkpoint, method="cosine", drafters=drafters, **options)
    params = SamplingParams(max_new_tokens=30)
    out = llm.generate(PROMPTS, params)
    assert [o.tokens for o in out] == [o.tokens for o in ar.generate(PROMPTS, params)]


def test_the_router_learns_which_drafter_serves(tiny_checkpoint, tiny_draft_checkpoint, tiny_draft_copy):
    """Drafter 1 is the target itself (always right), 0 and 2 a random model: after a few rounds the router's
    best score is drafter 1's, and the trees accept much more than random routing would (at five levels: the
    scheduler would choose fewer, the tiny target's verification costing no more than a drafter's level)."""
    llm = LLM(target=tiny_checkpoint, method="cosine", routed=1, gamma=5,
              drafters=[tiny_draft_checkpoint, tiny_checkpoint, tiny_draft_copy])      # a list, or names joined by ","
    out = llm.generate("def add(a, b):", SamplingParams(max_new_tokens=60, ignore_eos=True))
    assert out.stats.tokens_per_forward > 4      # routing at random would give about 2.5
    info = out.stats.info                           # the per-drafter record (the server's drafter metrics)
    assert info["drafters"] == [tiny_draft_checkpoint.name, tiny_checkpoint.name, tiny_draft_copy.name]
    assert max(range(3), key=lambda n: info["scores"][n]) == 1 and info["rounds"][1] > info["rounds"][0]
    assert info["accepted"][1] > 0.8 * info["drafted"][1]


def test_the_prompt_starts_the_router_on_the_drafter_closest_to_the_target(tiny_checkpoint, tiny_draft_checkpoint,
                                                                         tiny_draft_copy):
    """Each model drafter reads the prompt's window and is compared with the target's predictions there: drafter 1,
    the target itself, is routed first (the others start unproven), where ties at the start would route drafter 0."""
    llm = LLM(target=tiny_checkpoint, method="cosine", routed=1,
              drafters=f"{tiny_draft_checkpoint},{tiny_checkpoint},{tiny_draft_copy}")
    assert len(llm.encode(LONG)) > 24
    out = llm.generate(LONG, SamplingParams(max_new_tokens=3, ignore_eos=True))     # one round after the first token
    assert out.stats.info["rounds"] == [0, 1, 0]
    assert out.stats.info["scores"][0] < out.stats.info["scores"][1]


def test_the_prompt_is_compared_only_where_two_model_drafters_compete(tiny_checkpoint, tiny_draft_checkpoint):
    """The comparison costs the target's head over the prompt's last positions (PROMPT_POSITIONS, at most the
    window): not spent with one model drafter (the context drafter is not routed), nor with routing off."""
    params = SamplingParams(max_new_tokens=4)
    def tail(**options):
        llm = LLM(target=tiny_checkpoint, method="cosine", **options)
        return llm.engine_for(llm.method).runner.prompt_tail
    two = f"{tiny_checkpoint},{tiny_draft_checkpoint},context"
    assert tail(drafters=two) == fused_drafters.PROMPT_POSITIONS == 64 and tail(drafters=two, draft_window=32) == 32
    assert tail(drafters=f"{tiny_checkpoint},context") == 1 and tail(drafters=two, no_routing=True) == 1


def test_sampling_draws_from_the_target(ar, tiny_checkpoint, tiny_draft_checkpoint):
    llm = LLM(target=tiny_checkpoint, method="cosine", drafters=f"{tiny_checkpoint},{tiny_draft_checkpoint},context",
              routed=3)
    assert_same_distribution(sampled_pairs(ar, 1500, seed=1), sampled_pairs(llm, 1500, seed=2))


def test_bad_drafters_are_refused(tiny_checkpoint):
    with pytest.raises(ValueError, match="cosine needs at least two drafters and has 1"):
        LLM(target=tiny_checkpoint, method="cosine", drafters=str(tiny_checkpoint))
    with pytest.raises(ValueError, match="cosine needs at least two drafters and has 1"):
        LLM(target=tiny_checkpoint, method="cosine", drafters="context")
    with pytest.raises(ValueError, match="cosine needs at least two drafters and has 0"):
        LLM(target=tiny_checkpoint, method="cosine")
    with pytest.raises(FileNotFoundError, match="not found: /nonexistent/drafter"):    # named before it is counted
        LLM(target=tiny_checkpoint, method="cosine", drafters="/nonexistent/drafter")


@pytest.mark.parametrize("drafters, error", [
    ("{draft},{draft},context", "--drafters names '{draft}' twice: name each drafter once"),
    ("{draft},{draft}/,context", "--drafters names one checkpoint twice, as '{draft}' and '{draft}/'"),
    ("{draft},context,context", "--drafters names 'context' twice"),
    ("{draft}/tokenizer.json,context", "--drafters: {draft}/tokenizer.json is a file, not a draft checkpoint"),
    ("{draft}/..,context", r"--drafters: {draft}/\.\. is not a draft checkpoint \(no config.json in it\)"),
    ("{draft},contxt", "--drafters: no model named 'contxt' here and no such file or folder; did you mean 'context'?"),
    ("{draft},,context", "--drafters '{draft},,context' names an empty drafter"),
])
def test_a_drafter_named_twice_or_not_a_checkpoint_is_refused_by_name(tiny_checkpoint, tiny_draft_checkpoint,
                                                                       drafters, error):
    draft = str(tiny_draft_checkpoint)
    with pytest.raises((ValueError, FileNotFoundError), match=error.format(draft=draft)):
        LLM(target=tiny_checkpoint, method="cosine", drafters=drafters.format(draft=draft))


def test_drafter_processes_and_a_killed_drafter_does_not_stop_generation(ar, tiny_checkpoint, tiny_draft_checkpoint,
                                                                        tiny_draft_copy):
    """--drafter-processes: each drafter in a process of its own, drafting at the same time; killing one mid-run
    drops it from routing with a warning and the output is still ar's."""
    import os
    import signal
    drafters = f"{tiny_checkpoint},{tiny_draft_checkpoint},{tiny_draft_copy}"
    llm = LLM(target=tiny_checkpoint, method="cosine", drafters=drafters, drafter_processes=True, timeout=5)
    assert llm.models.remote.link.roles == ["verifier", "drafter0", "drafter1", "drafter2"]
    params = SamplingParams(max_new_tokens=60, ignore_eos=True)
    want = ar.generate("def add(a, b):", params)
    assert llm.generate("def add(a, b):", params).tokens == want.tokens
    pid = llm.models.remote.link.pids[1]
    run = llm.stream("def add(a, b):", params)
    pieces = iter(run)
    next(pieces)
    os.kill(pid, signal.SIGKILL)
    with pytest.warns(UserWarning, match=r"drafter .* is gone and routed no more: rank 1 \(drafter0"):
        for _ in pieces:
            pass
    assert run.output.tokens == want.tokens
    run = llm.stream("def add(a, b):", params)                 # a second one dies: its warning names it alone
    pieces = iter(run)
    next(pieces)
    os.kill(llm.models.remote.link.pids[2], signal.SIGKILL)
    with pytest.warns(UserWarning) as caught:
        for _ in pieces:
            pass
    gone = [str(w.message) for w in caught if "is gone" in str(w.message)]
    assert gone and all("rank 2 (drafter1" in m and "rank 1 " not in m for m in gone), gone
    assert run.output.tokens == want.tokens
    assert llm.generate("class Point:", params).tokens == ar.generate("class Point:", params).tokens
    assert llm.generate(LONG, params).tokens == ar.generate(LONG, params).tokens    # the prompt routed through a process
    llm.close()


def test_the_shipped_drafters_make_cosine_work_with_no_option():
    """The embedded target ships two specialised drafters (tests, lib) and takes the context drafter beside them:
    `--method cosine` needs nothing else."""
    llm = LLM(target="embedded", method="cosine")
    assert llm.models.drafter_names == ["specmesh-drafter-tests", "specmesh-drafter-lib", "context"]
    params = SamplingParams(max_new_tokens=24)
    ar = LLM(target="embedded", method="ar")
    assert [o.tokens for o in llm.generate(PROMPTS, params)] == [o.tokens for o in ar.generate(PROMPTS, params)]

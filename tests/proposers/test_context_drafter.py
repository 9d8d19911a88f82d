"""cosine's context drafter: lookups along a hypothetical path, its calibrated confidence, and how the fused
drafters use a free drafter (every round, past the depth, alone where it has a guess: a long chain where it is
sure, a short one where not)."""
from types import SimpleNamespace

import torch

from specmesh.proposers import fused_drafters
from specmesh.proposers.context_drafter import ContextDrafter
from specmesh.proposers.fused_drafters import FusedDrafters
from specmesh.proposers.ngram import SuffixIndex

TEXT = [5, 6, 7, 8, 9, 1, 2, 5, 6, 7]        # "5 6 7" occurred before, followed by 8 9 1 2


def seq(ids: list[int], tokens: list[int]):
    return SimpleNamespace(ids=ids, tokens=tokens, last=tokens[-1], remaining=100, params=SimpleNamespace(seed=0),
                           stats=SimpleNamespace(info={}))


def test_next_after_looks_up_a_path_without_changing_the_index():
    index = SuffixIndex(TEXT, min_n=2, max_n=4)
    assert index.next_after([]) == (8, 3)            # "5 6 7" -> 8, a match of 3
    assert index.next_after([8, 9]) == (1, 4)        # "7 8 9" continues with 1 (the longest suffix that occurred)
    assert index.next_after([3]) is None             # "7 3" never occurred
    assert index.tokens == TEXT


class Scripted:
    """A model drafter that always proposes `token` with probability 0.5, and counts its reads."""
    free = dead = False                 # the Drafter interface's (proposers/fused_drafters.py)

    def __init__(self, token: int):
        self.token, self.reads, self.rows = token, 0, 1

    def admit(self, row, seq): pass
    def begin(self, seqs): pass
    def finish(self, row, accepted): pass

    def read_root(self, seqs):
        self.reads += 1
        self.width = 1

    def read_level(self, seqs, pairs):
        self.reads += 1
        self.width = 2

    def result(self):
        return torch.full((1, self.width), 0.5), torch.full((1, self.width), self.token, dtype=torch.long)


def fused(model: Scripted, context: ContextDrafter, guess_budget: int = 6) -> FusedDrafters:
    return FusedDrafters([model, context], torch.nn.Embedding.from_pretrained(torch.eye(100)), rows=1, routed=2, budget=8, solo_budget=12,
                         guess_budget=guess_budget)


def test_the_context_drafter_joins_every_round_and_drafts_past_the_depth():
    context, model = ContextDrafter(rows=1), Scripted(42)
    context.record[3] = [6, 8]                       # confidence 0.7 for a match of 3: above the model's 0.5
    cos = fused(model, context, guess_budget=0)      # where the lookup is not sure, the model drafters join
    s = seq(TEXT[:-1], [TEXT[-1]])                   # prompt, then the newest token 7
    cos.admit(0, s)
    tree = cos.propose([s], [1])[0]                  # depth 1: the model drafter reads the root only
    assert cos.rounds[0].drafters == [0, 1] and model.reads == 1
    assert cos.levels == 1                           # model forwards one after another: the simulator prices these
    # the fused 8 and the model's own 42 beside it; the lookup's chain goes on below the depth, to the budget
    assert sorted(tree.tokens[1:3]) == [8, 42]
    chain = [tree.tokens[n] for n in tree.path_to(len(tree) - 1)]
    assert chain == [7, 8, 9, 1, 2, 5, 6] and len(tree) == 8


def test_a_sure_context_drafter_drafts_alone_and_learns_its_precision():
    context, model = ContextDrafter(rows=1), Scripted(42)
    context.record[3] = [99, 100]                    # matches of 3 were right 99 times in 100
    cos = fused(model, context)
    s = seq(TEXT[:-1], [TEXT[-1]])
    cos.admit(0, s)
    tree = cos.propose([s], [3])[0]
    assert context.confidence(3) >= fused_drafters.SOLO and cos.rounds[0].drafters == [1]
    assert model.reads == 0 and cos.levels == 0 and 42 not in tree.tokens
    assert len(tree) == 12                           # its chain runs to the solo budget (past the tree budget, 8)
    # the verifier accepted 8 9 and then chose 3: the first two candidates were right; the third (1) waits
    # for the target's token, which the next round's newest token decides (3: a miss)
    context.finish(0, [8, 9])
    assert context.record[3] == [100, 101] and context.record[4][0] == 1
    s.tokens += [8, 9, 3]
    context.begin([s])
    assert sum(t for _, t in context.record.values()) == 101 + 1 + 1
    assert context.index[0].tokens[-3:] == [8, 9, 3]


def test_a_sure_chain_stops_at_the_tokens_the_request_still_wants():
    context, model = ContextDrafter(rows=1), Scripted(42)
    context.record[3] = [99, 100]
    cos = fused(model, context)
    s = seq(TEXT[:-1], [TEXT[-1]])
    s.remaining = 3                                  # 2 drafts and the target's token end the request
    cos.admit(0, s)
    assert cos.propose([s], [2])[0].tokens == [7, 8, 9]


def test_an_unsure_guess_drafts_a_short_chain_alone_and_does_not_steer_the_router():
    context, model = ContextDrafter(rows=1), Scripted(42)
    context.record[3] = [6, 8]                       # confidence 0.7: a guess, not sure (< SOLO)
    cos = fused(model, context, guess_budget=4)
    s = seq(TEXT[:-1], [TEXT[-1]])
    cos.admit(0, s)
    tree = cos.propose([s], [3])[0]
    assert cos.rounds[0].drafters == [1] and model.reads == 0 and cos.levels == 0
    assert tree.tokens == [7, 8, 9, 1]               # the root and 3 of the lookup's tokens: 4 nodes
    cos.accept([s], [tree], [SimpleNamespace(path=[0], accepted=0)])
    assert cos.last[0] is None                       # a round without routed drafters leaves explore/exploit as it was


def test_the_context_drafter_is_silent_after_a_miss_on_the_spine():
    context = ContextDrafter(rows=1)
    s = seq(TEXT[:-1], [TEXT[-1]])
    context.admit(0, s)
    context.begin([s])
    context.read_root([s])
    probs, tokens = context.result()
    assert tokens[0][0] == 8 and probs[0][0] == 0.5      # no record yet: (0 + 1) / (0 + 2)
    context.read_level([s], [(3, 8)])                # the spine took 3 (no match after it); its own 8 goes on
    probs, tokens = context.result()
    assert probs[0][0] == 0 and tokens[0][1] == 9
    context.read_level([s], [(8, 8)])                # silent for the rest of the round's spine
    assert context.result()[0][0][0] == 0

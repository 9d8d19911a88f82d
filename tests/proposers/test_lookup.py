"""`sd`'s prompt lookup (proposers/lookup.py): the suffix index, and lossless in batches where some rows look up
and others draft."""

from specmesh import LLM, SamplingParams
from specmesh.proposers.ngram import SuffixIndex


def test_suffix_index_proposes_what_followed_the_latest_longest_match():
    index = SuffixIndex([1, 2, 3, 4, 5, 9, 2, 3], min_n=2)
    assert index.lookup(3) == [4, 5, 9]                 # (2, 3) was followed by 4 5 9
    index.extend([7])
    assert index.lookup(3) == []                        # (3, 7) never occurred before
    index = SuffixIndex([5, 1, 2, 6, 0, 1, 2, 8, 1, 2], min_n=2)
    assert index.lookup(2) == [8, 1]                    # the latest occurrence of (1, 2) wins
    index = SuffixIndex([3, 1, 2, 6, 4, 1, 2, 8, 3, 1, 2], min_n=2)
    assert index.lookup(1) == [6]                       # the longer match (3, 1, 2) wins over the later (1, 2)
    assert SuffixIndex([1, 2, 1], min_n=2).lookup(4) == []     # too short a match


def test_suffix_index_looks_up_after_tokens_it_does_not_hold():
    index = SuffixIndex([1, 2, 3, 4, 5, 9, 2], min_n=2)
    assert index.lookup_after([3], 3) == [4, 5, 9]          # (2, 3): 2 indexed, 3 undecided (pearl's drafts)
    assert index.lookup_after([3, 4, 5], 2) == [9, 2]       # (3, 4, 5) and longer keys, within max_n
    assert index.lookup_after([8], 3) == []                 # (2, 8) never occurred
    assert index.tokens == [1, 2, 3, 4, 5, 9, 2]            # the index is not changed


def test_lookup_skips_the_draft_on_repeated_text_and_stays_lossless(tiny_checkpoint, tiny_draft_checkpoint):
    ar = LLM(target=tiny_checkpoint)
    prompts = ["self.y = y\n\n" * 4, "def add(a, b):", "x = [1, 2, 3]\n" * 3 + "x = [1", "class Point:\n    def"]
    params = SamplingParams(max_new_tokens=30)
    want = [o.tokens for o in ar.generate(prompts, params)]
    plain, looked = (LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=3, lookup=n)
                     for n in (0, 2))
    assert [o.tokens for o in looked.generate(prompts, params)] == want       # one batch: rows look up or draft
    assert [looked.generate(p, params).tokens for p in prompts] == want
    drafts = lambda llm: sum(llm.generate(p, params).stats.draft_forwards for p in prompts)   # a random model loops
    assert drafts(looked) < drafts(plain)


def test_the_lookup_reads_every_committed_token_the_first_included():
    """The first token is committed after the proposer admits the sequence: the first lookup must see it."""
    from types import SimpleNamespace
    from specmesh.proposers.lookup import LookupFirst
    from specmesh.lossless.token_tree import TokenTree
    draft = SimpleNamespace(admit=lambda row, seq: None, propose=lambda seqs, budgets: [TokenTree.root(s.last) for s in seqs])
    seq = SimpleNamespace(ids=[1, 2, 3, 9, 8, 1, 2], tokens=[])
    lookup = LookupFirst(draft, 1, min_n=2)
    lookup.admit(0, seq)
    seq.tokens.append(3)                                # the token after the prompt, from its prefill
    seq.last = 3
    tree, = lookup.propose([seq], [3])
    assert tree.tokens == [3, 9, 8, 1]                  # (1, 2, 3) was followed by 9 8 1; not (1, 2) -> 3 9 8
    seq.tokens += [9, 8]                                # committed by a verification
    seq.last = 8
    tree, = lookup.propose([seq], [2])
    assert tree.tokens == [8, 1, 2]


def test_suffix_index_chain_follows_a_repeat_past_the_end():
    index = SuffixIndex([1, 2, 3, 1, 2, 3], min_n=2)
    assert index.lookup(5) == [1, 2, 3]                 # the copy stops at the end of what is indexed
    assert index.chain(5) == [1, 2, 3, 1, 2]            # then goes on a token at a time
    assert index.match_length() == 3 and SuffixIndex([1, 2, 3], min_n=2).match_length() is None


def test_a_sure_lookup_proposes_its_reach_and_learns_from_verdicts():
    from types import SimpleNamespace
    from specmesh.proposers.lookup import LookupFirst
    from specmesh.lossless.token_tree import TokenTree
    draft = SimpleNamespace(admit=lambda row, seq: None, queue=lambda row, tokens: None,
                            propose=lambda seqs, budgets: [TokenTree.root(s.last) for s in seqs])
    seq = SimpleNamespace(ids=[1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2], tokens=[3], last=3, remaining=50)
    lookup = LookupFirst(draft, 1, min_n=2, reach=6)
    lookup.admit(0, seq)
    tree, = lookup.propose([seq], [2])
    assert tree.tokens == [3, 4, 5]                     # unproven: as deep as the step's depth
    lookup.record[3] = [99, 100]                        # matches of 3 had their first token accepted 99 times in 100
    tree, = lookup.propose([seq], [2])
    assert tree.tokens == [3, 4, 5, 6, 7, 8, 9]         # sure: the reach
    lookup.accept([seq], [tree], [SimpleNamespace(accepted=0, path=[0])])
    assert lookup.record[3] == [99, 101]


def test_long_lookup_chains_stay_lossless(tiny_checkpoint, tiny_draft_checkpoint, monkeypatch):
    from specmesh.proposers import lookup
    monkeypatch.setattr(lookup, "SURE", 0.5)            # every match length sure from the start (prior 1/2)
    ar = LLM(target=tiny_checkpoint)
    prompts = ["self.y = y\n\n" * 6, "x = [1, 2, 3]\n" * 5 + "x = [1"]
    params = SamplingParams(max_new_tokens=120, ignore_eos=True)
    llm = LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=3, lookup=2, lookup_reach=12)
    widths = []                                         # new tokens of each target forward
    target = llm.models.target
    target.forward = lambda x, *a, _real=target.forward, **kw: (widths.append(x.shape[1]), _real(x, *a, **kw))[1]
    outs = [llm.generate(p, params).tokens for p in prompts]
    assert outs == [o.tokens for o in ar.generate(prompts, params)]
    assert 3 + 1 < max(w for w in widths if w <= 12 + 1)                # chains past γ (3) were verified


def test_a_shared_lookup_matches_what_an_earlier_request_wrote():
    from specmesh.proposers.lookup import SharedIndex
    from specmesh.proposers.suffix_tree import SuffixTree
    tree = SuffixTree(16, 1000)
    SharedIndex(tree, [7, 1, 2, 3, 4, 5], min_n=2)                  # an earlier request's text
    SharedIndex(tree, [9, 1, 2, 3, 8], min_n=2)                      # another: (1, 2, 3) followed by 8 once
    index = SharedIndex(tree, [6, 6, 1, 2], min_n=2)
    assert index.match_length() == 2 and index.chain(3) == [3, 4, 5]  # (1, 2, 3) then the more frequent 4 (ties: any)
    index.extend([3])
    assert index.match_length() == 3 and index.chain(1)[0] in (4, 8)
    assert SharedIndex(SuffixTree(16, 1000), [1, 2, 3], min_n=2).match_length() is None     # nothing before


def test_sd_with_a_shared_lookup_is_lossless_and_reuses_earlier_answers(tiny_checkpoint, tiny_draft_checkpoint):
    ar = LLM(target=tiny_checkpoint)
    prompts = ["def add(a, b):", "class Point:\n    def", "def add(a, b):"]     # the third repeats the first
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    want = [ar.generate(p, params).tokens for p in prompts]
    own, shared = (LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=3, lookup=2,
                       lookup_shared=s) for s in (False, True))
    outs = {name: [llm.generate(p, params) for p in prompts] for name, llm in (("own", own), ("shared", shared))}
    assert [o.tokens for o in outs["own"]] == [o.tokens for o in outs["shared"]] == want
    assert outs["shared"][2].stats.target_forwards < outs["own"][2].stats.target_forwards    # the first's answer
    assert [o.tokens for o in shared.generate(prompts, params)] == want                       # in one batch too

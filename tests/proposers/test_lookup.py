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


def test_lookup_skips_the_draft_on_repeated_text_and_stays_lossless(tiny_checkpoint, tiny_draft_checkpoint):
    ar = LLM(target=tiny_checkpoint)
    prompts = ["self.y = y\n\n" * 4, "def add(a, b):", "x = [1, 2, 3]\n" * 3 + "x = [1", "class Point:\n    def"]
    params = SamplingParams(max_new_tokens=30)
    want = [o.tokens for o in ar.generate(prompts, params)]
    plain, looked = (LLM(target=tiny_checkpoint, draft=tiny_draft_checkpoint, method="sd", gamma=3, lookup=n)
                     for n in (0, 2))
    assert [o.tokens for o in looked.generate(prompts, params)] == want       # one batch: rows look up or draft
    assert [looked.generate(p, params).tokens for p in prompts] == want
    drafts = lambda llm: llm.generate(prompts[0], params).stats.draft_forwards
    assert drafts(looked) < drafts(plain)

"""Multi-Branch Self-Drafting (Gao et al., AAAI 2025): speculation with no draft model.

One target forward carries the newest token (the root), candidate continuations
merged into a trie below it, and N draft branches. The candidates come from two
n-gram caches: the context cache (n-grams from the branches, the prompt and the
accepted output, LRU per key token) and the corpus cache (frequent n-grams of a
corpus, longest prefix first). The trie is verified by the shared `verify` (one
target draw per node, so sampling stays lossless); the branch predictions feed the
context cache and grow the branches.
"""
from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch

from specmesh.cache import KVCache
from specmesh.drafters.branches import Branches
from specmesh.drafters.ngram import ContextCache, CorpusCache
from specmesh.job import Job, Models
from specmesh.sampling import next_tokens
from specmesh.tree import TokenTree
from specmesh.verify import verify

NEEDS_DRAFT = False
OPTIONS = {"branches": 1, "branch_len": 1, "gram": 6, "max_candidates": 1,
           "ngram_cache": ""}         # corpus cache file; default: ngram.npz beside the target's weights
CORPUS: dict[Path, CorpusCache] = {}       # loaded corpus caches, by path


def corpus_cache(models: Models, path: str) -> CorpusCache | None:
    if path:
        file = Path(path)
    elif models.target_path is not None and (models.target_path / "ngram.npz").exists():
        file = models.target_path / "ngram.npz"
    else:
        return None
    if file not in CORPUS:
        CORPUS[file] = CorpusCache.load(file)
    return CORPUS[file]


def slack(branches: int = OPTIONS["branches"], branch_len: int = OPTIONS["branch_len"],
          gram: int = OPTIONS["gram"], max_candidates: int = OPTIONS["max_candidates"], **_) -> int:
    return 1 + max_candidates * (gram - 1) + branches * branch_len


def candidates(root: int, sequence: list[int], context: ContextCache, corpus: CorpusCache | None,
               k: int, room: int) -> list[list[int]]:
    """Up to k distinct continuations of the sequence (ending in root), each at most `room` tokens."""
    found = context.lookup(root, k)
    if corpus is not None and len(found) < k:
        found += [c for c in corpus.lookup(sequence, k) if c not in found][:k - len(found)]
    return [list(c[:room]) for c in found if room > 0]


def forward_inputs(tree: TokenTree, branches: Branches, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Tokens [1, T], depths [T] and mask [T, T] for the trie followed by the branches."""
    b_tokens, b_depths, b_sees = branches.layout(len(tree))
    T = len(tree) + len(b_tokens)
    mask = torch.zeros(T, T, dtype=torch.bool)
    mask[:len(tree), :len(tree)] = tree.ancestor_mask()
    for i, sees in enumerate(b_sees):
        mask[len(tree) + i, sees] = True
    tokens = torch.tensor([tree.tokens + b_tokens], device=device)
    return tokens, torch.tensor(tree.depths + b_depths, device=device), mask.to(device)


def decode(models: Models, job: Job, branches: int = OPTIONS["branches"], branch_len: int = OPTIONS["branch_len"],
           gram: int = OPTIONS["gram"], max_candidates: int = OPTIONS["max_candidates"],
           ngram_cache: str = "") -> Iterator[list[list[int]]]:
    target, stats = models.target, job.stats
    corpus = corpus_cache(models, ngram_cache)
    cache = KVCache.for_model(target, 1, job.max_len)
    sequence = list(job.prompt)
    context = ContextCache(gram)
    context.add_sequence(sequence)
    drafts = Branches(branches, branch_len, gram, sequence, seed=job.params.seed or 0)
    logits = job.prefill(target, cache, job.prompt, "target")
    root = int(next_tokens(logits, job.params, job.generator))
    yield [[root]]
    produced = 1
    while True:
        sequence.append(root)
        room = job.limit - produced - 1                       # never propose past max_new_tokens
        tree = TokenTree.from_paths(root, candidates(root, sequence, context, corpus, max_candidates, room))
        tokens, depths, mask = forward_inputs(tree, drafts, target.device)
        logits = target(tokens, cache, depths=depths, tree_mask=mask)[0]          # [T, V]
        verdict = verify(tree, logits[:len(tree)], job.params, job.generator)
        cache.commit(0, verdict.path)
        for g in drafts.update(logits[len(tree):].argmax(-1)):
            context.add(g)
        context.add_sequence(sequence[-(gram - 1):] + verdict.tokens)
        stats.target_forwards += 1
        stats.verifications += 1
        stats.drafted_tokens += len(tree) - 1
        stats.accepted_tokens += verdict.accepted
        sequence += verdict.tokens[:-1]
        produced += len(verdict.tokens)
        root = verdict.next_token
        yield [verdict.tokens]

"""n-gram caches that propose continuations without a draft model (Self-Draft).

SuffixIndex: prompt lookup (Saxena 2023; llama.cpp's lookup): the tokens that followed the latest earlier
occurrence of the sequence's last n tokens, longest n first (`sd`'s `lookup`).

ContextCache: n-grams seen in this generation (from the draft branches and the
accepted output), an LRU list of continuations per key token, bounded per key.

CorpusCache: n-grams counted over a corpus. A lookup tries the longest context
suffix first (up to `max_prefix` tokens), and within one prefix the most frequent
continuation first. Built by `specmesh ngram build` in shards, so memory stays
bounded by the number of distinct n-grams kept, and saved as a compressed .npz.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from tqdm import tqdm


class MatchRecord(dict):
    """Prompt lookup's measured precision by match length: n -> [hits, tries], precision (hits + 1) / (tries + 2)
    (cosine's context drafter's confidence; `sd`'s sure chains, proposers/lookup.py)."""

    def precision(self, n: int) -> float:
        hits, tries = self.get(n, (0, 0))
        return (hits + 1) / (tries + 2)

    def count(self, n: int, hit: bool) -> None:
        record = self.setdefault(n, [0, 0])
        record[0] += hit
        record[1] += 1


class SuffixIndex:
    def __init__(self, tokens: Sequence[int], min_n: int, max_n: int = 4):
        self.min_n, self.max_n = min_n, max(min_n, max_n)
        self.tokens: list[int] = []
        self.after: dict[tuple[int, ...], int] = {}     # n-gram -> where its latest continuation starts
        self.extend(tokens)

    def extend(self, tokens: Iterable[int]) -> None:
        for t in tokens:
            p = len(self.tokens)                        # t's position: it continues the n-grams ending before it
            for n in range(self.min_n, min(self.max_n, p) + 1):
                self.after[tuple(self.tokens[p - n:p])] = p
            self.tokens.append(t)

    def lookup(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix seen before
        (at least min_n tokens); [] where none was."""
        return self.lookup_after((), k)

    def match_length(self) -> int | None:
        """n of the longest suffix of the indexed tokens seen before (at least min_n), or None."""
        match = self._latest(())
        return None if match is None else match[1]

    def chain(self, k: int) -> list[int]:
        """`lookup(k)`, followed on a token at a time (`next_after`) where the copied stretch reaches the end of the
        indexed tokens (a repeat of the latest tokens themselves)."""
        tokens = self.lookup(k)
        while tokens and len(tokens) < k and (after := self.next_after(tokens)) is not None:
            tokens.append(after[0])
        return tokens

    def lookup_after(self, extra: Sequence[int], k: int) -> list[int]:
        """`lookup` for the indexed tokens followed by `extra` (tokens not indexed: pearl's undecided drafts)."""
        match = self._latest(extra)
        return [] if match is None else self.tokens[match[0]:match[0] + k]

    def next_after(self, extra: Sequence[int]) -> tuple[int, int] | None:
        """(token, n): the token that followed the latest earlier occurrence of the longest suffix (n tokens,
        at least min_n) of the indexed tokens followed by `extra`; None where there was none. The index is
        not changed: `extra` is a hypothetical continuation (a path in a draft tree)."""
        match = self._latest(extra)
        return None if match is None else (self.tokens[match[0]], match[1])

    def _latest(self, extra: Sequence[int]) -> tuple[int, int] | None:
        """(where the continuation starts, n) for the longest suffix of the indexed tokens + `extra` seen before."""
        tail = (self.tokens[-self.max_n:] + list(extra))[-self.max_n:]
        for n in range(len(tail), self.min_n - 1, -1):
            p = self.after.get(tuple(tail[-n:]))
            if p is not None:
                return p, n
        return None


class ContextCache:
    def __init__(self, gram: int = 4, per_key: int = 10):
        self.gram, self.per_key = gram, per_key
        self.table: dict[int, OrderedDict[tuple[int, ...], None]] = {}

    def add(self, gram: Sequence[int]) -> None:
        """Record gram[1:] as the most recent continuation of gram[0]."""
        conts = self.table.setdefault(gram[0], OrderedDict())
        cont = tuple(gram[1:])
        conts.pop(cont, None)
        conts[cont] = None
        if len(conts) > self.per_key:
            conts.popitem(last=False)

    def add_sequence(self, tokens: Sequence[int]) -> None:
        for i in range(len(tokens) - self.gram + 1):
            self.add(tokens[i:i + self.gram])

    def lookup(self, key: int, k: int) -> list[tuple[int, ...]]:
        """Up to k continuations of `key`, most recently seen first."""
        conts = self.table.get(key)
        return [] if not conts else list(reversed(conts))[:k]


KEY_BITS = 21          # a prefix of up to 3 token ids below 2^21 packs into one int64 key


def prefix_key(tokens: Sequence[int]) -> int:
    """One integer per prefix that orders prefixes lexicographically (same length)."""
    key = 0
    for t in tokens:
        key = (key << KEY_BITS) | int(t)
    return key


class CorpusCache:
    def __init__(self, tables: dict[int, tuple[np.ndarray, np.ndarray]], cont_len: int, tokenizer: str = ""):
        # tables[p] = (prefixes [M, p], continuations [M, cont_len]), most frequent first per prefix;
        # tokenizer: the fingerprint of the tokenizer that counted them ("": a file written before it was recorded)
        if tables and (max(tables) * KEY_BITS > 63 or max(int(pre.max(initial=0)) for pre, _ in tables.values())
                       >= 1 << KEY_BITS):
            raise ValueError(f"n-gram cache: prefixes of at most {63 // KEY_BITS} tokens with ids below "
                             f"2^{KEY_BITS} are supported")
        self.tables, self.cont_len, self.tokenizer = tables, cont_len, tokenizer
        self.max_prefix = max(tables, default=0)
        self.max_id = max((int(max(pre.max(initial=0), conts.max(initial=0))) for pre, conts in tables.values()),
                          default=0)
        self.keys: dict[int, np.ndarray] = {}   # p -> sorted keys [M]; tables[p] rows in the same order
        for p, (prefixes, conts) in tables.items():
            keys = np.zeros(len(prefixes), np.int64)
            for col in prefixes.T.astype(np.int64):
                keys = (keys << KEY_BITS) | col
            order = np.argsort(keys, kind="stable")        # stable: keeps the frequency order per prefix
            self.keys[p], self.tables[p] = keys[order], (prefixes[order], conts[order])

    def lookup(self, context: Sequence[int], k: int) -> list[tuple[int, ...]]:
        """Up to k continuations of the context: longest matching suffix first, then most frequent."""
        out: list[tuple[int, ...]] = []
        for p in range(min(self.max_prefix, len(context)), 0, -1):
            keys, key = self.keys[p], prefix_key(context[-p:])
            lo, hi = np.searchsorted(keys, key, "left"), np.searchsorted(keys, key, "right")
            for cont in map(tuple, self.tables[p][1][lo:hi].tolist()):
                if cont not in out:
                    out.append(cont)
                if len(out) == k:
                    return out
        return out

    def save(self, path: str | Path) -> None:
        arrays = {}
        for p, (prefixes, conts) in self.tables.items():
            arrays[f"prefix{p}"], arrays[f"cont{p}"] = prefixes.astype(np.int32), conts.astype(np.int32)
        np.savez_compressed(path, cont_len=self.cont_len, tokenizer=np.array(self.tokenizer), **arrays)

    @classmethod
    def load(cls, path: str | Path) -> "CorpusCache":
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"n-gram corpus cache not found: {path}")
        try:
            with np.load(path) as z:
                tables = {int(n[6:]): (z[n], z[f"cont{n[6:]}"]) for n in z.files if n.startswith("prefix")}
                return cls(tables, int(z["cont_len"]), str(z["tokenizer"]) if "tokenizer" in z.files else "")
        except (ValueError, OSError, KeyError, AttributeError):    # not an .npz, or not one `ngram build` wrote
            raise ValueError(f"{path} is not an n-gram corpus cache (the .npz file `specmesh ngram build` "
                             f"writes)") from None

    def check(self, path: Path, tokenizer) -> None:
        """Refuse a cache counted with another tokenizer than the target's: ids past the target's vocabulary would
        fail in its embedding, other ids would propose nonsense."""
        if self.tokenizer and self.tokenizer != tokenizer.fingerprint or self.max_id >= tokenizer.vocab_size:
            raise ValueError(f"{path} was counted with another tokenizer than the target's: build one for this "
                             f"target with `specmesh ngram build --tokenizer TARGET`")


def count_ngrams(docs: Iterable[np.ndarray], n: int, shard_tokens: int = 2_000_000,
                 total: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Distinct n-grams [M, n] and their counts over token arrays, counted shard by shard."""
    grams, counts = np.zeros((0, n), np.int32), np.zeros(0, np.int64)
    shard: list[np.ndarray] = []
    size = 0

    def merge():
        nonlocal grams, counts, shard, size
        windows = [np.lib.stride_tricks.sliding_window_view(d, n) for d in shard if len(d) >= n]
        if windows:
            new, new_counts = np.unique(np.concatenate(windows), axis=0, return_counts=True)
            grams, inverse = np.unique(np.concatenate([grams, new]), axis=0, return_inverse=True)
            counts = np.bincount(inverse.ravel(), weights=np.concatenate([counts, new_counts]),
                                 minlength=len(grams)).astype(np.int64)
        shard, size = [], 0

    with tqdm(total=total, desc=f"{n}-grams", unit="tok", disable=total is None) as bar:
        for doc in docs:
            shard.append(doc.astype(np.int32))
            size += len(doc)
            bar.update(len(doc))
            if size >= shard_tokens:
                merge()
        merge()
    return grams, counts


def top_continuations(grams: np.ndarray, counts: np.ndarray, prefix: int, per_prefix: int,
                      min_count: int) -> tuple[np.ndarray, np.ndarray]:
    """For each prefix (first `prefix` columns), its `per_prefix` most frequent continuations."""
    keep = counts >= min_count
    grams, counts = grams[keep], counts[keep]
    # sort by prefix columns, then by descending count
    order = np.lexsort((-counts, *[grams[:, i] for i in reversed(range(prefix))]))
    grams = grams[order]
    pre = grams[:, :prefix]
    new_group = np.ones(len(grams), bool)
    new_group[1:] = (pre[1:] != pre[:-1]).any(axis=1)
    group_start = np.maximum.accumulate(np.where(new_group, np.arange(len(grams)), 0))
    rank = np.arange(len(grams)) - group_start
    chosen = grams[rank < per_prefix]
    return chosen[:, :prefix], chosen[:, prefix:]


def build_corpus_cache(docs: list[np.ndarray], cont_len: int = 3, max_prefix: int = 2,
                       per_prefix: tuple[int, ...] = (8, 4), min_count: int = 2) -> CorpusCache:
    """A CorpusCache from tokenized documents: prefixes of 1..max_prefix tokens."""
    total = sum(len(d) for d in docs)
    tables = {}
    for p in range(1, max_prefix + 1):
        grams, counts = count_ngrams(docs, p + cont_len, total=total)
        tables[p] = top_continuations(grams, counts, p, per_prefix[p - 1], min_count)
    return CorpusCache(tables, cont_len)


TEXT_SUFFIXES = {".py", ".txt", ".md", ".rst"}


def read_corpus(root: Path, tokenizer, skip_heldout: bool = False) -> list[np.ndarray]:
    """Token arrays of the text files under root (UTF-8 only). skip_heldout: the embedded models' training
    split exactly, i.e. the .py files outside the stdlib held-out rule."""
    from specmesh.training.corpus import is_heldout
    if not root.is_dir():
        raise FileNotFoundError(f"corpus directory not found: {root}")
    suffixes = {".py"} if skip_heldout else TEXT_SUFFIXES
    files = [p for p in sorted(root.rglob("*")) if p.suffix in suffixes and p.is_file()
             and "site-packages" not in p.relative_to(root).parts
             and not (skip_heldout and is_heldout(p.relative_to(root).as_posix()))]
    docs = []
    for path in tqdm(files, desc="tokenize", unit="file"):
        try:
            docs.append(np.array(tokenizer.encode(path.read_text(encoding="utf-8")), dtype=np.int32))
        except (UnicodeDecodeError, OSError):
            continue
    if not docs:
        raise ValueError(f"no readable text files under {root}")
    return docs
